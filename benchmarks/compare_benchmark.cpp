// `torchprobe compare` end to end (issue 41, item 6): two synthetic transformer-like statistics dumps
// of N entries a side (1x/10x/100x: 10k, 100k, 1M), compared by `torchprobe compare` (read, pair,
// judge, CSV + first_divergence.json + report.html). Prints wall time per stage and end to end, the
// max RSS, the ratio to a baseline of the same run (parsing both dump.json files with nlohmann), and
// the growth of time and RSS per 10x entries. Each measurement runs in a child process of its own,
// so that its max RSS is its own; the compare is the command-line tool itself where the build has it
// (what a user runs: its start and its huge pages included). Quick mode (TORCHPROBE_BENCH_QUICK=1): 10k only.
// TORCHPROBE_COMPARE_BENCH_KEEP=1 keeps the dumps and outputs (the path is printed);
// TORCHPROBE_COMPARE_BENCH_RUNS=K runs each compare K times and reports the median.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "child_measure.hpp"
#include "quick_mode.hpp"
#include "torchprobe/analysis/compare/cli.hpp"

namespace {

using tpbench::Clock;
using tpbench::from_rusage;
using tpbench::in_child;
using tpbench::Measured;
using tpbench::seconds_since;

std::string tensor(std::size_t seed, const char* shape, double drift) {
  const double v = static_cast<double>(seed % 997) / 997.0 + drift;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "{\"type\": \"torch.Tensor\", \"dtype\": \"torch.float32\", \"shape\": %s, \"Max\": %.17g, "
                "\"Min\": %.17g, \"Mean\": %.17g, \"Norm\": %.17g, \"requires_grad\": true}",
                shape, v + 1, v - 1, v, 3 * v + 1);
  return buf;
}

// Module.layers.{i}.attn.Linear.forward.0 with six Aten ops inside, three of their backwards, the
// module's backward and, every 4th layer, its parameters_grad. The bench drifts from the middle on.
void write_side(const std::filesystem::path& dir, std::size_t n, bool bench) {
  std::filesystem::create_directories(dir);
  std::ofstream dump(dir / "dump.json"), construct(dir / "construct.json");
  dump << "{\n \"task\": \"statistics\",\n \"level\": \"mix\",\n \"framework\": \"pytorch\",\n"
          " \"dump_data_dir\": null,\n \"data\": {";
  construct << "{";
  static const char* kOps[] = {"addmm", "gelu", "add", "mul", "softmax", "bmm"};
  std::size_t count = 0;
  const auto entry = [&](const std::string& name, const std::string& body) {
    if (count >= n) return false;
    dump << (count ? ",\n  \"" : "\n  \"") << name << "\": " << body;
    ++count;
    return true;
  };
  const auto link = [&](const std::string& name, const std::string& parent) {
    construct << (construct.tellp() > 1 ? ",\n \"" : "\n \"") << name << "\": " << parent;
  };
  const char* s = "[8, 64]";
  for (std::size_t layer = 0, i = 0; count < n; ++layer, i += 17) {
    const double d = bench && count > n / 2 ? 1e-3 : 0.0;
    const std::string mod = "Module.layers." + std::to_string(layer) + ".attn.Linear";
    const std::string fwd = mod + ".forward.0";
    if (entry(fwd, "{\"input_args\": [" + tensor(i, s, d) + "], \"input_kwargs\": {}, \"output\": [" +
                       tensor(i + 1, s, d) + "]}"))
      link(fwd, "null");
    for (std::size_t k = 0; k < 6; ++k) {
      const std::string name = "Aten." + std::string(kOps[k]) + "." + std::to_string(layer * 6 + k) + ".forward";
      if (entry(name, "{\"input_args\": [" + tensor(i + k, s, d) + ", " + tensor(i + k + 7, s, d) +
                          "], \"input_kwargs\": {}, \"output\": [" + tensor(i + k + 3, s, d) + "]}"))
        link(name, "\"" + fwd + "\"");
    }
    for (std::size_t k = 0; k < 3; ++k)
      entry("Aten." + std::string(kOps[k]) + "." + std::to_string(layer * 6 + k) + ".backward",
            "{\"input\": [" + tensor(i + k + 11, s, d) + "], \"output\": [" + tensor(i + k + 13, s, d) + "]}");
    entry(mod + ".backward.0", "{\"input\": [" + tensor(i + 5, s, d) + "], \"output\": [" + tensor(i + 6, s, d) + "]}");
    if (layer % 4 == 0)
      entry(mod + ".parameters_grad",
            "{\"weight\": " + tensor(i + 9, "[64, 64]", d) + ", \"bias\": " + tensor(i + 10, "[64]", d) + "}");
  }
  dump << "\n }\n}\n";
  construct << "\n}\n";
}

// `torchprobe compare TARGET BENCH -o OUT` as a user runs it: the command-line tool (its start, its
// huge pages above kHugePagesFromBytes, huge_pages.hpp), timed from fork to exit; its log (stderr)
// comes through a pipe and each line is timed as it arrives. A build without the tool runs
// run_compare in the child instead, as the tool does.
Measured compare_in_child(const std::filesystem::path& dir) {
  std::fflush(stdout);
  int fd[2];
  if (::pipe(fd) != 0) std::abort();
  const auto t0 = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fd[0]);
    ::dup2(fd[1], STDERR_FILENO);
    ::close(fd[1]);
    const std::string target = (dir / "target").string(), bench = (dir / "bench").string(),
                      out = (dir / "out").string();
#if defined(TORCHPROBE_CLI_PATH)
    ::execl(TORCHPROBE_CLI_PATH, "torchprobe", "compare", target.c_str(), bench.c_str(), "-o", out.c_str(),
            static_cast<char*>(nullptr));
    std::perror(TORCHPROBE_CLI_PATH);
    std::_Exit(127);
#else
    torchprobe::compare::CompareOptions o;
    o.target = target;
    o.bench = bench;
    o.out = out;
    o.exit_after = true;  // as the CLI runs it: the process exits right after
    const int status = torchprobe::compare::run_compare(o, std::cerr);
    std::_Exit(status);
#endif
  }
  ::close(fd[1]);
  std::vector<std::pair<double, std::string>> lines;
  std::string line;
  char buf[4096];
  for (ssize_t got; (got = ::read(fd[0], buf, sizeof buf)) > 0;) {
    for (ssize_t i = 0; i < got; ++i) {
      if (buf[i] != '\n') {
        line += buf[i];
        continue;
      }
      lines.emplace_back(seconds_since(t0), line);
      line.clear();
    }
  }
  ::close(fd[0]);
  int wstatus = 0;
  rusage u{};
  ::wait4(pid, &wstatus, 0, &u);
  Measured m = from_rusage(u);
  m.seconds = seconds_since(t0);
  m.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  m.lines = std::move(lines);
  return m;
}

struct Figures {
  std::size_t n = 0;
  Measured compare, baseline;
};

Figures run(std::size_t n, const std::filesystem::path& root) {
  const auto dir = root / std::to_string(n);
  write_side(dir / "target", n, false);
  write_side(dir / "bench", n, true);
  Figures f;
  f.n = n;
  f.baseline = in_child([&](int& status) {
    const auto t0 = Clock::now();
    for (const char* side : {"target", "bench"}) {
      std::ifstream in(dir / side / "dump.json");
      const auto j = nlohmann::json::parse(in);
      if (j.at("data").size() != n) status = 1;
    }
    return seconds_since(t0);
  });
  // TORCHPROBE_COMPARE_BENCH_RUNS=K: the compare K times (this machine's speed varies by a third from
  // run to run), each printed; the figures below are the run of median time.
  const char* runs_env = std::getenv("TORCHPROBE_COMPARE_BENCH_RUNS");
  const int runs = runs_env ? std::max(1, std::atoi(runs_env)) : 1;
  std::vector<Measured> each;
  for (int r = 0; r < runs; ++r) {
    each.push_back(compare_in_child(dir));
    if (runs > 1)
      std::printf("%8zu entries a side, run %d of %d: %.2f s, CPU %.2f s, max RSS %.0f MB\n", n, r + 1, runs,
                  each.back().seconds, each.back().cpu, each.back().rss_mb);
  }
  std::sort(each.begin(), each.end(), [](const Measured& a, const Measured& b) { return a.seconds < b.seconds; });
  f.compare = each[each.size() / 2];
  if (runs > 1)
    std::printf("%8zu entries a side: median %.2f s of %.2f-%.2f s\n", n, f.compare.seconds, each.front().seconds,
                each.back().seconds);
  std::printf("%8zu entries a side: compare %.2f s end to end (exit %d)\n", n, f.compare.seconds, f.compare.status);
  double prev = 0;
  for (const auto& [t, line] : f.compare.lines) {
    std::printf("    %+7.2f s  until: %.150s\n", t - prev, line.c_str());
    prev = t;
  }
  std::printf("    %+7.2f s  (writing the outputs after the last stage)\n", f.compare.seconds - prev);
  std::printf(
      "%8zu entries a side: compare %.2f s (CPU %.2f s), max RSS %.0f MB; baseline (nlohmann::json::parse of both "
      "dump.json) %.2f s (CPU %.2f s), max RSS %.0f MB; compare / baseline %.1fx\n",
      n, f.compare.seconds, f.compare.cpu, f.compare.rss_mb, f.baseline.seconds, f.baseline.cpu, f.baseline.rss_mb,
      f.compare.seconds / f.baseline.seconds);
  if (std::getenv("TORCHPROBE_COMPARE_BENCH_KEEP"))  // e.g. to open report.html (tools/report_open_time.py)
    std::printf("    kept %s\n", dir.string().c_str());
  else
    std::filesystem::remove_all(dir);
  return f;
}

}  // namespace

// Optional argument: the largest size to run (e.g. 100000).
int main(int argc, char** argv) {
  const bool quick = tpbench::quick_mode();
  const std::size_t largest = argc > 1 ? std::stoul(argv[1]) : 1000000;
  const auto root = std::filesystem::temp_directory_path() / ("tp_compare_bench_" + std::to_string(::getpid()));
  std::vector<Figures> done;
  for (const std::size_t n : {10000u, 100000u, 1000000u}) {
    if (quick && n > 10000) {
      std::printf("%8zu entries a side: skipped by quick mode\n", static_cast<std::size_t>(n));
      continue;
    }
    if (n > largest) continue;
    done.push_back(run(n, root));
  }
  // Linear work grows 10x per 10x entries; more than that is a step growing faster than linearly.
  std::printf("\n%10s %11s %9s %8s %11s %12s %12s %11s %11s\n", "entries", "compare s", "CPU s", "RSS MB", "baseline s",
              "vs baseline", "time growth", "CPU growth", "RSS growth");
  for (std::size_t i = 0; i < done.size(); ++i) {
    const Figures& f = done[i];
    char growth[3][32] = {"-", "-", "-"};
    if (i > 0) {
      const Measured& p = done[i - 1].compare;
      std::snprintf(growth[0], sizeof growth[0], "%.1fx", f.compare.seconds / p.seconds);
      std::snprintf(growth[1], sizeof growth[1], "%.1fx", f.compare.cpu / p.cpu);
      std::snprintf(growth[2], sizeof growth[2], "%.1fx", f.compare.rss_mb / p.rss_mb);
    }
    std::printf("%10zu %11.2f %9.2f %8.0f %11.2f %11.1fx %12s %11s %11s\n", f.n, f.compare.seconds, f.compare.cpu,
                f.compare.rss_mb, f.baseline.seconds, f.compare.seconds / f.baseline.seconds, growth[0], growth[1],
                growth[2]);
  }
  if (!std::getenv("TORCHPROBE_COMPARE_BENCH_KEEP")) std::filesystem::remove_all(root);
  return 0;
}

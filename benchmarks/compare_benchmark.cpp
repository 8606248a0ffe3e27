// `torchprobe compare` end to end (issue 41, item 6): two synthetic transformer-like statistics dumps
// of N entries a side (1x/10x/100x: 10k, 100k, 1M), compared by compare::run_compare (read, pair,
// judge, CSV + first_divergence.json + report.html). Prints wall time per stage and end to end, the
// max RSS, and the ratio to a baseline of the same run: parsing both dump.json files with nlohmann.
// Quick mode (TORCHPROBE_BENCH_QUICK=1): 10k only.
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "quick_mode.hpp"
#include "torchprobe/analysis/compare/cli.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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

// Records the time of each line run_compare logs ("[k/4] stage ...").
class StageLog : public std::stringbuf {
 public:
  explicit StageLog(Clock::time_point start) : start_(start) {}
  std::vector<std::pair<double, std::string>> lines;

 protected:
  int sync() override { return 0; }
  int_type overflow(int_type c) override {
    if (c == '\n') {
      lines.emplace_back(seconds_since(start_), line_);
      line_.clear();
    } else if (c != traits_type::eof()) {
      line_ += static_cast<char>(c);
    }
    return c;
  }

 private:
  Clock::time_point start_;
  std::string line_;
};

double max_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

void run(std::size_t n, const std::filesystem::path& root) {
  const auto dir = root / std::to_string(n);
  write_side(dir / "target", n, false);
  write_side(dir / "bench", n, true);
  auto t0 = Clock::now();
  for (const char* side : {"target", "bench"}) {
    std::ifstream in(dir / side / "dump.json");
    const auto j = nlohmann::json::parse(in);
    if (j.at("data").size() != n) std::printf("unexpected entry count\n");
  }
  const double parse = seconds_since(t0);
  torchprobe::compare::CompareOptions o;
  o.target = dir / "target";
  o.bench = dir / "bench";
  o.out = dir / "out";
  o.timestamp = "20260101000000";
  t0 = Clock::now();
  StageLog buf(t0);
  std::ostream log(&buf);
  const int rc = torchprobe::compare::run_compare(o, log);
  const double total = seconds_since(t0);
  std::printf(
      "%8zu entries a side: compare %.2f s end to end (exit %d), max RSS %.0f MB; baseline (nlohmann parse of "
      "both dump.json) %.2f s, ratio %.1fx\n",
      n, total, rc, max_rss_mb(), parse, total / parse);
  double prev = 0;
  for (const auto& [t, line] : buf.lines) {
    std::printf("    %+7.2f s  until: %s\n", t - prev, line.c_str());
    prev = t;
  }
  std::printf("    %+7.2f s  (writing the outputs after the last stage)\n", total - prev);
  std::filesystem::remove_all(dir);
}

}  // namespace

// Optional argument: the largest size to run (e.g. 100000).
int main(int argc, char** argv) {
  const bool quick = tpbench::quick_mode();
  const std::size_t largest = argc > 1 ? std::stoul(argv[1]) : 1000000;
  const auto root = std::filesystem::temp_directory_path() / ("tp_compare_bench_" + std::to_string(::getpid()));
  for (const std::size_t n : {10000u, 100000u, 1000000u}) {
    if (quick && n > 10000) {
      std::printf("%8zu entries a side: skipped by quick mode\n", static_cast<std::size_t>(n));
      continue;
    }
    if (n > largest) continue;
    run(n, root);
  }
  std::filesystem::remove_all(root);
  return 0;
}

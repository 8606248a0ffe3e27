// `torchprobe ranks` at scale (issue 48, item 3): a step of R ranks (4, 16, 64, 256), each a mix dump
// of 10,000 entries (modules with their parameters, the ops inside them, all_reduces, parameter
// gradients), identical on every rank but for each rank's own data and one module's
// parameters.weight, whose Max and Norm rank R/2 holds x 1.001 (the drift). Each size is
// viewed in a child process of its own (view_dump + print_views, as the tool runs them), which
// reports its wall time and max RSS; the baseline, in the same run, is python-free and minimal: the
// same files parsed one after the other with nlohmann by one thread, each dropped before the next.
// Prints the time, the ratio to the baseline, the seconds per million entries (flat when time is
// linear in ranks x entries) and the peak memory; and checks that the drift is named.
// Then the same step read from the ranks' ranks_digest.bin (issue 48, item 4), made by the probe's
// digest builder from the same entries, and steps of 256, 1,024 and 4,096 ranks of which only the
// digests are there (a job's digests gathered on one machine).
// Quick mode (TORCHPROBE_BENCH_QUICK=1): 4 and 16 ranks of 1,000 entries; digests only: 64 ranks.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "child_measure.hpp"
#include "quick_mode.hpp"
#include "torchprobe/analysis/compare/ranks.hpp"
#include "torchprobe/io/rank_digest.hpp"

namespace {

namespace fs = std::filesystem;
using tpbench::Clock;
using tpbench::in_child;
using tpbench::Measured;
using tpbench::seconds_since;

std::string tensor(std::size_t seed, const char* shape, double scale = 1.0) {
  // A value of its own per seed (the fractional part of seed x the golden ratio): a rank's own data
  // never repeats another's, even among thousands of ranks.
  const double v = std::fmod(static_cast<double>(seed) * 0.6180339887498949, 1.0);
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "{\"type\": \"torch.Tensor\", \"dtype\": \"torch.float32\", \"shape\": %s, \"Max\": %.17g, "
                "\"Min\": %.17g, \"Mean\": %.17g, \"Norm\": %.17g, \"requires_grad\": true}",
                shape, (v + 1) * scale, v - 1, v, (3 * v + 1) * scale);
  return buf;
}

// One rank's n entries, (name, body) in dump order. A layer: its module's forward (own input and
// output, the shared parameters), four ops inside (own data), an all_reduce of a gradient (own input,
// shared output) and its parameters_grad (own). `drift`: this rank's parameters.weight of the middle
// layer x 1.001.
template <class Entry>
void rank_entries(std::size_t n, long rank, bool drift, Entry&& entry) {
  std::size_t count = 0;
  const auto put = [&](const std::string& name, const std::string& body) {
    if (count < n) entry(name, body);
    ++count;
  };
  const std::size_t own = 7919 * static_cast<std::size_t>(rank + 1);
  const char* s = "[8, 64]";
  for (std::size_t layer = 0; count < n; ++layer) {
    const std::size_t i = layer * 13;
    for (std::size_t k = 0; k < 4; ++k)
      put("Aten.op" + std::to_string(k) + "." + std::to_string(layer) + ".forward",
          "{\"input_args\": [" + tensor(i + k + own, s) + "], \"input_kwargs\": {}, \"output\": [" +
              tensor(i + k + 1 + own, s) + "]}");
    const bool drifted = drift && layer == n / 7 / 2;
    put("Module.layers." + std::to_string(layer) + ".Linear.forward.0",
        "{\"input_args\": [" + tensor(i + own, s) + "], \"input_kwargs\": {}, \"output\": [" + tensor(i + 2 + own, s) +
            "], \"parameters\": {\"weight\": " + tensor(i + 5, "[64, 64]", drifted ? 1.001 : 1.0) +
            ", \"bias\": " + tensor(i + 6, "[64]") + "}}");
    put("Module.layers." + std::to_string(layer) + ".Linear.parameters_grad.0",
        "{\"weight\": [" + tensor(i + 8 + own, "[64, 64]") + "], \"bias\": [" + tensor(i + 9 + own, "[64]") + "]}");
    put("Distributed.all_reduce." + std::to_string(layer) + ".forward",
        "{\"input_args\": [" + tensor(i + 8 + own, "[64, 64]") + "], \"input_kwargs\": {}, \"output\": [" +
            tensor(i + 10, "[64, 64]") + "]}");
  }
}

void write_rank(const fs::path& dir, std::size_t n, long rank, bool drift) {
  fs::create_directories(dir);
  std::ofstream out(dir / "dump.json");
  out << "{\n \"task\": \"statistics\",\n \"level\": \"mix\",\n \"framework\": \"pytorch\",\n"
         " \"dump_data_dir\": null,\n \"data\": {";
  std::size_t count = 0;
  rank_entries(n, rank, drift, [&](const std::string& name, const std::string& body) {
    out << (count++ ? ",\n  \"" : "\n  \"") << name << "\": " << body;
  });
  out << "\n }\n}\n";
}

// The same rank's ranks_digest.bin, made by the probe's digest builder from the same entries (the
// ones it keeps made JSON, as the step writer does; the others only counted: none is non-finite).
void write_digest(const fs::path& dir, std::size_t n, long rank, bool drift) {
  fs::create_directories(dir);
  torchprobe::io::RankDigestBuilder digest;
  rank_entries(n, rank, drift, [&](const std::string& name, const std::string& body) {
    if (!torchprobe::io::RankDigestBuilder::keeps(name, body.find("\"parameters\"") != std::string::npos)) {
      digest.add_unkept(name, "", "");
      return;
    }
    const nlohmann::ordered_json j = nlohmann::ordered_json::parse(body);
    digest.add<torchprobe::io::rank_items::NlohmannNodes>(name, &j);
  });
  std::ofstream(dir / torchprobe::io::kRankDigestFile, std::ios::binary)
      << torchprobe::io::encode_rank_digest(digest.digest());
}

// The view of `step` in a child process: its time and peak memory, and its first disagreement.
struct View {
  Measured m;
  std::string said;
};
View view_in_child(const fs::path& step, bool digests) {
  int pipe_fd[2];
  if (::pipe(pipe_fd) != 0) std::abort();
  View v;
  v.m = in_child([&](int& status) {
    const auto t0 = Clock::now();
    std::ostringstream text;
    torchprobe::compare::ranks::ViewOptions options;
    options.digests = digests;
    const auto views = torchprobe::compare::ranks::view_dump(step, options);
    status = torchprobe::compare::ranks::print_views(views, text);
    const double seconds = seconds_since(t0);
    if (views.empty() || views.front().source.digests != digests) status = 4;
    const std::string t = text.str();
    const std::size_t at = t.find("first disagreement");
    const std::string first = at == std::string::npos ? std::string("(none)") : t.substr(at, 400);
    if (::write(pipe_fd[1], first.data(), first.size()) < 0) status = 3;
    return seconds;
  });
  ::close(pipe_fd[1]);
  char buf[512];
  const ssize_t got = ::read(pipe_fd[0], buf, sizeof buf - 1);
  ::close(pipe_fd[0]);
  v.said.assign(buf, got > 0 ? static_cast<std::size_t>(got) : 0);
  return v;
}

bool drift_named(const View& v, long ranks) {
  return v.m.status == 1 &&
         v.said.find("rank " + std::to_string(ranks / 2) + ", Module.layers.") != std::string::npos &&
         v.said.find("parameters.weight") != std::string::npos;
}

// Ranks' digests written by `workers` threads (the setup, not measured).
void write_digests(const fs::path& step, long ranks, std::size_t entries) {
  std::atomic<long> next{0};
  std::vector<std::thread> threads;
  for (unsigned k = 0; k < std::max(1u, std::thread::hardware_concurrency()); ++k)
    threads.emplace_back([&] {
      for (long r; (r = next++) < ranks;) write_digest(step / ("rank" + std::to_string(r)), entries, r, r == ranks / 2);
    });
  for (auto& t : threads) t.join();
}

}  // namespace

int main() {
  const bool quick = tpbench::quick_mode();
  const std::size_t entries = quick ? 1000 : 10000;
  const std::vector<long> sizes = quick ? std::vector<long>{4, 16} : std::vector<long>{4, 16, 64, 256};
  const std::vector<long> gathered = quick ? std::vector<long>{64} : std::vector<long>{256, 1024, 4096};
  const fs::path root = fs::temp_directory_path() / ("torchprobe_ranks_bench_" + std::to_string(::getpid()));
  std::printf(
      "torchprobe ranks: a step of R ranks x %zu entries (mix), one rank's weight drifted x 1.001;\n"
      "each view in a child process of its own; baseline: the same files parsed by nlohmann, one thread\n\n",
      entries);
  std::printf("dump.json (--no-digest) and the ranks' ranks_digest.bin, the same step:\n");
  std::printf(
      "  ranks  dump MB   view s   baseline s  ratio   s/M entries   view MB  baseline MB  named | digest KB/rank"
      "  view s  s/M entries  view MB  named\n");
  int failures = 0;
  for (const long ranks : sizes) {
    const fs::path step = root / ("r" + std::to_string(ranks)) / "step0";
    for (long r = 0; r < ranks; ++r) write_rank(step / ("rank" + std::to_string(r)), entries, r, r == ranks / 2);
    std::uintmax_t bytes = 0;
    for (long r = 0; r < ranks; ++r) bytes += fs::file_size(step / ("rank" + std::to_string(r)) / "dump.json");
    const View view = view_in_child(step, false);
    const Measured base = in_child([&](int& status) {
      const auto t0 = Clock::now();
      std::size_t members = 0;
      for (long r = 0; r < ranks; ++r)
        members +=
            torchprobe::compare::read_json_file(step / ("rank" + std::to_string(r)) / "dump.json")["data"].size();
      status = members == static_cast<std::size_t>(ranks) * entries ? 0 : 1;
      return seconds_since(t0);
    });
    write_digests(step, ranks, entries);
    std::uintmax_t digest_bytes = 0;
    for (long r = 0; r < ranks; ++r)
      digest_bytes += fs::file_size(step / ("rank" + std::to_string(r)) / torchprobe::io::kRankDigestFile);
    const View digest = view_in_child(step, true);
    const bool named = drift_named(view, ranks), digest_named = drift_named(digest, ranks);
    failures += !named || !digest_named || base.status != 0;
    const double m_entries = static_cast<double>(ranks * static_cast<long>(entries)) / 1e6;
    std::printf("  %5ld  %7.1f  %7.2f  %10.2f  %5.2fx  %11.3f  %8.0f  %11.0f  %5s | %14.1f  %6.2f  %11.3f  %7.0f  %s\n",
                ranks, static_cast<double>(bytes) / 1e6, view.m.seconds, base.seconds, view.m.seconds / base.seconds,
                view.m.seconds / m_entries, view.m.rss_mb, base.rss_mb, named ? "yes" : "NO",
                static_cast<double>(digest_bytes) / 1024.0 / static_cast<double>(ranks), digest.m.seconds,
                digest.m.seconds / m_entries, digest.m.rss_mb, digest_named ? "yes" : "NO");
    if (!named) std::printf("    the view said: %s\n", view.said.c_str());
    if (!digest_named) std::printf("    the view of the digests said: %s\n", digest.said.c_str());
    fs::remove_all(root / ("r" + std::to_string(ranks)));
  }
  // A job's digests gathered on one machine, without their dump.json files (docs/distributed.md).
  std::printf("\nthe ranks' digests only (gathered from a job; no dump.json):\n");
  std::printf("  ranks  digests MB  view s  s/M entries  view MB  named\n");
  for (const long ranks : gathered) {
    const fs::path step = root / ("g" + std::to_string(ranks)) / "step0";
    write_digests(step, ranks, entries);
    std::uintmax_t digest_bytes = 0;
    for (long r = 0; r < ranks; ++r)
      digest_bytes += fs::file_size(step / ("rank" + std::to_string(r)) / torchprobe::io::kRankDigestFile);
    const View digest = view_in_child(step, true);
    const bool named = drift_named(digest, ranks);
    failures += !named;
    std::printf("  %5ld  %10.1f  %6.2f  %11.3f  %7.0f  %s\n", ranks, static_cast<double>(digest_bytes) / 1e6,
                digest.m.seconds, digest.m.seconds / (static_cast<double>(ranks * static_cast<long>(entries)) / 1e6),
                digest.m.rss_mb, named ? "yes" : "NO");
    if (!named) std::printf("    the view said: %s\n", digest.said.c_str());
    fs::remove_all(root / ("g" + std::to_string(ranks)));
  }
  fs::remove_all(root);
  std::printf(
      "\ngoal (issue 48): 256 ranks of 10,000 entries in <= 30 s and <= 1 GB on 2 cores; s/M entries flat;\n"
      "the digests: kilobytes a rank, and a job of thousands of ranks viewed on one machine\n");
  return failures ? 1 : 0;
}

// `torchprobe ranks` at scale (issue 48, item 3): a step of R ranks (4, 16, 64, 256), each a mix dump
// of 10,000 entries (modules with their parameters, the ops inside them, all_reduces, parameter
// gradients), identical on every rank but for each rank's own data and one module's
// parameters.weight, whose Max and Norm rank R/2 holds x 1.001 (the drift). Each size is
// viewed in a child process of its own (view_dump + print_views, as the tool runs them), which
// reports its wall time and max RSS; the baseline, in the same run, is python-free and minimal: the
// same files parsed one after the other with nlohmann by one thread, each dropped before the next.
// Prints the time, the ratio to the baseline, the seconds per million entries (flat when time is
// linear in ranks x entries) and the peak memory; and checks that the drift is named.
// Quick mode (TORCHPROBE_BENCH_QUICK=1): 4 and 16 ranks of 1,000 entries.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "child_measure.hpp"
#include "quick_mode.hpp"
#include "torchprobe/analysis/compare/ranks.hpp"

namespace {

namespace fs = std::filesystem;
using tpbench::Clock;
using tpbench::in_child;
using tpbench::Measured;
using tpbench::seconds_since;

std::string tensor(std::size_t seed, const char* shape, double scale = 1.0) {
  const double v = static_cast<double>(seed % 997) / 997.0;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "{\"type\": \"torch.Tensor\", \"dtype\": \"torch.float32\", \"shape\": %s, \"Max\": %.17g, "
                "\"Min\": %.17g, \"Mean\": %.17g, \"Norm\": %.17g, \"requires_grad\": true}",
                shape, (v + 1) * scale, v - 1, v, (3 * v + 1) * scale);
  return buf;
}

// One rank's dump.json of n entries. A layer: its module's forward (own input and output, the shared
// parameters), four ops inside (own data), an all_reduce of a gradient (own input, shared output) and
// its parameters_grad (own). `drift`: this rank's parameters.weight of the middle layer x 1.001.
void write_rank(const fs::path& dir, std::size_t n, long rank, bool drift) {
  fs::create_directories(dir);
  std::ofstream out(dir / "dump.json");
  out << "{\n \"task\": \"statistics\",\n \"level\": \"mix\",\n \"framework\": \"pytorch\",\n"
         " \"dump_data_dir\": null,\n \"data\": {";
  std::size_t count = 0;
  const auto entry = [&](const std::string& name, const std::string& body) {
    if (count >= n) return;
    out << (count ? ",\n  \"" : "\n  \"") << name << "\": " << body;
    ++count;
  };
  const std::size_t own = 7919 * static_cast<std::size_t>(rank + 1);
  const char* s = "[8, 64]";
  for (std::size_t layer = 0; count < n; ++layer) {
    const std::size_t i = layer * 13;
    for (std::size_t k = 0; k < 4; ++k)
      entry("Aten.op" + std::to_string(k) + "." + std::to_string(layer) + ".forward",
            "{\"input_args\": [" + tensor(i + k + own, s) + "], \"input_kwargs\": {}, \"output\": [" +
                tensor(i + k + 1 + own, s) + "]}");
    const bool drifted = drift && layer == n / 7 / 2;
    entry("Module.layers." + std::to_string(layer) + ".Linear.forward.0",
          "{\"input_args\": [" + tensor(i + own, s) + "], \"input_kwargs\": {}, \"output\": [" +
              tensor(i + 2 + own, s) + "], \"parameters\": {\"weight\": " +
              tensor(i + 5, "[64, 64]", drifted ? 1.001 : 1.0) + ", \"bias\": " + tensor(i + 6, "[64]") + "}}");
    entry("Module.layers." + std::to_string(layer) + ".Linear.parameters_grad.0",
          "{\"weight\": [" + tensor(i + 8 + own, "[64, 64]") + "], \"bias\": [" + tensor(i + 9 + own, "[64]") + "]}");
    entry("Distributed.all_reduce." + std::to_string(layer) + ".forward",
          "{\"input_args\": [" + tensor(i + 8 + own, "[64, 64]") + "], \"input_kwargs\": {}, \"output\": [" +
              tensor(i + 10, "[64, 64]") + "]}");
  }
  out << "\n }\n}\n";
}

}  // namespace

int main() {
  const bool quick = tpbench::quick_mode();
  const std::size_t entries = quick ? 1000 : 10000;
  const std::vector<long> sizes = quick ? std::vector<long>{4, 16} : std::vector<long>{4, 16, 64, 256};
  const fs::path root = fs::temp_directory_path() / ("torchprobe_ranks_bench_" + std::to_string(::getpid()));
  std::printf(
      "torchprobe ranks: a step of R ranks x %zu entries (mix), one rank's weight drifted x 1.001;\n"
      "each view in a child process of its own; baseline: the same files parsed by nlohmann, one thread\n\n",
      entries);
  std::printf("  ranks  dump MB   view s   baseline s  ratio   s/M entries   view MB  baseline MB  drift named\n");
  int failures = 0;
  for (const long ranks : sizes) {
    const fs::path step = root / ("r" + std::to_string(ranks)) / "step0";
    for (long r = 0; r < ranks; ++r) write_rank(step / ("rank" + std::to_string(r)), entries, r, r == ranks / 2);
    std::uintmax_t bytes = 0;
    for (long r = 0; r < ranks; ++r) bytes += fs::file_size(step / ("rank" + std::to_string(r)) / "dump.json");
    std::string said;
    int pipe_fd[2];
    if (::pipe(pipe_fd) != 0) return 1;
    const Measured view = in_child([&](int& status) {
      const auto t0 = Clock::now();
      std::ostringstream text;
      status = torchprobe::compare::ranks::print_views(torchprobe::compare::ranks::view_dump(step), text);
      const double seconds = seconds_since(t0);
      const std::string t = text.str();
      const std::string first = t.substr(t.find("first disagreement"));
      if (::write(pipe_fd[1], first.data(), first.size()) < 0) status = 3;
      return seconds;
    });
    ::close(pipe_fd[1]);
    char buf[512];
    const ssize_t got = ::read(pipe_fd[0], buf, sizeof buf - 1);
    ::close(pipe_fd[0]);
    said.assign(buf, got > 0 ? static_cast<std::size_t>(got) : 0);
    const Measured base = in_child([&](int& status) {
      const auto t0 = Clock::now();
      std::size_t members = 0;
      for (long r = 0; r < ranks; ++r)
        members +=
            torchprobe::compare::read_json_file(step / ("rank" + std::to_string(r)) / "dump.json")["data"].size();
      status = members == static_cast<std::size_t>(ranks) * entries ? 0 : 1;
      return seconds_since(t0);
    });
    const std::string expect = "rank " + std::to_string(ranks / 2) + ", Module.layers.";
    const bool named = view.status == 1 && said.find(expect) != std::string::npos &&
                       said.find("parameters.weight") != std::string::npos;
    failures += !named || base.status != 0;
    std::printf("  %5ld  %7.1f  %7.2f  %10.2f  %5.2fx  %11.3f  %8.0f  %11.0f  %s\n", ranks,
                static_cast<double>(bytes) / 1e6, view.seconds, base.seconds, view.seconds / base.seconds,
                view.seconds / (static_cast<double>(ranks * static_cast<long>(entries)) / 1e6), view.rss_mb,
                base.rss_mb, named ? "yes" : "NO");
    if (!named) std::printf("    the view said: %s\n", said.c_str());
    fs::remove_all(root / ("r" + std::to_string(ranks)));
  }
  fs::remove_all(root);
  std::printf("\ngoal (issue 48): 256 ranks of 10,000 entries in <= 30 s and <= 1 GB on 2 cores; s/M entries flat\n");
  return failures ? 1 : 0;
}

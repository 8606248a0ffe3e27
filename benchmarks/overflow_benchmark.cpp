// Cost of Task::OverflowCheck per training step, as a ratio to the same step without TorchProbe,
// measured in the same run. Probed and un-probed blocks of steps alternate and the ratio is the
// median of the per-round ratios, so slow drift of the machine (frequency, other load) cancels.
//
// Rows: overflow_check at L1 with nothing written (NullSink: the check itself), then at L1, L0 and
// mix with msprobe's files written each step, on steps where nothing overflows (the steady state
// of a run that watches for overflows); statistics L1 for comparison; and overflow_check on a step
// whose every call overflows (the worst case: every tensor saved as .pt).
//
//   cmake -S . -B build-bench -DTORCHPROBE_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release
//   cmake --build build-bench --target torchprobe_benchmarks &&
//   build-bench/benchmarks/torchprobe_benchmarks overflow
#include <torch/torch.h>
#include <torchprobe/torchprobe.hpp>

#include "registry.hpp"
#include "bench_support.hpp"
#include "../tests/remove_tree.hpp"  // not std::filesystem::remove_all: see there

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace tp = torchprobe;
using tpbench::Mlp;
using tpbench::QuickStart;

namespace {

using Result = tpbench::Alternated;

// Warm-up first: allocator, kernels, first files.
Result compare(const std::function<void()>& plain, const std::function<void()>& probed, int steps, int rounds) {
  return tpbench::alternate(plain, probed, steps, rounds, tpbench::quick_mode() ? 1 : 3);
}

template <tp::Level L, tp::Task T, class Sink = tp::DirectorySink, class Model>
Result measure(Model& model, const torch::Tensor& x, const std::string& dir, int steps, int rounds) {
  tp::Options options;
  options.dump_path(dir);
  if (T == tp::Task::OverflowCheck) options.overflow_nums(-1);
  tp::Debugger<L, T, Sink> probe(options);
  auto plain = [&] { model->forward(x).sum().backward(); };
  auto probed = [&] {
    probe.start(model);
    model->forward(x).sum().backward();
    probe.stop();
    probe.step();
  };
  return compare(plain, probed, steps, rounds);
}

void row(const char* what, const Result& r) {
  std::printf("  %-52s %10.1f us  %10.1f us  %6.3fx\n", what, r.plain_us, r.probed_us, r.ratio);
}

template <class Model>
void measure_model(const char* name, Model& model, const torch::Tensor& x, int steps, int rounds) {
  const std::string dir = (std::filesystem::temp_directory_path() / "torchprobe_overflow_bench").string();
  tptest::remove_tree(dir);
  std::printf("\n%s\n  %-52s %13s  %13s  %7s\n", name, "", "un-probed", "probed", "ratio");
  using tp::Level;
  using tp::Task;
  row("overflow_check L1, no overflow, capture only (NullSink)",
      measure<Level::L1, Task::OverflowCheck, tp::NullSink>(model, x, dir, steps, rounds));
  row("overflow_check L1, no overflow (files each step)",
      measure<Level::L1, Task::OverflowCheck>(model, x, dir, steps, rounds));
  row("overflow_check L0, no overflow (files each step)",
      measure<Level::L0, Task::OverflowCheck>(model, x, dir, steps, rounds));
  row("overflow_check mix, no overflow (files each step)",
      measure<Level::Mix, Task::OverflowCheck>(model, x, dir, steps, rounds));
  row("statistics L1 (every entry written), for comparison",
      measure<Level::L1, Task::Statistics>(model, x, dir, steps, rounds));
  // Worst case: an inf in the input makes every call overflow, so every tensor is saved.
  torch::Tensor poisoned = x.detach().clone();
  poisoned.view(-1)[0] = std::numeric_limits<float>::infinity();
  poisoned.requires_grad_(x.requires_grad());
  row("overflow_check L1, every call overflows (all saved)",
      measure<Level::L1, Task::OverflowCheck>(model, poisoned, dir, std::max(1, steps / 5), rounds));
  tptest::remove_tree(dir);
}

}  // namespace

TORCHPROBE_BENCHMARK(overflow) {
  const bool quick_run = tpbench::quick_mode();
  torch::manual_seed(1234);
  std::printf(
      "TorchProbe overflow_check cost: step = forward + sum().backward(), start/stop/step around it;\n"
      "ratio = median over rounds of probed / un-probed time, measured alternately in the same run\n");
  QuickStart quick;
  measure_model("quick-start model, Linear(8,4)+relu, batch 2", quick, torch::randn({2, 8}, torch::requires_grad()),
                quick_run ? 2 : 50, quick_run ? 1 : 9);
  Mlp mlp;
  measure_model("MLP 4 x Linear(512,512)+gelu, LayerNorm, batch 64", mlp,
                torch::randn({64, 512}, torch::requires_grad()), quick_run ? 1 : 5, quick_run ? 1 : 15);
  return 0;
}

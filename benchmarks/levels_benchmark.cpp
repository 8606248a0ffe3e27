// Cost of dumping, per training step, as a ratio to the same step without TorchProbe, measured
// in the same run: for a debugger that is constructed but never started, and for levels L1, L0
// and mix with statistics, once with the records discarded (NullSink: capture cost alone) and
// once written to disk as msprobe's files (DirectorySink, one flush per step).
//
//   cmake -S . -B build-bench -DTORCHPROBE_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release
//   cmake --build build-bench --target torchprobe_benchmarks &&
//   build-bench/benchmarks/torchprobe_benchmarks levels
#include <torch/torch.h>
#include <torchprobe/torchprobe.hpp>

#include "registry.hpp"
#include "bench_support.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace tp = torchprobe;
using tpbench::Mlp;
using tpbench::QuickStart;
using Clock = std::chrono::steady_clock;

namespace {

// Median over `repeats` of the mean time of one step over `steps` steps, in microseconds.
double median_step_us(const std::function<void()>& one_step, int steps, int repeats) {
  for (int i = 0; i < (tpbench::quick_mode() ? 1 : 3); ++i) one_step();  // warm-up
  std::vector<double> runs;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s) one_step();
    runs.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / steps);
  }
  return tpbench::median(runs);
}

template <tp::Level L, class Sink, class Model>
double probed_step_us(Model& model, const torch::Tensor& x, const std::string& dir, int steps, int repeats) {
  tp::Debugger<L, tp::Task::Statistics, Sink> probe(tp::Options().dump_path(dir));
  return median_step_us(
      [&] {
        probe.start(model);
        model->forward(x).sum().backward();
        probe.stop();
        probe.step();
      },
      steps, repeats);
}

template <class Model>
void measure(const char* name, Model& model, const torch::Tensor& x, int steps, int repeats) {
  const std::string dir = (std::filesystem::temp_directory_path() / "torchprobe_levels_bench").string();
  std::filesystem::remove_all(dir);
  const double plain = median_step_us([&] { model->forward(x).sum().backward(); }, steps, repeats);
  tp::Debugger<tp::Level::Mix, tp::Task::Statistics> idle(tp::Options().dump_path(dir));
  const double off = median_step_us([&] { model->forward(x).sum().backward(); }, steps, repeats);
  std::printf("\n%s: un-probed step %.1f us\n", name, plain);
  std::printf("  %-34s %10.1f us  %6.2fx\n", "debugger constructed, not started", off, off / plain);
  struct Row {
    const char* what;
    double us;
  };
  const Row rows[] = {
      {"L1  capture only (NullSink)", probed_step_us<tp::Level::L1, tp::NullSink>(model, x, dir, steps, repeats)},
      {"L0  capture only (NullSink)", probed_step_us<tp::Level::L0, tp::NullSink>(model, x, dir, steps, repeats)},
      {"mix capture only (NullSink)", probed_step_us<tp::Level::Mix, tp::NullSink>(model, x, dir, steps, repeats)},
      {"L1  with files (DirectorySink)",
       probed_step_us<tp::Level::L1, tp::DirectorySink>(model, x, dir, steps, repeats)},
      {"L0  with files (DirectorySink)",
       probed_step_us<tp::Level::L0, tp::DirectorySink>(model, x, dir, steps, repeats)},
      {"mix with files (DirectorySink)",
       probed_step_us<tp::Level::Mix, tp::DirectorySink>(model, x, dir, steps, repeats)},
  };
  for (const Row& r : rows) std::printf("  %-34s %10.1f us  %6.2fx\n", r.what, r.us, r.us / plain);
  std::filesystem::remove_all(dir);
}

}  // namespace

TORCHPROBE_BENCHMARK(levels) {
  const bool quick_run = tpbench::quick_mode();
  torch::manual_seed(1234);
  std::printf(
      "TorchProbe level cost: step = forward + sum().backward(); ratios to the un-probed step of the same run\n");
  QuickStart quick;
  measure("quick-start model, Linear(8,4)+relu, batch 2", quick, torch::randn({2, 8}, torch::requires_grad()),
          quick_run ? 2 : 50, quick_run ? 1 : 7);
  Mlp mlp;
  measure("MLP 4 x Linear(512,512)+gelu, LayerNorm, batch 64", mlp, torch::randn({64, 512}, torch::requires_grad()),
          quick_run ? 1 : 10, quick_run ? 1 : 5);
  return 0;
}

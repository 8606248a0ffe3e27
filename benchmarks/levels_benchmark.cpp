// Cost of dumping, per training step, as a ratio to the same step without TorchProbe, measured
// in the same run: for a debugger that is constructed but never started, and for levels L1, L0,
// mix and L2 (every nested ATen op too) with statistics, once with the records discarded (NullSink:
// capture cost alone) and once written to disk as msprobe's files (DirectorySink, one flush per
// step, the files complete on disk: wait_written() each step).
//
//   cmake -S . -B build-bench -DTORCHPROBE_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release
//   cmake --build build-bench --target torchprobe_benchmarks &&
//   build-bench/benchmarks/torchprobe_benchmarks levels
#include <torch/torch.h>
#include <torchprobe/torchprobe.hpp>
// NullSink's debuggers are not in the compiled library: this file also builds against it
// (torchprobe_levels_benchmark_compiled), where the DirectorySink ones come from the library.
#include <torchprobe/debugger_impl.hpp>
#include <torchprobe/sink/null_sink.hpp>

#include "registry.hpp"
#include "bench_support.hpp"
#include "../tests/remove_tree.hpp"  // not std::filesystem::remove_all: see there

#include <algorithm>
#include <chrono>
#include <cmath>
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

// A pre-norm transformer block (attention and MLP, residuals) on [batch, seq, dim]: its linears
// on 3-D inputs and its softmax and layer norms run nested ATen ops, which L2 records.
struct BlockImpl : torch::nn::Module {
  static constexpr int64_t kDim = 64, kHeads = 4;
  torch::nn::LayerNorm ln1{torch::nn::LayerNormOptions({kDim})}, ln2{torch::nn::LayerNormOptions({kDim})};
  torch::nn::Linear qkv{kDim, 3 * kDim}, proj{kDim, kDim}, up{kDim, 4 * kDim}, down{4 * kDim, kDim};
  BlockImpl() {
    register_module("ln1", ln1), register_module("ln2", ln2), register_module("qkv", qkv);
    register_module("proj", proj), register_module("up", up), register_module("down", down);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), hd = kDim / kHeads;
    auto parts = qkv(ln1(x)).view({b, t, 3, kHeads, hd}).permute({2, 0, 3, 1, 4});
    auto att = torch::softmax(parts[0].matmul(parts[1].transpose(-2, -1)) / std::sqrt(double(hd)), -1);
    auto h = x + proj(att.matmul(parts[2]).transpose(1, 2).reshape({b, t, kDim}));
    return h + down(torch::gelu(up(ln2(h))));
  }
};
TORCH_MODULE(Block);

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
        probe.wait_written();
      },
      steps, repeats);
}

template <class Model>
void measure(const char* name, Model& model, const torch::Tensor& x, int steps, int repeats) {
  const std::string dir = (std::filesystem::temp_directory_path() / "torchprobe_levels_bench").string();
  tptest::remove_tree(dir);
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
      {"L2  capture only (NullSink)", probed_step_us<tp::Level::L2, tp::NullSink>(model, x, dir, steps, repeats)},
      {"L1  with files (DirectorySink)",
       probed_step_us<tp::Level::L1, tp::DirectorySink>(model, x, dir, steps, repeats)},
      {"L0  with files (DirectorySink)",
       probed_step_us<tp::Level::L0, tp::DirectorySink>(model, x, dir, steps, repeats)},
      {"mix with files (DirectorySink)",
       probed_step_us<tp::Level::Mix, tp::DirectorySink>(model, x, dir, steps, repeats)},
      {"L2  with files (DirectorySink)",
       probed_step_us<tp::Level::L2, tp::DirectorySink>(model, x, dir, steps, repeats)},
  };
  for (const Row& r : rows) std::printf("  %-34s %10.1f us  %6.2fx\n", r.what, r.us, r.us / plain);
  tptest::remove_tree(dir);
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
  Block block;
  measure("transformer block, dim 64, 4 heads, batch 8 x 32 tokens", block,
          torch::randn({8, 32, BlockImpl::kDim}, torch::requires_grad()), quick_run ? 1 : 20, quick_run ? 1 : 5);
  return 0;
}

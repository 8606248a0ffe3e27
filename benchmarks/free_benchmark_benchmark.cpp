// Cost of Task::FreeBenchmark per training step, as a ratio to the same step without TorchProbe,
// measured in the same run (alternating blocks, median of the per-round ratios), for each pert_mode,
// on the benchmark MLP in fp32 and in bf16 (improve_precision re-runs only calls with fp16/bf16
// inputs: on the fp32 model it costs the capture alone). Two columns per mode: every call re-run
// (if_preheat false), and the steady state with preheat (if_preheat true, msprobe's default
// preheat_step 15 and max_sample 20: the preheat steps run first, untimed; then at most
// ceil(calls / 15) re-runs per API per step). The default sink writes every step's files.
//
//   cmake -S . -B build-bench -DTORCHPROBE_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release
//   cmake --build build-bench --target torchprobe_benchmarks &&
//   build-bench/benchmarks/torchprobe_benchmarks free_benchmark
#include <torch/torch.h>
#include <torchprobe/torchprobe.hpp>

#include "registry.hpp"
#include "bench_support.hpp"
#include "../tests/remove_tree.hpp"  // not std::filesystem::remove_all: see there

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace tp = torchprobe;

namespace {

// The probed step's cost over the plain step's, with or without preheat.
tpbench::Alternated measure(const char* mode, bool preheat, tpbench::Mlp& model, const torch::Tensor& x,
                            const std::string& dir, int steps, int rounds) {
  tp::Options options;
  options.dump_path(dir).set("pert_mode", mode);
  if (std::string(mode) == "to_cpu") options.set("fuzz_device", "cpu");
  const int preheat_step = 15;
  if (preheat) options.set("if_preheat", true).set("preheat_step", preheat_step).set("max_sample", 20);
  tp::Debugger<tp::Level::L1, tp::Task::FreeBenchmark> probe(options);
  auto plain = [&] { model->forward(x).sum().backward(); };
  auto probed = [&] {
    probe.start();
    model->forward(x).sum().backward();
    probe.stop();
    probe.step();
  };
  // With preheat, step 0 (counting) and the preheat steps (CPU comparisons) go before the timing.
  return tpbench::alternate(plain, probed, steps, rounds, preheat ? preheat_step : 1);
}

}  // namespace

TORCHPROBE_BENCHMARK(free_benchmark) {
  const bool quick = tpbench::quick_mode();
  torch::manual_seed(1234);
  const std::string dir = (std::filesystem::temp_directory_path() / "torchprobe_free_benchmark_bench").string();
  std::printf(
      "TorchProbe free_benchmark cost: step = forward + sum().backward(), start/stop/step around it;\n"
      "ratio = median over rounds of probed / un-probed time, measured alternately in the same run\n");
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    tpbench::Mlp mlp;
    mlp->to(dtype);
    const torch::Tensor x = torch::randn({64, 512}).to(dtype).requires_grad_();
    std::printf("\nMLP 4 x Linear(512,512)+gelu, LayerNorm, batch 64, %s\n  %-18s %11s  %11s %7s  %11s %7s\n",
                dtype == torch::kFloat ? "fp32" : "bf16", "pert_mode", "un-probed", "every call", "ratio", "preheated",
                "ratio");
    for (const char* mode : {"improve_precision", "add_noise", "bit_noise", "change_value", "no_change", "to_cpu"}) {
      const int steps = quick ? 1 : 3, rounds = quick ? 1 : 5;
      const tpbench::Alternated all = measure(mode, false, mlp, x, dir, steps, rounds);
      const tpbench::Alternated pre = measure(mode, true, mlp, x, dir, steps, rounds);
      std::printf("  %-18s %8.1f us  %8.1f us %6.2fx  %8.1f us %6.2fx\n", mode, pre.plain_us, all.probed_us, all.ratio,
                  pre.probed_us, pre.ratio);
      std::fflush(stdout);
    }
  }
  tptest::remove_tree(dir);
  return 0;
}

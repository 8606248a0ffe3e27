// Cost of the gradient monitor (task grad_probe) per training step, as a ratio to the same step
// without it, measured in the same run (alternating blocks, median of the per-round ratios), at each
// grad_level, on the benchmark MLP (fp32, SGD). Goal of issue 16: <= 1.05x at L2.
//
//   cmake -S . -B build-bench -DTORCHPROBE_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release
//   cmake --build build-bench --target torchprobe_benchmarks &&
//   build-bench/benchmarks/torchprobe_benchmarks grad_probe
#include <torch/torch.h>
#include <torchprobe/torchprobe.hpp>

#include "registry.hpp"
#include "bench_support.hpp"
#include "../tests/remove_tree.hpp"  // not std::filesystem::remove_all: see there

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace tp = torchprobe;

TORCHPROBE_BENCHMARK(grad_probe) {
  const bool quick = tpbench::quick_mode();
  torch::manual_seed(1234);
  const std::string dir = (std::filesystem::temp_directory_path() / "torchprobe_grad_probe_bench").string();
  tpbench::Mlp model;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(1e-4));
  const torch::Tensor x = torch::randn({64, 512});
  std::printf(
      "TorchProbe grad_probe cost: step = zero_grad + forward + sum().backward() + [mon.step()] + optimizer.step()\n"
      "MLP 4 x Linear(512,512)+gelu, LayerNorm, batch 64, fp32, %d parameters (%lld elements)\n"
      "ratio = median over rounds of probed / un-probed time, measured alternately in the same run\n\n"
      "  %-6s %13s  %13s  %7s  %13s\n",
      static_cast<int>(model->parameters().size()), static_cast<long long>([&] {
        int64_t n = 0;
        for (const auto& p : model->parameters()) n += p.numel();
        return n;
      }()),
      "level", "un-probed", "probed", "ratio", "step() alone");
  for (const char* level : {"L0", "L1", "L2"}) {
    tp::GradMonitor mon(tp::Options().set("task", "grad_probe").dump_path(dir).set("grad_level", level));
    mon.monitor(model);
    auto plain = [&] {
      opt.zero_grad();
      model->forward(x).sum().backward();
      opt.step();
    };
    auto probed = [&] {
      opt.zero_grad();
      model->forward(x).sum().backward();
      mon.step();
      opt.step();
    };
    const tpbench::Alternated t = tpbench::alternate(plain, probed, quick ? 1 : 5, quick ? 1 : 9);
    // The monitor's own share: step() alone on the gradients of the last step.
    std::vector<double> alone;
    for (int r = 0; r < (quick ? 1 : 9); ++r) alone.push_back(tpbench::block_us([&] { mon.step(); }, quick ? 1 : 5));
    std::printf("  %-6s %10.1f us  %10.1f us  %6.3fx  %10.1f us\n", level, t.plain_us, t.probed_us, t.ratio,
                tpbench::median(alone));
  }
  tptest::remove_tree(dir);
  return 0;
}

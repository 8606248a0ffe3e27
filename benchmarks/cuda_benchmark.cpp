// What TorchProbe costs on a CUDA device, against baselines measured in the same run.
//
//   torchprobe_benchmarks cuda        (or torchprobe_cuda_benchmark cuda, the build .ci/gpu.sh makes)
//
// 1. Statistics of one tensor at 1x, 10x and 100x the elements (fp32 and bf16): TorchProbe's
//    device reduction (stats/device_stats.hpp: four values reduced where the tensor lives, one
//    device-to-host copy) against msprobe's way (max, min, mean, norm, each read back with item()),
//    against one ATen sum read back (one pass over the bytes: the memory-bound floor), and against
//    the same four statistics reduced in the tensor's own dtype with float64 accumulation (no float64
//    copy of the tensor: what the probe could do instead). Each with its error against float64 on
//    the CPU copy, and its read bandwidth (the tensor's bytes over the time).
// 2. A training step of an MLP on the GPU at 1x, 10x and 100x the steps: un-probed, with a
//    constructed but never started debugger, with mix + statistics into a NullSink (the capture
//    alone, statistics still read back from the device at each step), and writing msprobe's files
//    (the default sink, files complete on disk at each step). A per-step cost that grows with the
//    number of steps is a defect.
// Without a CUDA device it prints "SKIPPED: no CUDA device" and measures nothing.
// TORCHPROBE_BENCH_QUICK=1: the smallest size and a few steps only.
#include <torch/torch.h>
#include <torchprobe/torchprobe.hpp>
#include <torchprobe/stats/device_stats.hpp>

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
using Clock = std::chrono::steady_clock;

namespace {

void sync() { torch::cuda::synchronize(); }

// Best time in milliseconds of `rounds` calls of `run`, each ended by a device synchronisation.
double best_ms(const std::function<void()>& run, int rounds) {
  run();  // warm-up: allocator, kernels' first launch
  sync();
  double best = 1e300;
  for (int r = 0; r < rounds; ++r) {
    sync();
    const auto t0 = Clock::now();
    run();
    sync();
    best = std::min(best, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return best;
}

// The four statistics reduced in the tensor's dtype, mean and norm accumulated in float64.
at::Tensor native_dtype_stats(const at::Tensor& t) {
  return at::stack({t.max().to(at::kDouble), t.min().to(at::kDouble), at::mean(t, at::kDouble),
                    at::linalg_vector_norm(t, 2, at::OptionalIntArrayRef(), false, at::kDouble)});
}

double relative_error(double got, double want) {
  return want == 0 ? std::abs(got) : std::abs(got - want) / std::abs(want);
}

void statistics_table(at::ScalarType dtype, const char* label, const std::vector<std::int64_t>& sizes, int rounds) {
  std::printf("\nstatistics of one %s tensor on the GPU (best of %d; ratio = time / one ATen sum's time)\n", label,
              rounds);
  std::printf("  %-12s %-40s %10s %9s %8s %12s\n", "elements", "method", "ms", "GB/s", "ratio", "mean/norm err");
  for (const std::int64_t n : sizes) {
    torch::manual_seed(3);
    const at::Tensor t = (torch::randn({n}, torch::kCUDA) * 5 + 1).to(dtype);
    const at::Tensor ref = t.to(at::kCPU).to(at::kDouble);
    const double want_mean = ref.mean().item<double>(), want_norm = ref.norm().item<double>();
    const double bytes = static_cast<double>(n) * static_cast<double>(t.element_size());
    double probe_mean = 0, probe_norm = 0, native_mean = 0, native_norm = 0, items_mean = 0, items_norm = 0;
    struct Row {
      const char* name;
      std::function<void()> run;
      const double* mean;
      const double* norm;
    };
    const std::vector<Row> rows = {
        {"one ATen sum + item() (floor)", [&] { (void)t.sum().item<double>(); }, nullptr, nullptr},
        {"TorchProbe: device reduce, 1 copy",
         [&] {
           tp::stats::DeferredStats pending;
           pending.add(t);
           const auto s = pending.resolve();
           probe_mean = s[0].mean.as_double();
           probe_norm = s[0].norm.as_double();
         },
         &probe_mean, &probe_norm},
        {"msprobe: max/min/mean/norm, 4 item()",
         [&] {
           (void)t.max().item<double>();
           (void)t.min().item<double>();
           items_mean = t.mean().item<double>();
           items_norm = t.norm().item<double>();
         },
         &items_mean, &items_norm},
        {"own dtype, float64 accumulate, 1 copy",
         [&] {
           const at::Tensor v = native_dtype_stats(t).to(at::kCPU);
           native_mean = v[2].item<double>();
           native_norm = v[3].item<double>();
         },
         &native_mean, &native_norm},
    };
    double floor_ms = 0;
    for (const Row& row : rows) {
      const double ms = best_ms(row.run, rounds);
      if (floor_ms == 0) floor_ms = ms;
      char err[64] = "-";
      if (row.mean)
        std::snprintf(err, sizeof err, "%.1e/%.1e", relative_error(*row.mean, want_mean),
                      relative_error(*row.norm, want_norm));
      std::printf("  %-12lld %-40s %10.3f %9.1f %8.2f %12s\n", static_cast<long long>(n), row.name, ms,
                  bytes / (ms * 1e6), ms / floor_ms, err);
    }
  }
}

// An MLP on the GPU: the benchmarks' 4 x Linear(512, 512) + gelu, LayerNorm, batch 256.
void training_table(const std::vector<int>& step_counts) {
  std::printf(
      "\nMLP 4 x Linear(512,512)+gelu, LayerNorm, batch 256, on the GPU: us per step (forward, "
      "sum().backward(); ratio to the un-probed step of the same row)\n");
  std::printf("  %-8s %12s %14s %8s %18s %8s %22s %8s\n", "steps", "un-probed", "not started", "ratio",
              "mix, capture only", "ratio", "mix+statistics, files", "ratio");
  torch::manual_seed(5);
  tpbench::Mlp model;
  model->to(torch::kCUDA);
  const torch::Tensor x = torch::randn({256, 512}, torch::kCUDA);
  const auto plain_step = [&] {
    model->forward(x).sum().backward();
    sync();
  };
  const std::string dir = (std::filesystem::temp_directory_path() / "torchprobe_cuda_bench").string();
  for (const int steps : step_counts) {
    tptest::remove_tree(dir);
    plain_step();
    const double plain = tpbench::block_us(plain_step, steps);
    double idle_us = 0, capture_us = 0, probed_us = 0;
    {
      tp::Debugger<tp::Level::Mix, tp::Task::Statistics> idle(tp::Options().dump_path(dir));
      idle_us = tpbench::block_us(plain_step, steps);
    }
    {
      tp::Debugger<tp::Level::Mix, tp::Task::Statistics, tp::NullSink> probe(tp::Options().dump_path(dir));
      capture_us = tpbench::block_us(
          [&] {
            probe.start(model);
            model->forward(x).sum().backward();
            probe.stop();
            probe.step();
          },
          steps);
    }
    {
      tp::Debugger<tp::Level::Mix, tp::Task::Statistics> probe(tp::Options().dump_path(dir));
      probed_us = tpbench::block_us(
          [&] {
            probe.start(model);
            model->forward(x).sum().backward();
            probe.stop();
            probe.step();
            probe.wait_written();  // the step's files complete on disk
          },
          steps);
    }
    std::printf("  %-8d %12.1f %14.1f %8.2f %18.1f %8.2f %22.1f %8.2f\n", steps, plain, idle_us, idle_us / plain,
                capture_us, capture_us / plain, probed_us, probed_us / plain);
  }
  tptest::remove_tree(dir);
}

}  // namespace

TORCHPROBE_BENCHMARK(cuda) {
  if (!torch::cuda::is_available()) {
    std::printf("SKIPPED: no CUDA device (this benchmark measures nothing on a CPU-only machine)\n");
    return 0;
  }
  const bool quick = tpbench::quick_mode();
  const std::vector<std::int64_t> sizes =
      quick ? std::vector<std::int64_t>{1 << 16} : std::vector<std::int64_t>{1 << 20, 10 << 20, 100 << 20};
  const int rounds = quick ? 1 : 10;
  std::printf("TorchProbe on CUDA device 0 of %d\n", static_cast<int>(torch::cuda::device_count()));
  statistics_table(at::kFloat, "float32", sizes, rounds);
  statistics_table(at::kBFloat16, "bfloat16", sizes, rounds);
  training_table(quick ? std::vector<int>{2} : std::vector<int>{10, 100, 1000});
  return 0;
}

// How fast TorchProbe's statistics are, against ATen and against memory bandwidth, in one run.
//
//   torchprobe_benchmarks stats [--elements N] [--reps R] [--tiny-calls C] [--threads T]
//
// TORCHPROBE_BENCH_QUICK=1 makes the defaults 64k elements, 1 round, 2000 tiny calls.
//
// --threads sets ATen's intra-op thread count for ATen and TorchProbe alike (default: every
// hardware thread; libtorch's own default can be lower, e.g. 1 on a 2-vCPU VM).
//
// For 64M-element float32, bfloat16 and float16 tensors (randn) it prints the fused kernel's time
// and throughput; ATen's four separate statistics (max, min, mean, norm, each read back with
// item() as msprobe does); ATen's single sum; a memory-read baseline over the same bytes; and
// the error of Mean/Norm against float64. Every method runs once per round and rounds repeat,
// so a noisy neighbour slows all of them alike; the best round counts. Then the per-op cost of
// capture with statistics on a tiny op, with and without a started Debugger.
#include <torchprobe/torchprobe.hpp>
#include <torchprobe/stats/cpu_stats.hpp>

#include "registry.hpp"
#include "quick_mode.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace tp = torchprobe;
using Clock = std::chrono::steady_clock;

namespace {

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// ---- memory-read baseline: XOR every 64-bit word, four independent accumulators ---------------
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) std::uint64_t xor_words_avx2(const unsigned char* p, std::size_t bytes) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  std::size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    a = _mm256_xor_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_xor_si256(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_xor_si256(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_xor_si256(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d)));
  std::uint64_t x = lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
  for (; i < bytes; ++i) x ^= p[i];
  return x;
}
#endif

std::uint64_t xor_words_plain(const unsigned char* p, std::size_t bytes) {
  std::uint64_t a = 0, b = 0, c = 0, d = 0;
  std::size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    std::uint64_t w[4];
    std::memcpy(w, p + i, 32);
    a ^= w[0];
    b ^= w[1];
    c ^= w[2];
    d ^= w[3];
  }
  std::uint64_t x = a ^ b ^ c ^ d;
  for (; i < bytes; ++i) x ^= p[i];
  return x;
}

std::uint64_t xor_words(const unsigned char* p, std::size_t bytes) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (tp::stats::kernel_isa_supported(tp::stats::KernelIsa::Avx2)) return xor_words_avx2(p, bytes);
#endif
  return xor_words_plain(p, bytes);
}

// Reads the tensor's bytes once, split over the intra-op threads like the fused kernel.
std::uint64_t read_all(const at::Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.data_ptr());
  const std::int64_t bytes = t.numel() * static_cast<std::int64_t>(t.element_size());
  const std::int64_t pieces = at::get_num_threads();
  std::vector<std::uint64_t> parts(static_cast<std::size_t>(pieces), 0);
  at::parallel_for(0, pieces, 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t k = first; k < last; ++k) {
      const std::int64_t begin = bytes / pieces * k, end = k + 1 == pieces ? bytes : bytes / pieces * (k + 1);
      parts[k] = xor_words(p + begin, static_cast<std::size_t>(end - begin));
    }
  });
  std::uint64_t x = 0;
  for (std::uint64_t v : parts) x ^= v;
  return x;
}

// ---- timing ---------------------------------------------------------------------------------
struct Method {
  std::string name;
  std::function<void()> run;
  double best_ms = 1e300;
};

// Runs every method once per round, `rounds` times, keeping each method's best time.
void measure(std::vector<Method>& methods, int rounds) {
  for (auto& m : methods) m.run();  // warm-up: page faults, thread pool, lazy init
  for (int r = 0; r < rounds; ++r) {
    for (auto& m : methods) {
      const auto start = Clock::now();
      m.run();
      m.best_ms = std::min(m.best_ms, milliseconds_since(start));
    }
  }
}

volatile double g_sink = 0;  // keeps results alive so nothing is optimised away
volatile std::uint64_t g_bits = 0;

double relative_error(double got, double want) { return std::abs(got - want) / std::abs(want); }

struct DtypeCase {
  const char* label;
  at::ScalarType dtype;
};

void statistics_tables(std::int64_t elements, int rounds) {
  const std::vector<DtypeCase> cases = {{"f32", at::kFloat}, {"bf16", at::kBFloat16}, {"f16", at::kHalf}};
  torch::manual_seed(0);
  const at::Tensor source = torch::randn({elements});
  const tp::stats::KernelIsa best = tp::stats::best_kernel_isa();
  std::printf("TorchProbe statistics benchmark\n");
  std::printf("  %lld elements (randn), %d intra-op threads, kernels %s, best of %d interleaved rounds\n\n",
              static_cast<long long>(elements), at::get_num_threads(), tp::stats::kernel_isa_name(best), rounds);

  std::printf("%-5s | %9s %8s %8s | %11s %8s | %9s %9s | %9s %8s | %10s %10s\n", "dtype", "fused ms", "GB/s", "Gelem/s",
              "ATen4 ms", "x ATen4", "sum ms", "vs sum", "read ms", "of read", "mean err", "norm err");
  std::printf("%s\n", std::string(138, '-').c_str());
  for (const DtypeCase& c : cases) {
    const at::Tensor t = source.to(c.dtype);
    const double bytes = static_cast<double>(t.numel()) * static_cast<double>(t.element_size());
    std::vector<Method> methods = {
        {"fused", [&] { g_sink = tp::stats::cpu_stats(t).norm.d; }},
        {"aten4",
         [&] {
           g_sink = t.max().item<double>() + t.min().item<double>() + t.mean().item<double>() + t.norm().item<double>();
         }},
        {"sum", [&] { g_sink = t.sum().item<double>(); }},
        {"read", [&] { g_bits = read_all(t); }},
    };
    // fp16 ATen reductions take over a second each round; fewer rounds keep the run short.
    measure(methods, c.dtype == at::kHalf ? std::max(1, rounds / 2) : rounds);
    const double fused = methods[0].best_ms, aten4 = methods[1].best_ms, sum = methods[2].best_ms,
                 read = methods[3].best_ms;
    const at::Tensor d = t.to(at::kDouble);
    const tp::TensorStats s = tp::stats::cpu_stats(t);
    std::printf("%-5s | %9.2f %8.1f %8.2f | %11.1f %7.1fx | %9.2f %8.2fx | %9.2f %7.0f%% | %10.1e %10.1e\n", c.label,
                fused, bytes / fused / 1e6, static_cast<double>(elements) / fused / 1e6, aten4, aten4 / fused, sum,
                sum / fused, read, 100.0 * read / fused, relative_error(s.mean.d, d.mean().item<double>()),
                relative_error(s.norm.d, d.norm().item<double>()));
  }
  std::printf(
      "\n  x ATen4: ATen's max+min+mean+norm time / fused time.  vs sum: fused throughput / ATen sum's.\n"
      "  of read: fused throughput / a plain read of the same bytes (both on all intra-op threads).\n"
      "  err: |fused - float64| / |float64| for Mean and Norm.\n\n");

  // The same kernels per instruction set, on one thread and on all intra-op threads.
  std::printf("fused kernel by instruction set, ms (GB/s)\n");
  std::printf("%-9s | %-22s %-22s | %-22s %-22s | %-22s %-22s\n", "isa", "f32 1 thread", "f32 all threads",
              "bf16 1 thread", "bf16 all threads", "f16 1 thread", "f16 all threads");
  const int threads = at::get_num_threads();
  std::vector<at::Tensor> tensors;
  for (const DtypeCase& c : cases) tensors.push_back(source.to(c.dtype));
  for (tp::stats::KernelIsa isa :
       {tp::stats::KernelIsa::Avx512, tp::stats::KernelIsa::Avx2, tp::stats::KernelIsa::Portable}) {
    if (!tp::stats::kernel_isa_supported(isa)) continue;
    std::printf("%-9s |", tp::stats::kernel_isa_name(isa));
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      const at::Tensor& t = tensors[k];
      const double bytes = static_cast<double>(t.numel()) * static_cast<double>(t.element_size());
      for (int n : {1, threads}) {
        at::set_num_threads(n);
        std::vector<Method> one = {{"fused", [&] { g_sink = tp::stats::cpu_stats(t, isa).norm.d; }}};
        measure(one, rounds);
        char cell[64];
        std::snprintf(cell, sizeof cell, "%.2f (%.1f)", one[0].best_ms, bytes / one[0].best_ms / 1e6);
        std::printf(" %-22s", cell);
      }
      if (k + 1 < tensors.size()) std::printf(" |");
    }
    std::printf("\n");
  }
  at::set_num_threads(threads);
  std::printf("\n");
}

// ---- capture overhead on a tiny op ----------------------------------------------------------
// ns per at::add of two 16-element tensors: bare, and with a started L1 statistics Debugger
// whose records go nowhere (NullSink). step() every `per_step` calls resolves and drops the
// step's records, as a training loop would; its cost is included, spread over the calls.
double ns_per_add(const at::Tensor& a, const at::Tensor& b, std::int64_t calls, const std::function<void()>& every_step,
                  std::int64_t per_step) {
  const auto start = Clock::now();
  for (std::int64_t k = 0; k < calls; ++k) {
    at::Tensor c = at::add(a, b);
    g_sink = static_cast<double>(c.numel());
    if (every_step && (k + 1) % per_step == 0) every_step();
  }
  return milliseconds_since(start) * 1e6 / static_cast<double>(calls);
}

void tiny_op_overhead(std::int64_t calls, int rounds) {
  const at::Tensor a = torch::randn({16}), b = torch::randn({16});
  constexpr std::int64_t kCallsPerStep = 1000;
  double bare = 1e300, probed = 1e300, without_stack = 1e300, stats_only = 1e300;
  // NullSink writes nothing; the dump path only has to be somewhere harmless.
  const std::string dump_path = (std::filesystem::temp_directory_path() / "torchprobe_stats_benchmark").string();
  tp::Debugger<tp::Level::L1, tp::Task::Statistics, tp::NullSink> dbg(tp::Options().dump_path(dump_path));
  tp::Debugger<tp::Level::L1, tp::Task::Statistics, tp::NullSink> no_stack(
      tp::Options().dump_path(dump_path).extra_info(false));
  auto probed_run = [&](auto& d) {
    d.start();
    const double ns = ns_per_add(
        a, b, calls, [&] { d.step(); }, kCallsPerStep);
    d.stop();
    return ns;
  };
  for (int r = 0; r < rounds + 1; ++r) {  // the first round warms up
    const double plain = ns_per_add(a, b, calls, nullptr, kCallsPerStep);
    const double with_probe = probed_run(dbg);
    const double with_probe_no_stack = probed_run(no_stack);
    const auto start = Clock::now();
    for (std::int64_t k = 0; k < calls; ++k) g_sink = tp::stats::cpu_stats(a).norm.d;
    const double direct = milliseconds_since(start) * 1e6 / static_cast<double>(calls);
    if (r == 0) continue;
    bare = std::min(bare, plain);
    probed = std::min(probed, with_probe);
    without_stack = std::min(without_stack, with_probe_no_stack);
    stats_only = std::min(stats_only, direct);
  }
  std::printf("capture overhead on a tiny op: at::add of two 16-element float32 tensors, %lld calls, best of %d\n",
              static_cast<long long>(calls), rounds);
  std::printf("  without the probe                                        %8.0f ns/op\n", bare);
  std::printf(
      "  with Debugger<L1, Statistics, NullSink> started          %8.0f ns/op  (+%.0f ns/op, step() every %lld ops)\n",
      probed, probed - bare, static_cast<long long>(kCallsPerStep));
  std::printf("  the same with extra_info false (no call stacks)          %8.0f ns/op  (+%.0f ns/op)\n", without_stack,
              without_stack - bare);
  std::printf("  of which statistics: cpu_stats on one 16-element tensor  %8.1f ns/call (3 tensors per op)\n",
              stats_only);
}

std::int64_t parse_count(const char* text) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || v <= 0) {
    std::fprintf(stderr, "not a positive count: %s\n", text);
    std::exit(2);
  }
  return v;
}

}  // namespace

TORCHPROBE_BENCHMARK(stats) {
  const bool quick = tpbench::quick_mode();
  std::int64_t elements = quick ? std::int64_t(64) << 10 : std::int64_t(64) << 20;
  int rounds = quick ? 1 : 5;
  std::int64_t tiny_calls = quick ? 2000 : 200000;
  const int default_threads = at::get_num_threads();
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int k = 1; k + 1 < argc; k += 2) {
    if (std::strcmp(argv[k], "--elements") == 0)
      elements = parse_count(argv[k + 1]);
    else if (std::strcmp(argv[k], "--reps") == 0)
      rounds = static_cast<int>(parse_count(argv[k + 1]));
    else if (std::strcmp(argv[k], "--tiny-calls") == 0)
      tiny_calls = parse_count(argv[k + 1]);
    else if (std::strcmp(argv[k], "--threads") == 0)
      threads = static_cast<int>(parse_count(argv[k + 1]));
    else {
      std::fprintf(stderr, "usage: torchprobe_benchmarks %s [--elements N] [--reps R] [--tiny-calls C] [--threads T]\n",
                   argv[0]);
      return 2;
    }
  }
  at::set_num_threads(threads);
  std::printf("(libtorch's default intra-op thread count here: %d; this run: %d)\n", default_threads,
              at::get_num_threads());
  statistics_tables(elements, rounds);
  tiny_op_overhead(tiny_calls, rounds);
  return 0;
}

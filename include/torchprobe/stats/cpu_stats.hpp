#pragma once
// Statistics of a CPU tensor in one pass over its memory, with fused SIMD kernels.
//
// Contract: Max/Min exact in the tensor's dtype (int64 included); Mean/Norm accumulated in double
// lanes, so fp16/bf16 never round in their own precision; a NaN anywhere makes all four NaN;
// +-inf behave as in torch (inf and -inf together: Mean NaN; Norm inf); bool gives any/all and
// null Mean/Norm; complex gives the statistics of |z| with Norm = sqrt(sum |z|^2); a 0-d tensor
// shows its value in all four; empty tensors and dtypes without a kernel give nulls.
//
// Kernels (stats/kernels/): AVX-512 and AVX2 versions chosen at run time on x86-64 with GCC or
// Clang, xsimd for the architecture of the build elsewhere. Strided tensors are walked in place
// (stats/layout.hpp); tensors of at least kParallelBytes are split over at::parallel_for.
// docs/statistics.md explains the choices and gives the measurements.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "torchprobe/stats/kernels/dispatch.hpp"
#include "torchprobe/stats/layout.hpp"
#include "torchprobe/core/tensor_stats.hpp"
#include "torchprobe/core/probe_guard.hpp"

namespace torchprobe::stats {
namespace details {

// Below this many bytes a tensor is scanned on the calling thread: waking a second thread costs
// a few microseconds, about what one core needs to read 64 KiB.
inline constexpr std::int64_t kParallelBytes = std::int64_t(1) << 18;
// Strided runs shorter than this are gathered into a buffer before a kernel sees them, so the
// kernel's per-call cost (horizontal reductions, scalar tail) is paid per buffer, not per row.
inline constexpr std::int64_t kDirectRunElements = 1024;
inline constexpr std::size_t kGatherBytes = 16384;

// Feeds runs to a kernel: long contiguous runs directly, everything else through a small buffer.
template <class T, class Result, class Scan>
class RunScanner {
 public:
  explicit RunScanner(Scan scan, std::int64_t run_stride) : scan_(scan), stride_(run_stride) {}

  void add(const char* first, std::int64_t count) {
    const T* p = reinterpret_cast<const T*>(first);
    if (stride_ == 1 && count >= kDirectRunElements) {
      merge(scan_(p, count));
      return;
    }
    while (count > 0) {
      const std::int64_t take = std::min(count, kCapacity - filled_);
      T* to = buffer() + filled_;
      if (stride_ == 1) {
        std::memcpy(to, p, static_cast<std::size_t>(take) * sizeof(T));
      } else {
        for (std::int64_t k = 0; k < take; ++k) std::memcpy(to + k, p + k * stride_, sizeof(T));
      }
      filled_ += take;
      p += take * stride_;
      count -= take;
      if (filled_ == kCapacity) flush();
    }
  }

  Result finish() {
    flush();
    return result_;
  }

 private:
  static constexpr std::int64_t kCapacity = static_cast<std::int64_t>(kGatherBytes / sizeof(T));

  // Raw bytes, not T[]: c10::complex zero-initialises, which would cost a memset per scanner.
  T* buffer() { return reinterpret_cast<T*>(storage_); }
  void flush() {
    if (filled_ > 0) merge(scan_(buffer(), filled_));
    filled_ = 0;
  }
  void merge(const Result& part) { kernels::merge(result_, part); }

  Scan scan_;
  std::int64_t stride_;
  Result result_;
  std::int64_t filled_ = 0;
  alignas(64) unsigned char storage_[kGatherBytes];
};

// Scans elements [begin, end) of the walk.
template <class T, class Result, class Scan>
Result scan_range(const StridedRuns& runs, std::int64_t begin, std::int64_t end, Scan scan) {
  if (runs.dense()) return scan(reinterpret_cast<const T*>(runs.base) + begin, end - begin);
  RunScanner<T, Result, Scan> scanner(scan, runs.run_stride);
  for_each_run(runs, begin, end, [&](const char* first, std::int64_t count) {
    scanner.add(first, count);
    return true;
  });
  return scanner.finish();
}

// Scans the whole walk: on this thread when small, else in one piece per intra-op thread,
// merged in piece order (so a given thread count always gives the same rounding).
template <class T, class Result, class Scan>
Result scan_all(const StridedRuns& runs, Scan scan) {
  const std::int64_t total = runs.elements();
  const std::int64_t grain = std::max<std::int64_t>(1, kParallelBytes / runs.element_size);
  if (total < 2 * grain || at::in_parallel_region()) return scan_range<T, Result>(runs, 0, total, scan);
  const std::int64_t pieces = std::min<std::int64_t>(at::get_num_threads(), total / grain);
  if (pieces <= 1) return scan_range<T, Result>(runs, 0, total, scan);
  std::vector<Result> parts(static_cast<std::size_t>(pieces));
  at::parallel_for(0, pieces, 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t k = first; k < last; ++k)
      parts[k] = scan_range<T, Result>(runs, total / pieces * k + std::min(k, total % pieces),
                                       total / pieces * (k + 1) + std::min(k + 1, total % pieces), scan);
  });
  Result r = parts[0];
  for (std::size_t k = 1; k < parts.size(); ++k) kernels::merge(r, parts[k]);
  return r;
}

// Mean and Norm from the sums, with torch's rules for NaN and infinities: NaN anywhere makes all
// four NaN; +inf and -inf together make the mean NaN; any infinity makes the norm inf.
// `elements` is the tensor's element count; each walked element stands for `repeat` of them.
inline TensorStats finish(const kernels::ScanResult& r, std::int64_t elements, std::int64_t repeat, bool integral) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  if (std::isnan(r.sumsq)) {
    const StatValue nan = StatValue::real(std::numeric_limits<double>::quiet_NaN());
    return {nan, nan, nan, nan};
  }
  TensorStats s;
  if (integral) {
    s.max = StatValue::integer(static_cast<std::int64_t>(r.max));
    s.min = StatValue::integer(static_cast<std::int64_t>(r.min));
  } else {
    s.max = StatValue::real(r.max);
    s.min = StatValue::real(r.min);
  }
  if (r.max == inf || r.min == -inf) {
    s.mean = StatValue::real(r.max == inf && r.min == -inf ? std::numeric_limits<double>::quiet_NaN()
                                                           : (r.max == inf ? inf : -inf));
    s.norm = StatValue::real(inf);
  } else {
    // Each walked element stands for `repeat` elements: the mean is unchanged, sums scale.
    s.mean = StatValue::real(r.sum / static_cast<double>(elements));
    s.norm = StatValue::real(std::sqrt(r.sumsq * static_cast<double>(repeat)));
  }
  return s;
}

inline TensorStats finish(const kernels::ScanResult& r, const StridedRuns& runs, bool integral) {
  return finish(r, runs.elements(), runs.repeat, integral);
}

template <class T>
TensorStats real_stats(const StridedRuns& runs, KernelIsa isa) {
  const kernels::ScanFunction<T> scan = kernels::scan_function<T>(isa);
  const kernels::ScanResult r = scan_all<T, kernels::ScanResult>(runs, scan);
  return finish(r, runs, std::is_integral_v<T>);
}

inline TensorStats int64_stats(const StridedRuns& runs, KernelIsa isa) {
  const kernels::IntScanResult r =
      scan_all<std::int64_t, kernels::IntScanResult>(runs, kernels::int64_scan_function(isa));
  TensorStats s;
  s.max = StatValue::integer(r.max);
  s.min = StatValue::integer(r.min);
  s.mean = StatValue::real(r.sum / static_cast<double>(runs.elements()));
  s.norm = StatValue::real(std::sqrt(r.sumsq * static_cast<double>(runs.repeat)));
  return s;
}

// bool: the bytes are 0 or 1, so the uint8 kernel's Max is any() and its Min is all().
inline TensorStats bool_stats(const StridedRuns& runs, KernelIsa isa) {
  const kernels::ScanResult r =
      scan_all<std::uint8_t, kernels::ScanResult>(runs, kernels::scan_function<std::uint8_t>(isa));
  return {StatValue::boolean(r.max != 0.0), StatValue::boolean(r.min != 0.0), StatValue::null(), StatValue::null()};
}

// Tiny contiguous tensors (most arguments of small ops) skip the layout walk and the kernel's
// setup and horizontal reductions, which cost more than the arithmetic below kTinyElements: a
// plain loop, four partial sums in double, the same rules through finish(). Half is left to the
// kernels: its scalar conversion costs more than their in-register one.
inline constexpr std::int64_t kTinyElements = 64;

template <class T>
TensorStats tiny_real_stats(const T* p, std::int64_t n) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  // Four independent lanes, so that no add or compare waits for the one before it.
  double mx[4] = {-inf, -inf, -inf, -inf}, mn[4] = {inf, inf, inf, inf};
  double sum[4] = {0, 0, 0, 0}, sumsq[4] = {0, 0, 0, 0};
  std::int64_t k = 0;
  auto take = [&](int lane, double v) {
    mx[lane] = v > mx[lane] ? v : mx[lane];  // NaN is caught through sumsq by finish()
    mn[lane] = v < mn[lane] ? v : mn[lane];
    sum[lane] += v;
    sumsq[lane] += v * v;
  };
  for (; k + 4 <= n; k += 4)
    for (int lane = 0; lane < 4; ++lane) take(lane, static_cast<double>(p[k + lane]));
  for (int lane = 0; k < n; ++k, ++lane) take(lane, static_cast<double>(p[k]));
  kernels::ScanResult r;
  r.max = std::max(std::max(mx[0], mx[1]), std::max(mx[2], mx[3]));
  r.min = std::min(std::min(mn[0], mn[1]), std::min(mn[2], mn[3]));
  r.sum = (sum[0] + sum[1]) + (sum[2] + sum[3]);
  r.sumsq = (sumsq[0] + sumsq[1]) + (sumsq[2] + sumsq[3]);
  return finish(r, n, 1, std::is_integral_v<T>);
}

// The statistics of a tiny contiguous tensor, or nullopt when the kernels should take it.
inline std::optional<TensorStats> tiny_stats(const at::Tensor& t) {
  const std::int64_t n = t.numel();
  if (n > kTinyElements || !t.is_contiguous()) return std::nullopt;
  const void* data = t.data_ptr();
  switch (t.scalar_type()) {
    case at::kFloat: return tiny_real_stats(static_cast<const float*>(data), n);
    case at::kDouble: return tiny_real_stats(static_cast<const double*>(data), n);
    case at::kBFloat16: return tiny_real_stats(static_cast<const c10::BFloat16*>(data), n);
    case at::kByte: return tiny_real_stats(static_cast<const std::uint8_t*>(data), n);
    case at::kChar: return tiny_real_stats(static_cast<const std::int8_t*>(data), n);
    case at::kShort: return tiny_real_stats(static_cast<const std::int16_t*>(data), n);
    case at::kInt: return tiny_real_stats(static_cast<const std::int32_t*>(data), n);
    default: return std::nullopt;
  }
}

// msprobe's 0-d rule: the value itself in all four keys (Norm keeps its sign). bool keeps its
// own rule (any/all, null Mean/Norm), as msprobe checks bool first.
inline TensorStats zero_dim_rule(TensorStats s) {
  if (s.max.kind == StatValue::Kind::Bool) return s;
  s.mean = s.norm = StatValue::real(s.max.as_double());
  return s;
}

}  // namespace details

// Dtypes the probe can summarise; others (quantized, float8, ...) get null statistics.
inline bool has_cpu_kernel(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kByte:
    case at::kChar:
    case at::kShort:
    case at::kInt:
    case at::kLong:
    case at::kBool:
    case at::kComplexFloat:
    case at::kComplexDouble: return true;
    default: return false;
  }
}

namespace details {

// Whether cpu_stats can look at `tensor` at all; nulls otherwise.
inline bool summarizable_on_cpu(const at::Tensor& tensor) {
  return tensor.defined() && tensor.layout() == at::kStrided && !tensor.is_nested() && tensor.has_storage() &&
         tensor.device().is_cpu() && has_cpu_kernel(tensor.scalar_type()) && tensor.numel() != 0;
}

inline TensorStats kernel_stats(const at::Tensor& tensor, KernelIsa isa) {
  const StridedRuns runs = order_free_runs(tensor);
  switch (tensor.scalar_type()) {
    case at::kFloat: return real_stats<float>(runs, isa);
    case at::kDouble: return real_stats<double>(runs, isa);
    case at::kHalf: return real_stats<c10::Half>(runs, isa);
    case at::kBFloat16: return real_stats<c10::BFloat16>(runs, isa);
    case at::kByte: return real_stats<std::uint8_t>(runs, isa);
    case at::kChar: return real_stats<std::int8_t>(runs, isa);
    case at::kShort: return real_stats<std::int16_t>(runs, isa);
    case at::kInt: return real_stats<std::int32_t>(runs, isa);
    case at::kLong: return int64_stats(runs, isa);
    case at::kBool: return bool_stats(runs, isa);
    case at::kComplexFloat: return real_stats<c10::complex<float>>(runs, isa);
    case at::kComplexDouble: return real_stats<c10::complex<double>>(runs, isa);
    default: return {};
  }
}

inline TensorStats cpu_stats(const at::Tensor& tensor, KernelIsa isa, bool tiny_path) {
  if (!summarizable_on_cpu(tensor)) return {};
  if (tensor.is_neg()) {  // a lazily negated view: its memory holds the values' negations
    ProbeGuard guard;
    return cpu_stats(tensor.resolve_neg(), isa, tiny_path);
  }
  std::optional<TensorStats> tiny = tiny_path ? tiny_stats(tensor) : std::nullopt;
  const TensorStats s = tiny ? *tiny : kernel_stats(tensor, isa);
  return tensor.dim() == 0 ? zero_dim_rule(s) : s;
}

}  // namespace details

// Statistics of a CPU tensor of any layout, with the kernels of `isa` (which must be supported:
// see kernel_isa_supported), whatever its size. Tests and benchmarks use it to compare
// instruction sets.
inline TensorStats cpu_stats(const at::Tensor& tensor, KernelIsa isa) { return details::cpu_stats(tensor, isa, false); }

// Statistics of a CPU tensor of any layout: the best kernels this CPU runs, and a plain loop for
// tiny contiguous tensors (details::tiny_stats).
inline TensorStats cpu_stats(const at::Tensor& tensor) { return details::cpu_stats(tensor, best_kernel_isa(), true); }

}  // namespace torchprobe::stats

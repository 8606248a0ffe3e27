#pragma once
// The portable kernels: xsimd batches of the architecture the including translation unit was
// compiled for (xsimd::default_arch: SSE2 for a plain x86-64 build, AVX2 with -mavx2, NEON on
// arm64). They run wherever the runtime-dispatched x86 kernels cannot: other CPUs, other
// compilers, old x86. fp16/bf16 and integers are converted to float/double in small chunks with
// scalar code first, which is correct everywhere but slow for fp16 (docs/statistics.md).
//
// Written against the xsimd API common to 8.1 and 13: no hadd/reduce_* (horizontal reductions
// go through a store), no available_architectures().best.
#include "torchprobe/stats/kernels/common.hpp"

#include <xsimd/xsimd.hpp>

#include <type_traits>

TORCHPROBE_KERNELS_BEGIN

namespace torchprobe::stats::kernels::portable {

#if !defined(XSIMD_NO_SUPPORTED_ARCHITECTURE)

template <class Batch>
inline void fold_into(const Batch& mx, const Batch& mn, ScanResult& r) {
  alignas(64) typename Batch::value_type lanes[Batch::size];
  mx.store_unaligned(lanes);
  for (std::size_t k = 0; k < Batch::size; ++k) r.max = lanes[k] > r.max ? lanes[k] : r.max;
  mn.store_unaligned(lanes);
  for (std::size_t k = 0; k < Batch::size; ++k) r.min = lanes[k] < r.min ? lanes[k] : r.min;
}

inline double lane_sum(const xsimd::batch<double>& v) {
  alignas(64) double lanes[xsimd::batch<double>::size];
  v.store_unaligned(lanes);
  double s = 0.0;
  for (double x : lanes) s += x;
  return s;
}

// float or double elements: Max/Min in their own lanes, sums in double lanes (a float source is
// widened by xsimd's converting load).
template <class T>
inline ScanResult scan_native(const T* p, std::int64_t n) {
  using Values = xsimd::batch<T>;
  using Sums = xsimd::batch<double>;
  constexpr std::int64_t width = Values::size, sum_width = Sums::size;
  static_assert(std::is_same_v<T, double> || width == 2 * sum_width, "float lanes pair up into double lanes");
  Values mx(-std::numeric_limits<T>::infinity()), mn(std::numeric_limits<T>::infinity());
  Sums s0(0.0), s1(0.0), q0(0.0), q1(0.0);
  std::int64_t i = 0;
  for (; i + width <= n; i += width) {
    prefetch_ahead<width * sizeof(T)>(p + i);
    const Values v = Values::load_unaligned(p + i);
    mx = xsimd::max(mx, v);
    mn = xsimd::min(mn, v);
    if constexpr (std::is_same_v<T, double>) {
      s0 += v;
      q0 = xsimd::fma(v, v, q0);
    } else {
      for (std::int64_t j = 0; j < width; j += 2 * sum_width) {  // float lanes are twice as many
        const Sums a = Sums::load_unaligned(p + i + j), b = Sums::load_unaligned(p + i + j + sum_width);
        s0 += a;
        s1 += b;
        q0 = xsimd::fma(a, a, q0);
        q1 = xsimd::fma(b, b, q1);
      }
    }
  }
  ScanResult r;
  fold_into(mx, mn, r);
  r.sum = lane_sum(s0 + s1);
  r.sumsq = lane_sum(q0 + q1);
  scan_scalar_into(p + i, n - i, r);
  return r;
}

// Other element types are widened chunk by chunk into a small buffer of T's exact wide type.
template <class T>
inline ScanResult scan(const T* p, std::int64_t n) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return scan_native(p, n);
  } else if constexpr (std::is_same_v<T, c10::complex<float>>) {
    return scan_scalar(p, n);
  } else {
    using Wide = std::conditional_t<std::is_integral_v<T>, double, float>;
    constexpr std::int64_t kChunk = 1024;
    alignas(64) Wide buffer[kChunk];
    ScanResult r;
    for (std::int64_t i = 0; i < n; i += kChunk) {
      const std::int64_t count = n - i < kChunk ? n - i : kChunk;
      for (std::int64_t k = 0; k < count; ++k) buffer[k] = static_cast<Wide>(p[i + k]);
      merge(r, scan_native(buffer, count));
    }
    return r;
  }
}

#else  // xsimd knows no SIMD architecture for this target: plain loops

template <class T>
inline ScanResult scan(const T* p, std::int64_t n) {
  return scan_scalar(p, n);
}

#endif

}  // namespace torchprobe::stats::kernels::portable

TORCHPROBE_KERNELS_END

#pragma once
// AVX-512 kernels (F, BW, DQ, VL, with FMA and F16C). Every function here carries a target
// attribute instead of relying on -mavx512f, so a default x86-64 build contains them and
// kernels/dispatch.hpp calls them only on a CPU that has them. xsimd cannot serve here: its
// batch types refuse any architecture the translation unit's flags do not enable.
#include "torchprobe/stats/kernels/common.hpp"

#if TORCHPROBE_STATS_X86_KERNELS
#include <immintrin.h>

#include <type_traits>

#define TORCHPROBE_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
#define TORCHPROBE_AVX512_INLINE TORCHPROBE_AVX512_TARGET __attribute__((always_inline)) inline

TORCHPROBE_KERNELS_BEGIN

namespace torchprobe::stats::kernels::avx512 {

using Floats = __m512;    // 16 float lanes: Max/Min of the fp32, fp16 and bf16 elements
using Doubles = __m512d;  // 8 double lanes: every Sum, and Max/Min of wider elements

// ---- lane operations, overloaded for the two vector types ---------------------------------------
TORCHPROBE_AVX512_INLINE Floats vmax(Floats a, Floats b) { return _mm512_max_ps(a, b); }
TORCHPROBE_AVX512_INLINE Floats vmin(Floats a, Floats b) { return _mm512_min_ps(a, b); }
TORCHPROBE_AVX512_INLINE double reduce_max(Floats v) { return _mm512_reduce_max_ps(v); }
TORCHPROBE_AVX512_INLINE double reduce_min(Floats v) { return _mm512_reduce_min_ps(v); }
TORCHPROBE_AVX512_INLINE Doubles low_half(Floats v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
TORCHPROBE_AVX512_INLINE Doubles high_half(Floats v) { return _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)); }

TORCHPROBE_AVX512_INLINE Doubles vmax(Doubles a, Doubles b) { return _mm512_max_pd(a, b); }
TORCHPROBE_AVX512_INLINE Doubles vmin(Doubles a, Doubles b) { return _mm512_min_pd(a, b); }
TORCHPROBE_AVX512_INLINE Doubles vadd(Doubles a, Doubles b) { return _mm512_add_pd(a, b); }
TORCHPROBE_AVX512_INLINE Doubles vfma(Doubles a, Doubles b, Doubles c) { return _mm512_fmadd_pd(a, b, c); }
TORCHPROBE_AVX512_INLINE double reduce_max(Doubles v) { return _mm512_reduce_max_pd(v); }
TORCHPROBE_AVX512_INLINE double reduce_min(Doubles v) { return _mm512_reduce_min_pd(v); }
TORCHPROBE_AVX512_INLINE double reduce_add(Doubles v) { return _mm512_reduce_add_pd(v); }

TORCHPROBE_AVX512_INLINE Floats splat_floats(float x) { return _mm512_set1_ps(x); }
TORCHPROBE_AVX512_INLINE Doubles splat_doubles(double x) { return _mm512_set1_pd(x); }
TORCHPROBE_AVX512_INLINE Doubles zeros() { return _mm512_setzero_pd(); }

// Sum and Sum of squares of 16 float lanes, widened to double before adding.
TORCHPROBE_AVX512_INLINE void accumulate(Floats v, Doubles& s_lo, Doubles& s_hi, Doubles& q_lo, Doubles& q_hi) {
  const Doubles lo = low_half(v), hi = high_half(v);
  s_lo = vadd(s_lo, lo);
  s_hi = vadd(s_hi, hi);
  q_lo = vfma(lo, lo, q_lo);
  q_hi = vfma(hi, hi, q_hi);
}

// ---- loaders: kStep elements into one vector -----------------------------------------------------
// kLaneWeight: each element fills 1/kLaneWeight lanes (complex |z| sits in both lanes of a pair).
template <class T>
struct Loader;

template <>
struct Loader<float> {
  using Vec = Floats;
  static constexpr bool kFloatLanes = true;
  static constexpr int kStep = 16;
  static constexpr double kLaneWeight = 1.0;
  TORCHPROBE_AVX512_INLINE static Vec load(const float* p) { return _mm512_loadu_ps(p); }
};

template <>
struct Loader<c10::Half> {
  using Vec = Floats;
  static constexpr bool kFloatLanes = true;
  static constexpr int kStep = 16;
  static constexpr double kLaneWeight = 1.0;
  TORCHPROBE_AVX512_INLINE static Vec load(const c10::Half* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
};

template <>
struct Loader<c10::BFloat16> {
  using Vec = Floats;
  static constexpr bool kFloatLanes = true;
  static constexpr int kStep = 16;
  static constexpr double kLaneWeight = 1.0;
  // bf16 is the upper half of a float: widen to 32 bits and shift into place.
  TORCHPROBE_AVX512_INLINE static Vec load(const c10::BFloat16* p) {
    const __m512i bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
  }
};

template <>
struct Loader<double> {
  using Vec = Doubles;
  static constexpr bool kFloatLanes = false;
  static constexpr int kStep = 8;
  static constexpr double kLaneWeight = 1.0;
  TORCHPROBE_AVX512_INLINE static Vec load(const double* p) { return _mm512_loadu_pd(p); }
};

// Integers up to 32 bits are exact in double lanes, squares of int8/int16 too.
template <>
struct Loader<std::int8_t> {
  using Vec = Doubles;
  static constexpr bool kFloatLanes = false;
  static constexpr int kStep = 8;
  static constexpr double kLaneWeight = 1.0;
  TORCHPROBE_AVX512_INLINE static Vec load(const std::int8_t* p) {
    return _mm512_cvtepi32_pd(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
};

template <>
struct Loader<std::uint8_t> {
  using Vec = Doubles;
  static constexpr bool kFloatLanes = false;
  static constexpr int kStep = 8;
  static constexpr double kLaneWeight = 1.0;
  TORCHPROBE_AVX512_INLINE static Vec load(const std::uint8_t* p) {
    return _mm512_cvtepi32_pd(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
};

template <>
struct Loader<std::int16_t> {
  using Vec = Doubles;
  static constexpr bool kFloatLanes = false;
  static constexpr int kStep = 8;
  static constexpr double kLaneWeight = 1.0;
  TORCHPROBE_AVX512_INLINE static Vec load(const std::int16_t* p) {
    return _mm512_cvtepi32_pd(_mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
};

template <>
struct Loader<std::int32_t> {
  using Vec = Doubles;
  static constexpr bool kFloatLanes = false;
  static constexpr int kStep = 8;
  static constexpr double kLaneWeight = 1.0;
  TORCHPROBE_AVX512_INLINE static Vec load(const std::int32_t* p) {
    return _mm512_cvtepi32_pd(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
};

// Four complex<float> -> |z| of each, twice: re,im are widened to double (squares exact, no
// overflow), each pair's squares are added to both lanes of the pair, then sqrt.
template <>
struct Loader<c10::complex<float>> {
  using Vec = Doubles;
  static constexpr bool kFloatLanes = false;
  static constexpr int kStep = 4;
  static constexpr double kLaneWeight = 0.5;
  TORCHPROBE_AVX512_INLINE static Vec load(const c10::complex<float>* p) {
    const Doubles parts = _mm512_cvtps_pd(_mm256_loadu_ps(reinterpret_cast<const float*>(p)));
    const Doubles squares = _mm512_mul_pd(parts, parts);
    return _mm512_sqrt_pd(_mm512_add_pd(squares, _mm512_permute_pd(squares, 0x55)));
  }
};

// ---- the fused one-pass scans --------------------------------------------------------------------

// fp32/fp16/bf16: Max/Min in float lanes (exact: every such value is a float), sums in double.
template <class T>
TORCHPROBE_AVX512_TARGET ScanResult scan_float_lanes(const T* p, std::int64_t n) {
  using L = Loader<T>;
  constexpr std::int64_t step = L::kStep;
  Floats mx0 = splat_floats(-INFINITY), mx1 = mx0;
  Floats mn0 = splat_floats(INFINITY), mn1 = mn0;
  Doubles s0 = zeros(), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;
  std::int64_t i = 0;
  for (; i + 4 * step <= n; i += 4 * step) {
    prefetch_ahead<4 * step * sizeof(T)>(p + i);
    const Floats a = L::load(p + i), b = L::load(p + i + step);
    const Floats c = L::load(p + i + 2 * step), d = L::load(p + i + 3 * step);
    mx0 = vmax(mx0, vmax(a, b));
    mx1 = vmax(mx1, vmax(c, d));
    mn0 = vmin(mn0, vmin(a, b));
    mn1 = vmin(mn1, vmin(c, d));
    accumulate(a, s0, s1, q0, q1);
    accumulate(b, s2, s3, q2, q3);
    accumulate(c, s0, s1, q0, q1);
    accumulate(d, s2, s3, q2, q3);
  }
  for (; i + step <= n; i += step) {
    const Floats a = L::load(p + i);
    mx0 = vmax(mx0, a);
    mn0 = vmin(mn0, a);
    accumulate(a, s0, s1, q0, q1);
  }
  ScanResult r;
  r.max = reduce_max(vmax(mx0, mx1));
  r.min = reduce_min(vmin(mn0, mn1));
  r.sum = reduce_add(vadd(vadd(s0, s1), vadd(s2, s3)));
  r.sumsq = reduce_add(vadd(vadd(q0, q1), vadd(q2, q3)));
  scan_scalar_into(p + i, n - i, r);
  return r;
}

// f64, integers up to 32 bits, complex<float>: everything in double lanes.
template <class T>
TORCHPROBE_AVX512_TARGET ScanResult scan_double_lanes(const T* p, std::int64_t n) {
  using L = Loader<T>;
  constexpr std::int64_t step = L::kStep;
  Doubles mx0 = splat_doubles(-INFINITY), mx1 = mx0;
  Doubles mn0 = splat_doubles(INFINITY), mn1 = mn0;
  Doubles s0 = zeros(), s1 = s0, q0 = s0, q1 = s0;
  std::int64_t i = 0;
  for (; i + 4 * step <= n; i += 4 * step) {
    prefetch_ahead<4 * step * sizeof(T)>(p + i);
    const Doubles a = L::load(p + i), b = L::load(p + i + step);
    const Doubles c = L::load(p + i + 2 * step), d = L::load(p + i + 3 * step);
    mx0 = vmax(mx0, vmax(a, b));
    mx1 = vmax(mx1, vmax(c, d));
    mn0 = vmin(mn0, vmin(a, b));
    mn1 = vmin(mn1, vmin(c, d));
    s0 = vadd(s0, vadd(a, b));
    s1 = vadd(s1, vadd(c, d));
    q0 = vfma(a, a, q0);
    q1 = vfma(b, b, q1);
    q0 = vfma(c, c, q0);
    q1 = vfma(d, d, q1);
  }
  for (; i + step <= n; i += step) {
    const Doubles a = L::load(p + i);
    mx0 = vmax(mx0, a);
    mn0 = vmin(mn0, a);
    s0 = vadd(s0, a);
    q0 = vfma(a, a, q0);
  }
  ScanResult r;
  r.max = reduce_max(vmax(mx0, mx1));
  r.min = reduce_min(vmin(mn0, mn1));
  r.sum = reduce_add(vadd(s0, s1)) * L::kLaneWeight;
  r.sumsq = reduce_add(vadd(q0, q1)) * L::kLaneWeight;
  scan_scalar_into(p + i, n - i, r);
  return r;
}

template <class T>
ScanResult scan(const T* p, std::int64_t n) {
  if constexpr (Loader<T>::kFloatLanes)
    return scan_float_lanes(p, n);
  else
    return scan_double_lanes(p, n);
}

// int64: Max/Min exact in 64-bit integer lanes, sums in double lanes.
TORCHPROBE_AVX512_TARGET inline IntScanResult scan_int64(const std::int64_t* p, std::int64_t n) {
  __m512i mx = _mm512_set1_epi64(std::numeric_limits<std::int64_t>::min());
  __m512i mn = _mm512_set1_epi64(std::numeric_limits<std::int64_t>::max());
  Doubles s0 = zeros(), s1 = s0, q0 = s0, q1 = s0;
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    prefetch_ahead<16 * sizeof(std::int64_t)>(p + i);
    const __m512i a = _mm512_loadu_si512(p + i), b = _mm512_loadu_si512(p + i + 8);
    mx = _mm512_max_epi64(mx, _mm512_max_epi64(a, b));
    mn = _mm512_min_epi64(mn, _mm512_min_epi64(a, b));
    const Doubles da = _mm512_cvtepi64_pd(a), db = _mm512_cvtepi64_pd(b);
    s0 = vadd(s0, da);
    s1 = vadd(s1, db);
    q0 = vfma(da, da, q0);
    q1 = vfma(db, db, q1);
  }
  IntScanResult r;
  r.max = _mm512_reduce_max_epi64(mx);
  r.min = _mm512_reduce_min_epi64(mn);
  r.sum = reduce_add(vadd(s0, s1));
  r.sumsq = reduce_add(vadd(q0, q1));
  scan_int64_scalar_into(p + i, n - i, r);
  return r;
}

}  // namespace torchprobe::stats::kernels::avx512

TORCHPROBE_KERNELS_END

#endif  // TORCHPROBE_STATS_X86_KERNELS

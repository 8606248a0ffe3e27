#pragma once
// AVX2 kernels (with FMA and F16C), for x86-64 CPUs without AVX-512. Same design as
// x86_avx512.hpp: target attributes, chosen at run time by kernels/dispatch.hpp. With 16 vector
// registers the loops keep one Max and one Min accumulator and unroll by two, so nothing spills.
#include "torchprobe/stats/kernels/common.hpp"

#if TORCHPROBE_STATS_X86_KERNELS
#include <immintrin.h>

#include <type_traits>

#define TORCHPROBE_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define TORCHPROBE_AVX2_INLINE TORCHPROBE_AVX2_TARGET __attribute__((always_inline)) inline

TORCHPROBE_KERNELS_BEGIN

namespace torchprobe::stats::kernels::avx2 {

using Floats = __m256;    // 8 float lanes
using Doubles = __m256d;  // 4 double lanes

TORCHPROBE_AVX2_INLINE Floats vmax(Floats a, Floats b) { return _mm256_max_ps(a, b); }
TORCHPROBE_AVX2_INLINE Floats vmin(Floats a, Floats b) { return _mm256_min_ps(a, b); }
TORCHPROBE_AVX2_INLINE Doubles low_half(Floats v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
TORCHPROBE_AVX2_INLINE Doubles high_half(Floats v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
TORCHPROBE_AVX2_INLINE double reduce_max(Floats v) {
  const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
}
TORCHPROBE_AVX2_INLINE double reduce_min(Floats v) {
  const __m128 m4 = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 m2 = _mm_min_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_min_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
}

TORCHPROBE_AVX2_INLINE Doubles vmax(Doubles a, Doubles b) { return _mm256_max_pd(a, b); }
TORCHPROBE_AVX2_INLINE Doubles vmin(Doubles a, Doubles b) { return _mm256_min_pd(a, b); }
TORCHPROBE_AVX2_INLINE Doubles vadd(Doubles a, Doubles b) { return _mm256_add_pd(a, b); }
TORCHPROBE_AVX2_INLINE Doubles vfma(Doubles a, Doubles b, Doubles c) { return _mm256_fmadd_pd(a, b, c); }
TORCHPROBE_AVX2_INLINE double reduce_max(Doubles v) {
  const __m128d m2 = _mm_max_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_max_sd(m2, _mm_unpackhi_pd(m2, m2)));
}
TORCHPROBE_AVX2_INLINE double reduce_min(Doubles v) {
  const __m128d m2 = _mm_min_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_min_sd(m2, _mm_unpackhi_pd(m2, m2)));
}
TORCHPROBE_AVX2_INLINE double reduce_add(Doubles v) {
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

TORCHPROBE_AVX2_INLINE Floats splat_floats(float x) { return _mm256_set1_ps(x); }
TORCHPROBE_AVX2_INLINE Doubles splat_doubles(double x) { return _mm256_set1_pd(x); }
TORCHPROBE_AVX2_INLINE Doubles zeros() { return _mm256_setzero_pd(); }

TORCHPROBE_AVX2_INLINE void accumulate(Floats v, Doubles& s_lo, Doubles& s_hi, Doubles& q_lo, Doubles& q_hi) {
  const Doubles lo = low_half(v), hi = high_half(v);
  s_lo = vadd(s_lo, lo);
  s_hi = vadd(s_hi, hi);
  q_lo = vfma(lo, lo, q_lo);
  q_hi = vfma(hi, hi, q_hi);
}

// Loaders, as in x86_avx512.hpp (see there for kLaneWeight).
template <class T>
struct Loader;

template <>
struct Loader<float> {
  using Vec = Floats;
  static constexpr bool kFloatLanes = true;
  static constexpr int kStep = 8;
  static constexpr double kLaneWeight = 1.0;
  TORCHPROBE_AVX2_INLINE static Vec load(const float* p) { return _mm256_loadu_ps(p); }
};

template <>
struct Loader<c10::Half> {
  using Vec = Floats;
  static constexpr bool kFloatLanes = true;
  static constexpr int kStep = 8;
  static constexpr double kLaneWeight = 1.0;
  TORCHPROBE_AVX2_INLINE static Vec load(const c10::Half* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};

template <>
struct Loader<c10::BFloat16> {
  using Vec = Floats;
  static constexpr bool kFloatLanes = true;
  static constexpr int kStep = 8;
  static constexpr double kLaneWeight = 1.0;
  TORCHPROBE_AVX2_INLINE static Vec load(const c10::BFloat16* p) {
    const __m256i bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16));
  }
};

template <>
struct Loader<double> {
  using Vec = Doubles;
  static constexpr bool kFloatLanes = false;
  static constexpr int kStep = 4;
  static constexpr double kLaneWeight = 1.0;
  TORCHPROBE_AVX2_INLINE static Vec load(const double* p) { return _mm256_loadu_pd(p); }
};

template <>
struct Loader<std::int8_t> {
  using Vec = Doubles;
  static constexpr bool kFloatLanes = false;
  static constexpr int kStep = 4;
  static constexpr double kLaneWeight = 1.0;
  TORCHPROBE_AVX2_INLINE static Vec load(const std::int8_t* p) {
    std::int32_t four;
    std::memcpy(&four, p, sizeof four);
    return _mm256_cvtepi32_pd(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(four)));
  }
};

template <>
struct Loader<std::uint8_t> {
  using Vec = Doubles;
  static constexpr bool kFloatLanes = false;
  static constexpr int kStep = 4;
  static constexpr double kLaneWeight = 1.0;
  TORCHPROBE_AVX2_INLINE static Vec load(const std::uint8_t* p) {
    std::int32_t four;
    std::memcpy(&four, p, sizeof four);
    return _mm256_cvtepi32_pd(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(four)));
  }
};

template <>
struct Loader<std::int16_t> {
  using Vec = Doubles;
  static constexpr bool kFloatLanes = false;
  static constexpr int kStep = 4;
  static constexpr double kLaneWeight = 1.0;
  TORCHPROBE_AVX2_INLINE static Vec load(const std::int16_t* p) {
    return _mm256_cvtepi32_pd(_mm_cvtepi16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
};

template <>
struct Loader<std::int32_t> {
  using Vec = Doubles;
  static constexpr bool kFloatLanes = false;
  static constexpr int kStep = 4;
  static constexpr double kLaneWeight = 1.0;
  TORCHPROBE_AVX2_INLINE static Vec load(const std::int32_t* p) {
    return _mm256_cvtepi32_pd(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};

template <>
struct Loader<c10::complex<float>> {
  using Vec = Doubles;
  static constexpr bool kFloatLanes = false;
  static constexpr int kStep = 2;
  static constexpr double kLaneWeight = 0.5;
  TORCHPROBE_AVX2_INLINE static Vec load(const c10::complex<float>* p) {
    const Doubles parts = _mm256_cvtps_pd(_mm_loadu_ps(reinterpret_cast<const float*>(p)));
    const Doubles squares = _mm256_mul_pd(parts, parts);
    return _mm256_sqrt_pd(_mm256_add_pd(squares, _mm256_permute_pd(squares, 0x5)));
  }
};

template <class T>
TORCHPROBE_AVX2_TARGET ScanResult scan_float_lanes(const T* p, std::int64_t n) {
  using L = Loader<T>;
  constexpr std::int64_t step = L::kStep;
  Floats mx = splat_floats(-INFINITY), mn = splat_floats(INFINITY);
  Doubles s0 = zeros(), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;
  std::int64_t i = 0;
  for (; i + 2 * step <= n; i += 2 * step) {
    prefetch_ahead<2 * step * sizeof(T)>(p + i);
    const Floats a = L::load(p + i), b = L::load(p + i + step);
    mx = vmax(mx, vmax(a, b));
    mn = vmin(mn, vmin(a, b));
    accumulate(a, s0, s1, q0, q1);
    accumulate(b, s2, s3, q2, q3);
  }
  for (; i + step <= n; i += step) {
    const Floats a = L::load(p + i);
    mx = vmax(mx, a);
    mn = vmin(mn, a);
    accumulate(a, s0, s1, q0, q1);
  }
  ScanResult r;
  r.max = reduce_max(mx);
  r.min = reduce_min(mn);
  r.sum = reduce_add(vadd(vadd(s0, s1), vadd(s2, s3)));
  r.sumsq = reduce_add(vadd(vadd(q0, q1), vadd(q2, q3)));
  scan_scalar_into(p + i, n - i, r);
  return r;
}

template <class T>
TORCHPROBE_AVX2_TARGET ScanResult scan_double_lanes(const T* p, std::int64_t n) {
  using L = Loader<T>;
  constexpr std::int64_t step = L::kStep;
  Doubles mx = splat_doubles(-INFINITY), mn = splat_doubles(INFINITY);
  Doubles s0 = zeros(), s1 = s0, q0 = s0, q1 = s0;
  std::int64_t i = 0;
  for (; i + 4 * step <= n; i += 4 * step) {
    prefetch_ahead<4 * step * sizeof(T)>(p + i);
    const Doubles a = L::load(p + i), b = L::load(p + i + step);
    const Doubles c = L::load(p + i + 2 * step), d = L::load(p + i + 3 * step);
    mx = vmax(mx, vmax(vmax(a, b), vmax(c, d)));
    mn = vmin(mn, vmin(vmin(a, b), vmin(c, d)));
    s0 = vadd(s0, vadd(a, b));
    s1 = vadd(s1, vadd(c, d));
    q0 = vfma(a, a, q0);
    q1 = vfma(b, b, q1);
    q0 = vfma(c, c, q0);
    q1 = vfma(d, d, q1);
  }
  for (; i + step <= n; i += step) {
    const Doubles a = L::load(p + i);
    mx = vmax(mx, a);
    mn = vmin(mn, a);
    s0 = vadd(s0, a);
    q0 = vfma(a, a, q0);
  }
  ScanResult r;
  r.max = reduce_max(mx);
  r.min = reduce_min(mn);
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

}  // namespace torchprobe::stats::kernels::avx2

TORCHPROBE_KERNELS_END

#endif  // TORCHPROBE_STATS_X86_KERNELS

#pragma once
// What every statistics kernel shares: the partial result of scanning a run of elements, how two
// partial results combine, the value of one element as the kernels see it, and which instruction
// sets the running CPU offers.
//
// Kernels accumulate Sum and Sum of squares in double lanes. fp32 partial sums were measured too
// (docs/statistics.md): over 64M randn they miss the 1e-9 relative target on the mean of float32
// (6e-7) and on the norm of float16/bfloat16 (4e-8), while double lanes still run at memory speed.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/complex.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

// Runtime-dispatched x86 kernels need GCC/Clang function attributes (target) and <cpuid.h>.
#if !defined(TORCHPROBE_STATS_X86_KERNELS)
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) && \
    !defined(TORCHPROBE_NO_RUNTIME_DISPATCH)
#define TORCHPROBE_STATS_X86_KERNELS 1
#else
#define TORCHPROBE_STATS_X86_KERNELS 0
#endif
#endif

#if TORCHPROBE_STATS_X86_KERNELS
#include <cpuid.h>
#endif

// GCC 12's x86 intrinsic headers seed results with _mm*_undefined_*() (`__m512 __Y = __Y;`),
// which -Wuninitialized reports once inlined into a caller (GCC PR 105593, fixed in GCC 13).
// The kernel headers wrap their own code in these; user code keeps every warning.
#if defined(__GNUC__) && !defined(__clang__)
#define TORCHPROBE_KERNELS_BEGIN                                                       \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define TORCHPROBE_KERNELS_END _Pragma("GCC diagnostic pop")
#else
#define TORCHPROBE_KERNELS_BEGIN
#define TORCHPROBE_KERNELS_END
#endif

namespace torchprobe::stats {

// The instruction sets the CPU kernels are written for. Portable is xsimd on whatever the
// including translation unit was compiled for (SSE2 by default on x86-64, NEON on arm64).
enum class KernelIsa : std::uint8_t { Portable, Avx2, Avx512 };

inline const char* kernel_isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::Avx512: return "avx512";
    case KernelIsa::Avx2: return "avx2";
    case KernelIsa::Portable: break;
  }
  return "portable";
}

namespace kernels {

// Max/Min/Sum/Sum of squares of a run of elements, as doubles. A NaN element makes sumsq NaN
// (a square is never negative, so nothing else can), which is how callers detect NaN without
// a compare in the inner loop.
struct ScanResult {
  double max = -std::numeric_limits<double>::infinity();
  double min = std::numeric_limits<double>::infinity();
  double sum = 0.0;
  double sumsq = 0.0;
};

inline void merge(ScanResult& into, const ScanResult& part) {
  into.max = part.max > into.max ? part.max : into.max;
  into.min = part.min < into.min ? part.min : into.min;
  into.sum += part.sum;
  into.sumsq += part.sumsq;
}

// int64 keeps Max/Min in its own type: a double cannot hold every int64 exactly.
struct IntScanResult {
  std::int64_t max = std::numeric_limits<std::int64_t>::min();
  std::int64_t min = std::numeric_limits<std::int64_t>::max();
  double sum = 0.0;
  double sumsq = 0.0;
};

inline void merge(IntScanResult& into, const IntScanResult& part) {
  into.max = part.max > into.max ? part.max : into.max;
  into.min = part.min < into.min ? part.min : into.min;
  into.sum += part.sum;
  into.sumsq += part.sumsq;
}

// One element as a double, the way the SIMD lanes compute it, so a scalar tail agrees with
// the vector body. Complex elements are |z|; complex<float> squares its parts in double,
// which is exact and cannot overflow, so it needs no hypot.
template <class T>
inline double element_value(T v) {
  return static_cast<double>(v);
}
template <>
inline double element_value(c10::Half v) {
  return static_cast<double>(static_cast<float>(v));
}
template <>
inline double element_value(c10::BFloat16 v) {
  return static_cast<double>(static_cast<float>(v));
}
template <>
inline double element_value(c10::complex<float> v) {
  const double re = v.real(), im = v.imag();
  return std::sqrt(re * re + im * im);
}
template <>
inline double element_value(c10::complex<double> v) {
  return std::hypot(v.real(), v.imag());  // squares of doubles can overflow or underflow
}

// The kernels do enough work per cache line that the CPU keeps too few reads in flight to
// saturate memory from one core; asking for the data 1 KiB ahead closes most of the gap
// (docs/statistics.md, Results).
inline constexpr std::size_t kPrefetchDistance = 1024;

// Prefetches the cache lines that an iteration consuming kBytes at `at` will need
// kPrefetchDistance bytes later. A prefetch never faults, so reading past the end is harmless.
template <std::size_t kBytes>
inline void prefetch_ahead(const void* at) {
#if defined(__GNUC__) || defined(__clang__)
  const char* ahead = static_cast<const char*>(at) + kPrefetchDistance;
  for (std::size_t offset = 0; offset < kBytes; offset += 64) __builtin_prefetch(ahead + offset, 0, 3);
#else
  (void)at;
#endif
}

// The scalar loop: tails of the SIMD kernels, and every dtype the SIMD kernels leave out.
template <class T>
inline void scan_scalar_into(const T* p, std::int64_t n, ScanResult& r) {
  for (std::int64_t k = 0; k < n; ++k) {
    const double v = element_value(p[k]);
    r.max = v > r.max ? v : r.max;
    r.min = v < r.min ? v : r.min;
    r.sum += v;
    r.sumsq += v * v;
  }
}

template <class T>
inline ScanResult scan_scalar(const T* p, std::int64_t n) {
  ScanResult r;
  scan_scalar_into(p, n, r);
  return r;
}

inline void scan_int64_scalar_into(const std::int64_t* p, std::int64_t n, IntScanResult& r) {
  for (std::int64_t k = 0; k < n; ++k) {
    const std::int64_t v = p[k];
    r.max = v > r.max ? v : r.max;
    r.min = v < r.min ? v : r.min;
    const double d = static_cast<double>(v);
    r.sum += d;
    r.sumsq += d * d;
  }
}

inline IntScanResult scan_int64_scalar(const std::int64_t* p, std::int64_t n) {
  IntScanResult r;
  scan_int64_scalar_into(p, n, r);
  return r;
}

// ---- which instruction sets this CPU runs ------------------------------------------------------

struct CpuFeatures {
  bool avx2 = false;    // AVX2 + FMA + F16C, with the OS saving YMM state
  bool avx512 = false;  // AVX-512 F/BW/DQ/VL on top of that, with the OS saving ZMM state
};

#if TORCHPROBE_STATS_X86_KERNELS
// cpuid says what the core implements; XCR0 says whether the OS preserves the wider registers
// across context switches. Both must agree before a kernel may use them.
inline CpuFeatures detect_cpu_features() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = (c >> 12) & 1u, osxsave = (c >> 27) & 1u, avx = (c >> 28) & 1u, f16c = (c >> 29) & 1u;
  if (!osxsave || !avx) return f;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool ymm_saved = (xcr0_lo & 0x6u) == 0x6u;    // SSE and AVX state
  const bool zmm_saved = (xcr0_lo & 0xE6u) == 0xE6u;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const bool avx2 = (b >> 5) & 1u, avx512f = (b >> 16) & 1u, avx512dq = (b >> 17) & 1u, avx512bw = (b >> 30) & 1u,
             avx512vl = (b >> 31) & 1u;
  f.avx2 = ymm_saved && avx2 && fma && f16c;
  f.avx512 = f.avx2 && zmm_saved && avx512f && avx512dq && avx512bw && avx512vl;
  return f;
}
#else
inline CpuFeatures detect_cpu_features() { return {}; }
#endif

inline const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect_cpu_features();
  return features;
}

}  // namespace kernels

// Whether this build and this CPU can run the kernels of `isa`.
inline bool kernel_isa_supported(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::Avx512: return kernels::cpu_features().avx512;
    case KernelIsa::Avx2: return kernels::cpu_features().avx2;
    case KernelIsa::Portable: break;
  }
  return true;
}

namespace kernels {
// The best supported set, lowered by TORCHPROBE_STATS_ISA=portable|avx2 (for comparisons and
// for ruling out a kernel when diagnosing); a value naming an unsupported set is ignored.
inline KernelIsa choose_kernel_isa() {
  KernelIsa best = KernelIsa::Portable;
  if (kernel_isa_supported(KernelIsa::Avx2)) best = KernelIsa::Avx2;
  if (kernel_isa_supported(KernelIsa::Avx512)) best = KernelIsa::Avx512;
  if (const char* cap = std::getenv("TORCHPROBE_STATS_ISA")) {
    if (std::strcmp(cap, "portable") == 0) return KernelIsa::Portable;
    if (std::strcmp(cap, "avx2") == 0 && kernel_isa_supported(KernelIsa::Avx2)) return KernelIsa::Avx2;
  }
  return best;
}
}  // namespace kernels

// The instruction set cpu_stats(tensor) uses, chosen once per process.
inline KernelIsa best_kernel_isa() {
  static const KernelIsa isa = kernels::choose_kernel_isa();
  return isa;
}

}  // namespace torchprobe::stats

#pragma once
// Picks the kernel of one element type for one instruction set. cpu_stats asks once per tensor
// and calls the returned function for every contiguous run of that tensor.
#include "torchprobe/stats/kernels/common.hpp"
#include "torchprobe/stats/kernels/portable.hpp"
#include "torchprobe/stats/kernels/x86_avx2.hpp"
#include "torchprobe/stats/kernels/x86_avx512.hpp"

namespace torchprobe::stats::kernels {

template <class T>
using ScanFunction = ScanResult (*)(const T*, std::int64_t);
using Int64ScanFunction = IntScanResult (*)(const std::int64_t*, std::int64_t);

// Element types with SIMD kernels: the float types, integers up to 32 bits, complex<float>.
// complex<double> keeps the scalar loop: squaring its parts in double could overflow, and
// hypot per element is what keeps it exact.
template <class T>
inline ScanFunction<T> scan_function(KernelIsa isa) {
  if constexpr (std::is_same_v<T, c10::complex<double>>) {
    (void)isa;
    return &scan_scalar<T>;
  } else {
#if TORCHPROBE_STATS_X86_KERNELS
    if (isa == KernelIsa::Avx512) return &avx512::scan<T>;
    if (isa == KernelIsa::Avx2) return &avx2::scan<T>;
#else
    (void)isa;
#endif
    return &portable::scan<T>;
  }
}

inline Int64ScanFunction int64_scan_function(KernelIsa isa) {
#if TORCHPROBE_STATS_X86_KERNELS
  if (isa == KernelIsa::Avx512) return &avx512::scan_int64;
#endif
  (void)isa;
  return &scan_int64_scalar;  // AVX2 has no 64-bit integer max/min nor int64->double conversion
}

}  // namespace torchprobe::stats::kernels

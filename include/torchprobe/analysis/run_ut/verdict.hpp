#pragma once
// TorchProbe's own verdict on one float output (spec C6; docs/run_ut.md "TorchProbe's verdict"),
// written beside msprobe's files, never into them. msprobe passes any output whose max abs error is
// under 0.001 however wrong it is relative to its size, and calls an output whose true value is 0
// an error when both sides are rounding noise. Here the error is counted in units in the last place
// (ULPs) of the device dtype at the output's own scale S = max|bench|:
//   e = max_i |device_i - bench_i| / ulp(S),   ulp(x) = 2^(floor(log2 x) - mantissa bits)
// unless the output is numerically zero next to its inputs (S <= 16 ulp(I)): then the unit is ulp(I),
// the level the rounding noise of such an output lives at. I is max|input| for a forward output and
// max|grad fed| * max(1, max|input|) for a gradient (replay.hpp).
// pass: e <= 256, Warning: e <= 4096, error above or when inf/NaN differ from the benchmark.
#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

namespace torchprobe::run_ut {

struct Verdict {
  std::string status = "pass";  // pass, Warning, error, SKIP
  std::string reason;
};

inline constexpr double kVerdictPassUlps = 256, kVerdictWarningUlps = 4096;

inline int mantissa_bits(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Half: return 10;
    case c10::ScalarType::BFloat16: return 7;
    case c10::ScalarType::Double: return 52;
    default: return 23;
  }
}

// The spacing of `dtype` values at magnitude x (x > 0).
inline double ulp_at(double x, int mantissa) { return std::ldexp(1.0, std::ilogb(x) - mantissa); }

// `device_dtype` is the dtype the device ran in; `input_scale` the largest |value| among the inputs of
// this call (0 when unknown).
inline Verdict scale_aware_verdict(const at::Tensor& bench, const at::Tensor& device, c10::ScalarType device_dtype,
                                   const std::string& dtype_name, double input_scale) {
  Verdict v;
  const at::Tensor b = bench.detach().cpu().to(at::kDouble).reshape(-1);
  const at::Tensor d = device.detach().cpu().to(at::kDouble).reshape(-1);
  if (b.numel() == 0) {
    v.reason = "empty output: nothing to compare";
    return v;
  }
  const at::Tensor bf = b.isfinite(), df = d.isfinite();
  const at::Tensor same_special = b.eq(d).logical_or(b.isnan().logical_and(d.isnan()));
  const int64_t special_mismatch =
      bf.ne(df)
          .logical_or(bf.logical_not().logical_and(df.logical_not()).logical_and(same_special.logical_not()))
          .sum()
          .item<int64_t>();
  if (special_mismatch > 0) {
    v.status = "error";
    v.reason = std::to_string(special_mismatch) + " inf/NaN values differ from the benchmark";
    return v;
  }
  const at::Tensor fin = bf.logical_and(df);
  if (!fin.any().item<bool>()) {
    v.reason = "only inf/NaN, the same as the benchmark";
    return v;
  }
  const at::Tensor bfin = b.masked_select(fin), dfin = d.masked_select(fin);
  const int mant = mantissa_bits(device_dtype);
  const double out_scale = bfin.abs().max().item<double>();
  const double in_ulp = input_scale > 0 && std::isfinite(input_scale) ? ulp_at(input_scale, mant) : 0;
  const bool numerically_zero = in_ulp > 0 && out_scale <= 16 * in_ulp;
  const double max_err = (dfin - bfin).abs().max().item<double>();
  double unit = numerically_zero ? in_ulp : (out_scale > 0 ? ulp_at(out_scale, mant) : 0);
  if (unit == 0) unit = std::numeric_limits<double>::denorm_min();
  const double e = max_err / unit;
  v.status = e <= kVerdictPassUlps ? "pass" : (e <= kVerdictWarningUlps ? "Warning" : "error");
  char buf[160];
  std::snprintf(buf, sizeof buf, "max error %.4g ULPs of %s at %s %.4g", e, dtype_name.c_str(),
                numerically_zero ? "the inputs' scale (output numerically zero)" : "the output's scale",
                numerically_zero ? input_scale : out_scale);
  v.reason = buf;
  return v;
}

}  // namespace torchprobe::run_ut

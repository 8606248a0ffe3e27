#pragma once
// Which precision standard msprobe applies to an API (compare/api_precision_standard.yaml) and the
// thresholds of each (standard_config.py), as in ../shared/spec/msprobe-grad-probe-run-ut.md B.6.
#include <c10/core/ScalarType.h>

#include <cmath>

#include "torchprobe/analysis/run_ut/api_standard.hpp"

namespace torchprobe::run_ut {

// Thresholds per device dtype (fp16, bf16, fp32: the dtypes the new standard supports).
struct Thresholds {
  double small_value = 0;     // |bench| <= this is a small value
  double benchmark_atol = 0;  // benchmark standard: small-value error above this
  double absolute_atol = 0;   // absolute-threshold standard: small-value error above this
  double rtol = 0;            // absolute-threshold standard: relative error above this
  int ulp_min_exponent = -126;
  int mantissa_bits = 23;
  double ulp_limit = 32;  // ULP errors above this count in the proportion
};

inline Thresholds thresholds_for(c10::ScalarType device_dtype) {
  Thresholds t;
  switch (device_dtype) {
    case c10::ScalarType::Half:
      t = {std::ldexp(1.0, -10), 1e-16, std::ldexp(1.0, -16), std::ldexp(1.0, -10), -14, 10, 1};
      break;
    case c10::ScalarType::BFloat16: t = {std::ldexp(1.0, -10), 1e-16, 1e-16, std::ldexp(1.0, -8), -126, 7, 1}; break;
    default:
      t = {std::ldexp(1.0, -20), std::ldexp(1.0, -30), std::ldexp(1.0, -30), std::ldexp(1.0, -20), -126, 23, 32};
      break;
  }
  return t;
}

inline bool new_standard_supports(c10::ScalarType d) {
  return d == c10::ScalarType::Half || d == c10::ScalarType::BFloat16 || d == c10::ScalarType::Float;
}

}  // namespace torchprobe::run_ut

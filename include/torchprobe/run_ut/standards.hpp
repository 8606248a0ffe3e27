#pragma once
// Which precision standard msprobe applies to an API (compare/api_precision_standard.yaml) and the
// thresholds of each (standard_config.py), as in ../shared/spec/msprobe-grad-probe-run-ut.md B.6.
#include <c10/core/ScalarType.h>

#include <cmath>
#include <string>
#include <unordered_set>

namespace torchprobe::run_ut {

enum class Standard { benchmark, absolute, binary, ulp, thousandth };

inline bool in_list(const std::unordered_set<std::string>& list, const std::string& api) { return list.count(api) > 0; }

inline Standard standard_of(const std::string& api) {
  static const std::unordered_set<std::string> absolute = {
      "mul",        "mul_",        "__mul__", "__imul__",   "__rmul__",    "add",      "add_",   "__add__",
      "__iadd__",   "__radd__",    "div",     "div_",       "__div__",     "__idiv__", "divide", "divide_",
      "leaky_relu", "leaky_relu_", "prelu",   "reciprocal", "reciprocal_", "rsqrt",    "rsqrt_", "square",
      "square_",    "sub",         "sub_",    "rsub",       "__isub__",    "__sub__"};
  static const std::unordered_set<std::string> binary = {
      "abs",          "abs_",        "absolute",     "absolute_",  "argmin",        "bitwise_and",    "bitwise_and_",
      "broadcast_to", "ceil",        "ceil_",        "equal",      "fill_",         "flatten",        "floor",
      "floor_",       "gather",      "greater",      "greater_",   "greater_equal", "greater_equal_", "histc",
      "isfinite",     "isnan",       "less",         "less_",      "less_equal",    "less_equal_",    "logical_and",
      "logical_and_", "logical_not", "logical_not_", "logical_or", "logical_or_",   "masked_fill",    "masked_fill_",
      "max_pool3d",   "maximum",     "minimum",      "neg",        "neg_",          "nonzero",        "not_equal",
      "not_equal_",   "one_hot",     "pad",          "relu",       "reshape",       "round",          "round_",
      "select",       "sign",        "sign_",        "sort",       "tile",          "topk",           "transpose",
      "transpose_",   "tril",        "tril_",        "triu",       "triu_",         "type_as"};
  static const std::unordered_set<std::string> ulp = {
      "__matmul__",   "addbmm", "addbmm_", "addmm",  "addmm_", "baddbmm", "baddbmm_", "bilinear", "bmm",
      "chain_matmul", "hspmm",  "linear",  "matmul", "mm",     "mv",      "smm",      "sspaddmm"};
  if (in_list(absolute, api)) return Standard::absolute;
  if (in_list(binary, api)) return Standard::binary;
  if (in_list(ulp, api)) return Standard::ulp;
  if (api == "conv1d" || api == "conv2d") return Standard::thousandth;
  return Standard::benchmark;
}

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

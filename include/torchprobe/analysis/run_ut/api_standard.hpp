#pragma once
// Which precision standard msprobe applies to an API by its bare name (compare/api_precision_standard.yaml,
// ../shared/spec/msprobe-grad-probe-run-ut.md B.6). Free of libtorch: api_precision_compare uses it too.
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

}  // namespace torchprobe::run_ut

#pragma once
// The rules of msprobe's api_precision_compare (../shared/spec/msprobe-grad-probe-run-ut.md B.9):
// which standard judges a details row and how, from the target ("NPU") and bench ("GPU") rows'
// metrics, with msprobe 8.3.3's quirks kept (absolute-threshold messages without line breaks, a ULP
// inf/nan mismatch leaving the ULP status blank, rows with 相对误差错误率 filled judged as fp8 inputs).
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "torchprobe/analysis/run_ut/api_standard.hpp"
#include "torchprobe/analysis/run_ut/precision_table.hpp"

namespace torchprobe::run_ut::precision {

inline const std::vector<std::string>& required_columns() {
  static const std::vector<std::string> c = {
      "API Name",       "DEVICE Dtype",  "小值域错误占比",      "均方根误差",    "相对误差最大值",
      "相对误差平均值", "误差均衡性",    "二进制一致错误率",    "inf/nan错误率", "相对误差错误率",
      "绝对误差错误率", "ULP误差平均值", "ULP误差大于阈值占比", "双千指标"};
  return c;
}

inline const char* kResultHeader = "API Name,Forward Test Success,Backward Test Success,Message";
inline const char* kDetailsHeader =
    "API "
    "Name,小值域错误比值,小值域判定结果,均方根误差比值,均方根误差判定结果,相对误差最大值比值,相对误差最大值判定结果,"
    "相对误差平均值比值,相对误差平均值判定结果,误差均衡性比值,误差均衡性判定结果,inf/nan错误率,inf/nan判定结果,"
    "相对误差错误率,相对误差判定结果,绝对误差错误率,绝对误差判定结果,二进制一致错误率,二进制一致错误率判定结果,"
    "ULP误差平均值,ULP误差大于阈值占比,ULP误差大于阈值占比比值,ULP误差判定结果,双千指标,双千指标判定结果,比对结果,"
    "比对算法,Message";

// The columns of a details row (msprobe's ApiPrecisionOutputColumn).
enum Out {
  name,
  small_ratio,
  small_status,
  rmse_ratio,
  rmse_status,
  max_rel_ratio,
  max_rel_status,
  mean_rel_ratio,
  mean_rel_status,
  eb_ratio,
  eb_status,
  inf_nan,
  inf_nan_status,
  rel_err,
  rel_err_status,
  abs_err,
  abs_err_status,
  error_rate,
  error_rate_status,
  mean_ulp,
  ulp_prop,
  ulp_prop_ratio,
  ulp_status,
  thousandth,
  thousandth_status,
  result,
  algorithm,
  message,
  kOutColumns
};
using OutRow = std::array<Value, kOutColumns>;

inline const std::string kPass = "pass", kError = "error", kWarning = "Warning", kSkip = "SKIP", kSpace = " ";

namespace details {

inline bool is_fp8(const Value& dtype) {
  const std::string s = dtype.py_str();
  return dtype.is_text() &&
         (s == "torch.float8_e4m3fn" || s == "torch.float8_e5m2" ||
          s == "<class 'torch_npu.utils.hif8_tensor.HiFloat8Tensor'>" || s == "torch_npu.HiFloat8Tensor");
}

inline double min_err(const std::string& dtype) {
  if (dtype == "torch.float16") return std::ldexp(1.0, -11);
  if (dtype == "torch.bfloat16") return std::ldexp(1.0, -8);
  return std::ldexp(1.0, -14);
}

inline bool inf_or_nan(double x) { return std::isnan(x) || std::isinf(x); }

struct Ratio {
  double value;
  bool consistent;
  std::string message;
};

// check_inf_or_nan: a ratio is meaningless when either side is inf or NaN; both the same is consistent.
inline Ratio inf_nan_ratio(double x, double y, const std::string& column) {
  const double nan = std::nan("");
  bool same = false;
  if (std::isinf(x) || std::isinf(y))
    same = std::isinf(x) && std::isinf(y) && x == y;
  else
    same = std::isnan(x) && std::isnan(y);
  return {nan, same, column + (same ? "同为同号inf或nan\n" : "inf或nan不一致\n")};
}

inline Ratio ratio(double npu, double gpu, const std::string& dtype, const std::string& column) {
  if (inf_or_nan(npu) || inf_or_nan(gpu)) return inf_nan_ratio(npu, gpu, column);
  return {std::fabs(npu) / std::max(std::fabs(gpu), min_err(dtype)), true, ""};
}

struct Rows {
  const Table& npu;
  std::size_t i;
  const Table& gpu;
  std::size_t j;
  std::string dtype;
  double n(const std::string& c) const { return to_float(npu.at(i, c)); }
  double g(const std::string& c) const { return to_float(gpu.at(j, c)); }
};

inline std::string benchmark(const Rows& r, OutRow& o) {
  static const struct {
    const char* column;
    Out ratio, status;
    double limit;
    const char* error;
  } metrics[] = {{"小值域错误占比", small_ratio, small_status, 2, "ERROR: 小值域错误比值超过阈值\n"},
                 {"均方根误差", rmse_ratio, rmse_status, 2, "ERROR: 均方根误差比值超过阈值\n"},
                 {"相对误差最大值", max_rel_ratio, max_rel_status, 10, "ERROR: 相对误差最大值比值超过阈值\n"},
                 {"相对误差平均值", mean_rel_ratio, mean_rel_status, 2, "ERROR: 相对误差平均值比值超过阈值\n"},
                 {"误差均衡性", eb_ratio, eb_status, 2, nullptr}};
  std::string msg, tail, verdict = kPass;
  std::vector<Ratio> ratios;
  for (const auto& m : metrics) {
    const double npu = r.n(m.column), gpu = r.g(m.column);
    ratios.push_back(ratio(npu, gpu, r.dtype, m.column));
    msg += ratios.back().message;
  }
  for (std::size_t k = 0; k < 5; ++k) {
    const auto& m = metrics[k];
    const Ratio& q = ratios[k];
    const bool bad = !q.consistent || (!inf_or_nan(q.value) && q.value > m.limit);
    o[m.ratio] = Value::f(q.value);
    o[m.status] = Value::str(bad ? kError : kPass);
    if (bad && m.error) {  // the error balance is reported but does not decide (msprobe)
      verdict = kError;
      tail += m.error;
    }
  }
  o[result] = Value::str(verdict);
  o[algorithm] = Value::str("标杆比对法");
  return msg + tail;
}

inline std::string ulp(const Rows& r, OutRow& o) {
  const Value& dtype = r.npu.at(r.i, "DEVICE Dtype");
  std::string msg;
  bool consistent = true;
  double prop = 0, prop_ratio = std::nan("");
  if (is_fp8(dtype)) {
    prop = r.n("ULP误差大于阈值占比");
    o[mean_ulp] = Value::str(kSpace);
    o[ulp_prop_ratio] = Value::str(kSpace);
  } else {
    const double mean_n = r.n("ULP误差平均值"), mean_g = r.g("ULP误差平均值");
    if (inf_or_nan(mean_n) || inf_or_nan(mean_g)) {
      const Ratio q = inf_nan_ratio(mean_n, mean_g, "ULP误差平均值");
      consistent = q.consistent;
      msg += q.message;
    }
    prop = r.n("ULP误差大于阈值占比");
    const double prop_g = r.g("ULP误差大于阈值占比");
    const Ratio q = ratio(prop, prop_g, r.dtype, "ULP误差大于阈值占比");
    consistent = consistent && q.consistent;
    msg += q.message;
    prop_ratio = q.value;
    o[mean_ulp] = Value::f(mean_n);
    o[ulp_prop_ratio] = Value::f(prop_ratio);
  }
  o[ulp_prop] = Value::f(prop);
  o[algorithm] = Value::str("ULP误差比对法");
  if (!consistent) {  // msprobe leaves the ULP status column blank here
    o[result] = Value::str(kError);
    return msg + "ERROR: ULP误差不满足标准\n";
  }
  bool pass = false;
  if (is_fp8(dtype))
    pass = prop < 0.001;
  else if (dtype.py_str() == "torch.float32")
    pass = o[mean_ulp].real < 64 || prop < 0.05 || prop_ratio < 1;
  else
    pass = prop < 0.001 || prop_ratio < 1;
  o[ulp_status] = o[result] = Value::str(pass ? kPass : kError);
  return pass ? msg : msg + "ERROR: ULP误差不满足标准\n";
}

// The absolute-threshold ratios: each must be 0. Returns the verdict.
inline std::string absolute_ratios(const Rows& r, OutRow& o, std::vector<std::string>& errors) {
  static const struct {
    const char* column;
    Out value, status;
    const char* error;
  } parts[] = {{"inf/nan错误率", inf_nan, inf_nan_status, "ERROR: inf/nan错误率超过阈值"},
               {"相对误差错误率", rel_err, rel_err_status, "ERROR: 相对误差错误率超过阈值"},
               {"绝对误差错误率", abs_err, abs_err_status, "ERROR: 绝对误差错误率超过阈值"}};
  std::array<double, 3> v{};
  for (std::size_t k = 0; k < 3; ++k) v[k] = r.n(parts[k].column);
  std::string verdict = kPass;
  for (std::size_t k = 0; k < 3; ++k) {
    o[parts[k].value] = Value::f(v[k]);
    o[parts[k].status] = Value::str(v[k] == 0 ? kPass : kError);
    if (v[k] != 0) {
      verdict = kError;
      errors.push_back(parts[k].error);
    }
  }
  return verdict;
}

inline std::string absolute(const Rows& r, OutRow& o) {
  std::vector<std::string> errors;
  o[result] = Value::str(absolute_ratios(r, o, errors));
  o[algorithm] = Value::str("绝对阈值法");
  std::string msg;
  for (const auto& e : errors) msg += e;  // msprobe: no line breaks between these
  return msg;
}

inline std::string accumulative(const Rows& r, OutRow& o) {
  std::vector<std::string> errors;
  const std::string verdict = absolute_ratios(r, o, errors);
  const double eb = r.n("误差均衡性");
  const double limit = r.dtype == "torch.float16"    ? std::ldexp(1.0, -20)
                       : r.dtype == "torch.bfloat16" ? std::ldexp(1.0, -7)
                                                     : std::ldexp(1.0, -14);
  o[eb_ratio] = Value::f(eb);
  o[eb_status] = Value::str(eb <= limit ? kPass : kError);
  if (eb > limit || std::isnan(eb)) errors.push_back("ERROR: 误差均衡性超过阈值");
  o[result] = Value::str(verdict == kError || !(eb <= limit) ? kError : kPass);
  o[algorithm] = Value::str("累积误差比对法");
  std::string msg;
  for (std::size_t k = 0; k < errors.size(); ++k) msg += (k ? "\n" : "") + errors[k] + "\n";
  return msg;
}

inline std::string binary(const Rows& r, OutRow& o) {
  const Value& v = r.npu.at(r.i, "二进制一致错误率");
  const bool pass = to_float(v) == 0;
  o[error_rate] = v;
  o[error_rate_status] = o[result] = Value::str(pass ? kPass : kError);
  o[algorithm] = Value::str("二进制一致法");
  return pass ? "" : "ERROR: 二进制一致错误率超过阈值\n";
}

inline std::string thousandth_rule(const Rows& r, OutRow& o) {
  const Value& v = r.npu.at(r.i, "双千指标");
  const bool pass = to_float(v) >= 0.999;
  o[thousandth] = v;
  o[thousandth_status] = o[result] = Value::str(pass ? kPass : kError);
  o[algorithm] = Value::str("双千指标法");
  return pass ? "" : "ERROR: 双千指标不达标\n";
}

inline bool unsupported_dtype(const Value& d) {
  const std::string s = d.py_str();
  return d.is_text() && (s == "torch.float64" || s == "torch.complex64" || s == "torch.complex128");
}

// get_api_status: the row's verdict (SKIP when it has no output to judge), filling `o`.
inline std::string judge(const Rows& r, const std::string& api, OutRow& o) {
  const Value& dev = r.npu.at(r.i, "DEVICE Dtype");
  const bool zero_shape =
      r.npu.has("Shape") && r.npu.at(r.i, "Shape").is_text() && r.npu.at(r.i, "Shape").text == "(0,)";
  if (dev.isspace() || unsupported_dtype(dev) || zero_shape) {
    o[result] = Value::str(kSkip);
    o[message] = r.npu.has("Message") ? r.npu.at(r.i, "Message") : Value::f(std::nan(""));
    return kSkip;
  }
  const bool fp8_in = !r.npu.at(r.i, "相对误差错误率").isspace();
  static const std::vector<std::string> floats = {"torch.float16",       "torch.bfloat16",    "torch.float32",
                                                  "torch.float8_e4m3fn", "torch.float8_e5m2", "torch.float64",
                                                  "torch.complex64",     "torch.complex128"};
  const std::string out = dev.py_str();
  std::string (*rule)(const Rows&, OutRow&) = benchmark;
  if (is_fp8(dev))
    rule = ulp;
  else if (fp8_in)
    rule = absolute;
  else if (std::find(floats.begin(), floats.end(), out) == floats.end())
    rule = binary;
  else if (api == "test_api")
    rule = accumulative;
  else
    switch (standard_of(api)) {
      case Standard::absolute: rule = absolute; break;
      case Standard::binary: rule = binary; break;
      case Standard::ulp: rule = ulp; break;
      case Standard::thousandth: rule = thousandth_rule; break;
      case Standard::benchmark: rule = benchmark; break;
    }
  o[message] = Value::str(rule(r, o));
  return o[result].text;
}

}  // namespace details

}  // namespace torchprobe::run_ut::precision

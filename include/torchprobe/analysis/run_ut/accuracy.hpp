#pragma once
// One output of one API: the device result against the benchmark, as msprobe's Comparator
// (_compare_torch_tensor, _compare_float_tensor and algorithm.py) judges it: the new-standard
// metrics are stored, and the status comes from cosine -> max abs error -> error ratios
// (../shared/spec/msprobe-grad-probe-run-ut.md B.5, B.6). Arithmetic follows numpy's dtypes:
// bf16 outputs are compared in float32, fp32 against its float64 benchmark in float64.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>

#include "torchprobe/analysis/run_ut/cells.hpp"
#include "torchprobe/analysis/run_ut/standards.hpp"
#include "torchprobe/analysis/run_ut/verdict.hpp"

namespace torchprobe::run_ut {

enum class Status { pass, warning, error, skip };

inline const char* status_text(Status s) {
  switch (s) {
    case Status::pass: return "pass";
    case Status::warning: return "Warning";
    case Status::error: return "error";
    case Status::skip: return "SKIP";
  }
  return "SKIP";
}

// One row of the details CSV, less its name.
struct Detail {
  std::string bench_dtype = " ", device_dtype = " ", shape = " ";
  Cell cosine, max_abs, hundredth, thousandth, ten_thousandth, error_rate, eb, rmse, small_err, max_rel, mean_rel,
      inf_nan, rel_ratio, abs_ratio, ulp_max, ulp_mean, ulp_prop;
  Status status = Status::pass;
  std::string message;
  Verdict verdict;  // TorchProbe's own (verdict.hpp), written beside msprobe's files
};

// str(torch.dtype) and str(tuple(shape)).
inline std::string torch_dtype_str(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "torch.float32";
    case c10::ScalarType::Double: return "torch.float64";
    case c10::ScalarType::Half: return "torch.float16";
    case c10::ScalarType::BFloat16: return "torch.bfloat16";
    case c10::ScalarType::Long: return "torch.int64";
    case c10::ScalarType::Int: return "torch.int32";
    case c10::ScalarType::Short: return "torch.int16";
    case c10::ScalarType::Char: return "torch.int8";
    case c10::ScalarType::Byte: return "torch.uint8";
    case c10::ScalarType::Bool: return "torch.bool";
    case c10::ScalarType::ComplexFloat: return "torch.complex64";
    case c10::ScalarType::ComplexDouble: return "torch.complex128";
    default: return std::string("torch.") + c10::toString(t);
  }
}
inline std::string python_shape(at::IntArrayRef sizes) {
  if (sizes.size() == 1) return "(" + std::to_string(sizes[0]) + ",)";
  std::string s = "(";
  for (std::size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + ")";
}

namespace details {

inline double fraction(const at::Tensor& mask) {
  return static_cast<double>(mask.sum().item<int64_t>()) / static_cast<double>(mask.numel());
}
inline int64_t count(const at::Tensor& mask) { return mask.sum().item<int64_t>(); }

// get_rel_err_ratio: (ratio of rel < threshold, ratio > 1 - threshold); an empty tensor gives int 1.
inline std::pair<Cell, bool> rel_ratio(const at::Tensor& rel, double threshold) {
  if (rel.numel() == 0) return {Cell::integer(1), true};
  const double r = fraction(rel < threshold);
  return {Cell::f64(r), r > 1 - threshold};
}

// The new-standard columns of one float output (stored only, never part of the status).
inline void new_standard(Detail& row, const std::string& api, c10::ScalarType dtype, const at::Tensor& b,
                         const at::Tensor& d, const at::Tensor& abs_err, const at::Tensor& abs_bench,
                         const at::Tensor& abs_bench_eps) {
  const bool f64 = abs_err.scalar_type() == at::kDouble;
  const Thresholds th = thresholds_for(dtype);
  const at::Tensor finite = d.isfinite().logical_and(b.to(d.scalar_type()).isfinite());
  const at::Tensor inf_nan = finite.logical_not();
  const auto ratio_or_zero = [](const at::Tensor& num_mask, const at::Tensor& den_mask) {
    const int64_t den = count(den_mask);
    return den == 0 ? Cell::integer(0) : Cell::f64(static_cast<double>(count(num_mask)) / static_cast<double>(den));
  };
  switch (standard_of(api)) {
    case Standard::binary: row.error_rate = Cell::f64(fraction(b.ne(d))); return;
    case Standard::thousandth: return;  // set by the caller before the status checks
    case Standard::absolute: {
      const at::Tensor rel = abs_err / abs_bench_eps;
      const at::Tensor small = abs_bench.le(th.small_value).logical_and(finite);
      const at::Tensor normal = finite.logical_and(small.logical_not());
      const double lim =
          dtype == at::kBFloat16 ? 3.3895313892515355e38 : (dtype == at::kHalf ? 65504.0 : 3.4028234663852886e38);
      const at::Tensor gc = b.to(d.scalar_type()).clamp(-lim, lim), dc = d.clamp(-lim, lim);
      const at::Tensor cre = (dc - gc).abs() / abs_bench_eps;
      const at::Tensor pass = cre.le(th.rtol).logical_or(d.isnan().logical_and(gc.isnan()));
      row.inf_nan = ratio_or_zero(pass.logical_not().logical_and(inf_nan), inf_nan);
      row.rel_ratio = ratio_or_zero(rel.gt(th.rtol).logical_and(normal), normal);
      row.abs_ratio = ratio_or_zero(abs_err.gt(th.absolute_atol).logical_and(small), small);
      return;
    }
    case Standard::ulp: {
      if (b.numel() == 0) {
        row.ulp_max = row.ulp_mean = row.ulp_prop = Cell::integer(0);
        return;
      }
      const bool fp32 = dtype == at::kFloat;
      const auto ct = fp32 ? at::kDouble : at::kFloat;
      const at::Tensor ab = b.abs();
      at::Tensor eb = at::where(ab.eq(0), at::zeros_like(ab), ab.log2().floor()).clamp_min(th.ulp_min_exponent);
      const at::Tensor scale = at::exp2(-eb + th.mantissa_bits).to(ct);
      const at::Tensor ulp = ((d.to(ct) - b).to(ct) * scale).abs();
      row.ulp_max = Cell::real(ulp.max().item<double>(), fp32);
      row.ulp_mean = Cell::real(ulp.mean().item<double>(), fp32);
      row.ulp_prop = Cell::f64(fraction(ulp.gt(th.ulp_limit)));
      return;
    }
    case Standard::benchmark: {
      const at::Tensor small = abs_bench.le(th.small_value).logical_and(finite);
      row.small_err = ratio_or_zero(small.logical_and(abs_err.gt(th.benchmark_atol)), small);
      const at::Tensor excluded = small.logical_or(inf_nan);
      const at::Tensor rel = at::where(excluded, at::full_like(abs_err, -1), abs_err / abs_bench_eps);
      const at::Tensor masked = at::where(excluded, at::zeros_like(abs_err), abs_err);
      const double n = static_cast<double>(abs_err.numel());
      const double mse =
          masked.square().mean().item<double>() * (n / (n - static_cast<double>(count(excluded)) + 1e-4) + 1e-4);
      row.rmse = Cell::f64(std::sqrt(mse));
      const at::Tensor diff = d - b.to(d.scalar_type());
      row.eb = n > 0 ? Cell::f64(std::fabs(static_cast<double>(count(diff.gt(0)) - count(diff.lt(0)))) / n)
                     : Cell::integer(0);
      const double mx = rel.numel() ? rel.max().item<double>() : -1;
      row.max_rel = mx >= 0 ? Cell::real(mx, f64) : Cell::integer(0);
      const at::Tensor nonneg = rel.masked_select(rel.ge(0));
      row.mean_rel = nonneg.numel() ? Cell::real(nonneg.mean().item<double>(), f64) : Cell::integer(0);
      return;
    }
  }
}

// cosine_sim of algorithm.py: (value cell, passed, message).
inline void cosine(Detail& row, const at::Tensor& b, const at::Tensor& d, bool& ok, std::string& msg) {
  ok = true;
  if (d.numel() == 1) {
    msg = "All the data in device dump data is scalar. Please refer to other compare algorithms.";
    return;
  }
  const double eps = std::numeric_limits<double>::epsilon();
  const double dm = d.abs().max().item<double>(), bm = b.abs().max().item<double>();
  if (dm <= eps && bm <= eps) {
    msg = "All the data in device and bench outputs are zero.";
    return;
  }
  if (dm <= eps || bm <= eps) {
    msg = dm <= eps ? "All the data is zero in device dump data." : "All the data is zero in bench dump data.";
    ok = false;
    return;
  }
  const at::Tensor n = d.reshape(-1).to(at::kDouble) / dm, g = b.reshape(-1).to(at::kDouble) / bm;
  double c = n.dot(g).item<double>() / (n.norm().item<double>() * g.norm().item<double>());
  if (std::isnan(c))
    msg = "Dump data has NaN when comparing with Cosine Similarity.";
  else
    c = std::min(1.0, std::max(-1.0, c));
  row.cosine = Cell::f64(c);
  ok = c > 0.99;  // NaN fails, as in msprobe's classic line
}

}  // namespace details

// Compares one output. `device` ran in the original dtype, `bench` up-cast.
// `input_scale`: the largest |value| among the call's inputs, for TorchProbe's verdict (0: unknown).
inline Detail compare_tensor(const std::string& api, at::Tensor bench, at::Tensor device, double input_scale = 0) {
  Detail row;
  bench = bench.detach().cpu();
  device = device.detach().cpu();
  row.bench_dtype = torch_dtype_str(bench.scalar_type());
  row.device_dtype = torch_dtype_str(device.scalar_type());
  row.shape = python_shape(device.sizes());
  const c10::ScalarType dtype = device.scalar_type();
  if (dtype == at::kBFloat16) {
    bench = bench.to(at::kFloat);
    device = device.to(at::kFloat);
  }
  if (bench.sizes() != device.sizes()) {
    row.status = Status::error;
    row.message =
        "The shape of bench" + python_shape(bench.sizes()) + " and npu" + python_shape(device.sizes()) + " not equal.";
    row.verdict = {"error", row.message};
    return row;
  }
  const bool bf = bench.is_floating_point(), df = device.is_floating_point();
  const bool bb = bench.scalar_type() == at::kBool, db = device.scalar_type() == at::kBool;
  if (bf != df || bb != db) {
    row.status = Status::error;
    row.message =
        "Bench out dtype is " + row.bench_dtype + " but npu output dtype is " + row.device_dtype + ", cannot compare.";
    row.verdict = {"error", row.message};
    return row;
  }
  if (!bf) {
    row.message = "Compare algorithm is not supported for " + torch_dtype_str(bench.scalar_type()).substr(6) +
                  " data. Only judged by Error Rate.";
    if (bench.numel() == 0) {
      row.error_rate = Cell::str("nan");
      row.status = Status::error;
      row.message += "There is not bench calculation result.\n";
      row.verdict.reason = "empty output: nothing to compare";
      return row;
    }
    const double rate = details::fraction(bench.ne(device));
    row.error_rate = Cell::f64(rate);
    row.status = rate == 0 ? Status::pass : Status::error;
    row.verdict = {status_text(row.status), "exact comparison: " + std::to_string(rate) + " of the values differ"};
    row.message += "\n";
    return row;
  }
  row.verdict = scale_aware_verdict(bench, device, dtype, row.device_dtype, input_scale);
  if (device.numel() == 0) {  // numpy's max of an empty array raises in msprobe; an error here
    row.status = Status::error;
    row.message = "Relative error result list is empty.";
    return row;
  }
  const at::Tensor abs_bench = bench.abs();
  const double eps = dtype == at::kBFloat16
                         ? std::ldexp(1.0, -8)
                         : (bench.scalar_type() == at::kDouble ? std::numeric_limits<double>::epsilon()
                            : bench.scalar_type() == at::kHalf ? 0.0009765625
                                                               : std::numeric_limits<float>::epsilon());
  const at::Tensor abs_bench_eps = abs_bench + eps;
  const auto ct = at::promote_types(device.scalar_type(), bench.scalar_type());
  const bool f64 = ct == at::kDouble;
  const at::Tensor abs_err = (device.to(ct) - bench.to(ct)).abs();
  const at::Tensor rel = (abs_err / abs_bench_eps).abs();
  if (standard_of(api) == Standard::thousandth) row.thousandth = details::rel_ratio(rel, 0.001).first;
  if (new_standard_supports(dtype))
    details::new_standard(row, api, dtype, bench, device, abs_err, abs_bench, abs_bench_eps);

  bool cos_ok = true;
  std::string msg;
  details::cosine(row, bench, device, cos_ok, msg);
  row.message = msg + "\n";
  if (!cos_ok) {
    row.message += "Cosine similarity is less than 0.99, consider as error, skip other check and set to SPACE.\n";
    row.status = Status::error;
    return row;
  }
  const double max_abs = abs_err.max().item<double>();
  row.max_abs = Cell::real(max_abs, f64);
  if (max_abs < 0.001) {
    row.message += "Max abs error is less than 0.001, consider as pass, skip other check and set to SPACE.\n";
    return row;
  }
  const bool half = dtype == at::kHalf || dtype == at::kBFloat16;
  if (half) {
    const auto h = details::rel_ratio(rel, 0.01);
    row.hundredth = h.first;
    if (!h.second) {
      row.message += "Relative error is greater than 0.01, consider as error, skip other check and set to SPACE.\n";
      row.status = Status::error;
      return row;
    }
  }
  const auto t = details::rel_ratio(rel, 0.001);
  row.thousandth = t.first;
  if (half) {
    row.status = t.second ? Status::pass : Status::warning;
    row.message +=
        t.second ? "Relative error is less than 0.001, consider as pass, skip other check and set to SPACE.\n"
                 : "Relative error is greater than 0.001, consider as warning, skip other check and set to SPACE.\n";
    return row;
  }
  const auto w = details::rel_ratio(rel, 0.0001);
  row.ten_thousandth = w.first;
  if (!t.second) {
    row.message += "Relative error is greater than 0.001, consider as error, skip other check and set to SPACE.\n";
    row.status = Status::error;
  } else if (!w.second) {
    row.message += "Relative error is greater than 0.0001, consider as warning, skip other check and set to SPACE.\n";
    row.status = Status::warning;
  } else {
    row.message += "Relative error is less than 0.0001, consider as pass.\n";
  }
  return row;
}

// A row that only says why nothing was compared.
inline Detail skip_detail(std::string message) {
  Detail row;
  row.status = Status::skip;
  row.message = std::move(message);
  row.verdict = {"SKIP", row.message};
  return row;
}

}  // namespace torchprobe::run_ut

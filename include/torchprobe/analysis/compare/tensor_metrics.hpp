#pragma once
// msprobe's tensor-mode columns (Cosine, EucDist, MaxAbsErr, MaxRelativeErr, One Thousandth and
// Five Thousandths Err Ratio) of one pair of .pt files, computed as msprobe 26.0 computes them
// (read_pt_data, ValidateTensor.check_tensor, compare_ops_apply in npy_compare.py; see
// ../shared/spec/compare-spec.md section 1.3). Needs libtorch (the .pt files are read with its
// unpickler), so only the CLI and the libtorch tests include it; msprobe_table.hpp takes the cells
// through a callback.
#include <ATen/ATen.h>
#include <torch/serialize.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "torchprobe/analysis/compare/python_text.hpp"
#include "torchprobe/io/pt_reader.hpp"

namespace torchprobe::compare {

using TensorCells = std::array<std::string, 6>;

// What msprobe's read_pt_data makes of a .pt file: the tensor on the CPU, detached, bfloat16 (and
// the float8 types) up-cast to float32 (numpy has no such dtype), then np.squeeze'd. Complex
// tensors keep their real part, which is all numpy's astype(float) keeps of them. Throws
// std::runtime_error naming the file.
inline at::Tensor read_pt_values(const std::filesystem::path& file) {
  const c10::IValue v = io::read_pt_file(file);
  if (!v.isTensor()) throw std::runtime_error(file.string() + " does not hold a tensor");
  at::Tensor t = v.toTensor().detach().cpu();
  if (t.is_complex()) t = at::real(t);
  const auto s = t.scalar_type();
  if (at::isFloatingType(s) && s != at::kHalf && s != at::kFloat && s != at::kDouble) t = t.to(at::kFloat);
  return t.squeeze().contiguous();
}

namespace details {

// msprobe's format_value: float('{:.12f}'.format(v)), then str() of it as the CSV holds it.
inline double py_format_value(double v) {
  if (!std::isfinite(v)) return v;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.12f", v);  // glibc rounds the exact binary value, as Python does
  return std::strtod(buf, nullptr);
}
inline std::string tensor_cell(double v) {
  if (std::isinf(v)) return v > 0 ? " inf" : " -inf";  // msprobe's replace({inf: " inf"}) before to_csv
  return py_float_str(v);
}

// numpy's promote_types for the dtypes read_pt_values leaves (bool, integers, fp16/32/64).
inline at::ScalarType numpy_promote(at::ScalarType a, at::ScalarType b) {
  if (a == b) return a;
  if (a == at::kBool) return b;
  if (b == at::kBool) return a;
  const bool fa = at::isFloatingType(a), fb = at::isFloatingType(b);
  const auto bits = [](at::ScalarType s) { return static_cast<int>(c10::elementSize(s)) * 8; };
  if (fa && fb) return bits(a) >= bits(b) ? a : b;
  if (fa || fb) {
    const at::ScalarType f = fa ? a : b, i = fa ? b : a;
    const int need = bits(i) <= 8 ? 16 : bits(i) <= 16 ? 32 : 64;  // the float that holds every such integer
    const int have = std::max(need, bits(f));
    return have == 16 ? at::kHalf : have == 32 ? at::kFloat : at::kDouble;
  }
  if (a == at::kByte || b == at::kByte) {  // uint8 with a signed type
    const at::ScalarType s = a == at::kByte ? b : a;
    return s == at::kChar ? at::kShort : s;
  }
  return bits(a) >= bits(b) ? a : b;
}

// get_relative_err: |n - b| / |b| in result_type(n, b, float32) (float32 unless a side is float64 or
// not floating, which numpy first turns into float64); where b == 0 both get that type's epsilon.
struct RelativeError {
  std::vector<double> values;  // each exactly representable in the type it was computed in
  bool in_float32 = false;
};
inline RelativeError relative_error(const at::Tensor& n, const at::Tensor& b, const at::Tensor& nd,
                                    const at::Tensor& bd) {
  RelativeError r;
  const auto f16_32 = [](at::ScalarType s) { return s == at::kHalf || s == at::kFloat; };
  r.in_float32 = f16_32(n.scalar_type()) && f16_32(b.scalar_type());
  const double* x = nd.data_ptr<double>();
  const double* y = bd.data_ptr<double>();
  const auto count = static_cast<std::size_t>(nd.numel());
  r.values.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (r.in_float32) {
      volatile float xn = static_cast<float>(x[i]), yb = static_cast<float>(y[i]);  // float32 rounding of each step
      if (y[i] == 0) {
        xn = xn + FLT_EPSILON;
        yb = yb + FLT_EPSILON;
      }
      const float d = xn - yb;
      const float q = d / yb;
      r.values[i] = std::fabs(static_cast<double>(q));
    } else {
      double xn = x[i], yb = y[i];
      if (y[i] == 0) {
        xn += DBL_EPSILON;
        yb += DBL_EPSILON;
      }
      r.values[i] = std::fabs((xn - yb) / yb);
    }
  }
  return r;
}

// np.max(np.abs(rel)) as msprobe's GetMaxRelativeErr writes it.
inline std::string max_relative_cell(const RelativeError& rel) {
  double m = -INFINITY;
  for (const double v : rel.values) {
    if (std::isnan(v)) return "Nan";
    m = std::max(m, v);
  }
  return tensor_cell(py_format_value(m));
}

inline long double dot(const double* a, const double* b, std::size_t n) {
  long double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<long double>(a[i]) * b[i];
  return s;
}

// The 0-d path: ValidateTensor stops at _check_scalar (no inf/nan or dtype check), and only the
// two maximum errors are computed, in numpy's arithmetic of the two dtypes.
inline TensorCells scalar_cells(const at::Tensor& n0, const at::Tensor& b0) {
  TensorCells c;
  c.fill("unsupported");
  const at::Tensor nd = n0.to(at::kDouble).reshape({1}).contiguous(), bd = b0.to(at::kDouble).reshape({1}).contiguous();
  const RelativeError rel = relative_error(n0, b0, nd, bd);
  at::Tensor n = n0, b = b0;
  if (n.scalar_type() == at::kBool) {  // reshape_value: a bool 0-d NPU value makes both float64
    n = n.to(at::kDouble);
    b = b.to(at::kDouble);
  }
  const at::ScalarType t = numpy_promote(n.scalar_type(), b.scalar_type());
  const double abs_err = (n.to(t) - b.to(t)).abs().to(at::kDouble).item<double>();
  c[2] = std::isnan(abs_err) ? "Nan" : tensor_cell(py_format_value(abs_err));
  c[3] = max_relative_cell(rel);
  return c;
}

}  // namespace details

// The six cells for two tensors as read_pt_values returns them.
inline TensorCells tensor_cells(const at::Tensor& n, const at::Tensor& b) {
  TensorCells c;
  if (n.numel() == 0) {  // _check_empty (the NPU side only, as msprobe)
    c.fill("unsupported");
    return c;
  }
  if (n.sizes() != b.sizes()) {  // _check_shape, on the squeezed shapes
    c.fill("shape unmatched");
    return c;
  }
  if (n.dim() == 0) return details::scalar_cells(n, b);  // _check_scalar
  at::Tensor nd = n.to(at::kDouble).reshape({-1}).contiguous().clone();
  at::Tensor bd = b.to(at::kDouble).reshape({-1}).contiguous().clone();
  // _check_nan_inf: inf/nan at the same places on both sides are zeroed (the sign of an inf is not
  // compared); anywhere else, no metric.
  const at::Tensor n_inf = nd.isinf(), b_inf = bd.isinf(), n_nan = nd.isnan(), b_nan = bd.isnan();
  if ((n_inf | n_nan).any().item<bool>() || (b_inf | b_nan).any().item<bool>()) {
    if (!at::equal(n_inf, b_inf) || !at::equal(n_nan, b_nan)) {
      c.fill("N/A");
      return c;
    }
    nd.masked_fill_(n_inf | n_nan, 0.0);
    bd.masked_fill_(b_inf | b_nan, 0.0);
  }
  const details::RelativeError rel = details::relative_error(n, b, nd, bd);
  const double* x = nd.data_ptr<double>();
  const double* y = bd.data_ptr<double>();
  const auto count = static_cast<std::size_t>(nd.numel());

  // Cosine: n.b / (|n| |b|); both norms at most float64's epsilon: 1.0; one of them: Nan.
  const double nn = std::sqrt(static_cast<double>(details::dot(x, x, count)));
  const double bb = std::sqrt(static_cast<double>(details::dot(y, y, count)));
  if (count == 1) {
    c[0] = "unsupported";
  } else if (nn <= DBL_EPSILON && bb <= DBL_EPSILON) {
    c[0] = "1.0";
  } else if (nn <= DBL_EPSILON || bb <= DBL_EPSILON) {
    c[0] = "Nan";
  } else {
    const double cos = static_cast<double>(details::dot(x, y, count)) / (nn * bb);
    if (std::isnan(cos)) {
      c[0] = "Nan";
    } else {
      double v = details::py_format_value(cos);
      if (v > 0.9999) {  // correct_data: round(v, 6)
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.6f", v);
        v = std::strtod(buf, nullptr);
      }
      c[0] = details::tensor_cell(v);
    }
  }
  // EucDist |n - b| (not passed through format_value), MaxAbsErr max |n - b|, both in float64.
  std::vector<double> d(count);
  double max_abs = -INFINITY;
  bool abs_nan = false;
  for (std::size_t i = 0; i < count; ++i) {
    d[i] = x[i] - y[i];
    const double a = std::fabs(d[i]);
    abs_nan = abs_nan || std::isnan(a);
    max_abs = std::max(max_abs, a);
  }
  c[1] = details::tensor_cell(std::sqrt(static_cast<double>(details::dot(d.data(), d.data(), count))));
  c[2] = abs_nan ? "Nan" : details::tensor_cell(details::py_format_value(max_abs));
  c[3] = details::max_relative_cell(rel);
  // The share of elements whose relative error is under 0.001 / 0.005, compared in the relative
  // error's own type (numpy turns the Python float threshold into float32 for a float32 array).
  const auto ratio = [&](double threshold) {
    const double t = rel.in_float32 ? static_cast<double>(static_cast<float>(threshold)) : threshold;
    std::size_t under = 0;
    for (const double v : rel.values) under += v < t ? 1 : 0;
    return details::tensor_cell(details::py_format_value(static_cast<double>(under) / static_cast<double>(count)));
  };
  c[4] = ratio(0.001);
  c[5] = ratio(0.005);
  return c;
}

// The cells for two .pt files; a file that cannot be read gives msprobe's "unsupported" six times
// (its READ_NONE). `error`, when given, receives why.
inline TensorCells pt_tensor_cells(const std::filesystem::path& npu_file, const std::filesystem::path& bench_file,
                                   std::string* error = nullptr) {
  try {
    return tensor_cells(read_pt_values(npu_file), read_pt_values(bench_file));
  } catch (const std::exception& e) {
    if (error) *error = e.what();
    TensorCells c;
    c.fill("unsupported");
    return c;
  }
}

}  // namespace torchprobe::compare

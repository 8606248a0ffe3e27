#pragma once
// Statistics of a CPU tensor, one pass over its memory.
//
// This is the reference kernel: scalar, accumulating in double, exact for Max/Min. The fused SIMD
// kernels replace the inner loops behind `cpu_stats` without changing its contract.
#include <ATen/ATen.h>
#include <c10/util/Half.h>
#include <c10/util/BFloat16.h>
#include <c10/util/complex.h>

#include <cmath>
#include <limits>

#include "tensor_stats.hpp"
#include "../details/probe_guard.hpp"

namespace torchprobe::stats {
namespace detail {

// Floating dtypes: Max/Min exact in the dtype (every f16/bf16/f32 value is a double exactly),
// Mean/Norm accumulated in double so fp16/bf16 never round in their own precision.
// NaN anywhere makes all four NaN, as torch.max/min/mean/norm do.
template <class T>
TensorStats floating(const T* p, std::int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  double mn = std::numeric_limits<double>::infinity();
  double sum = 0.0, sumsq = 0.0;
  for (std::int64_t k = 0; k < n; ++k) {
    const double v = static_cast<double>(static_cast<float>(p[k]));
    mx = v > mx ? v : mx;
    mn = v < mn ? v : mn;
    sum += v;
    sumsq += v * v;
  }
  // A NaN is invisible to the comparisons above but poisons sumsq (x*x is never negative), so
  // sumsq tells whether one was present without a compare in the loop.
  if (std::isnan(sumsq)) mx = mn = std::numeric_limits<double>::quiet_NaN();
  const double nd = static_cast<double>(n);
  return {StatValue::real(mx), StatValue::real(mn), StatValue::real(sum / nd), StatValue::real(std::sqrt(sumsq))};
}

template <>
inline TensorStats floating<double>(const double* p, std::int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  double mn = std::numeric_limits<double>::infinity();
  double sum = 0.0, sumsq = 0.0;
  for (std::int64_t k = 0; k < n; ++k) {
    const double v = p[k];
    mx = v > mx ? v : mx;
    mn = v < mn ? v : mn;
    sum += v;
    sumsq += v * v;
  }
  if (std::isnan(sumsq)) mx = mn = std::numeric_limits<double>::quiet_NaN();
  return {StatValue::real(mx), StatValue::real(mn), StatValue::real(sum / static_cast<double>(n)),
          StatValue::real(std::sqrt(sumsq))};
}

template <class T>
TensorStats integral(const T* p, std::int64_t n) {
  T mx = p[0], mn = p[0];
  double sum = 0.0, sumsq = 0.0;
  for (std::int64_t k = 0; k < n; ++k) {
    const T v = p[k];
    mx = v > mx ? v : mx;
    mn = v < mn ? v : mn;
    const double dv = static_cast<double>(v);
    sum += dv;
    sumsq += dv * dv;
  }
  return {StatValue::integer(static_cast<std::int64_t>(mx)), StatValue::integer(static_cast<std::int64_t>(mn)),
          StatValue::real(sum / static_cast<double>(n)), StatValue::real(std::sqrt(sumsq))};
}

// bool: Max = any, Min = all; Mean/Norm are not defined (msprobe writes null).
inline TensorStats boolean(const bool* p, std::int64_t n) {
  bool any = false, all = true;
  for (std::int64_t k = 0; k < n; ++k) {
    any = any || p[k];
    all = all && p[k];
  }
  return {StatValue::boolean(any), StatValue::boolean(all), StatValue::null(), StatValue::null()};
}

// complex: statistics of |z|; Norm = sqrt(sum |z|^2), the tensor's L2 norm.
template <class T>
TensorStats complex_abs(const c10::complex<T>* p, std::int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  double mn = std::numeric_limits<double>::infinity();
  double sum = 0.0, sumsq = 0.0;
  for (std::int64_t k = 0; k < n; ++k) {
    const double re = static_cast<double>(static_cast<float>(p[k].real()));
    const double im = static_cast<double>(static_cast<float>(p[k].imag()));
    const double a = std::hypot(re, im);
    mx = a > mx ? a : mx;
    mn = a < mn ? a : mn;
    sum += a;
    sumsq += re * re + im * im;
  }
  if (std::isnan(sumsq)) mx = mn = std::numeric_limits<double>::quiet_NaN();
  return {StatValue::real(mx), StatValue::real(mn), StatValue::real(sum / static_cast<double>(n)),
          StatValue::real(std::sqrt(sumsq))};
}

template <>
inline TensorStats complex_abs<double>(const c10::complex<double>* p, std::int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  double mn = std::numeric_limits<double>::infinity();
  double sum = 0.0, sumsq = 0.0;
  for (std::int64_t k = 0; k < n; ++k) {
    const double re = p[k].real(), im = p[k].imag();
    const double a = std::hypot(re, im);
    mx = a > mx ? a : mx;
    mn = a < mn ? a : mn;
    sum += a;
    sumsq += re * re + im * im;
  }
  if (std::isnan(sumsq)) mx = mn = std::numeric_limits<double>::quiet_NaN();
  return {StatValue::real(mx), StatValue::real(mn), StatValue::real(sum / static_cast<double>(n)),
          StatValue::real(std::sqrt(sumsq))};
}

// msprobe's 0-d rule: the value itself in all four keys (Norm keeps its sign). bool keeps its
// own rule (any/all, null Mean/Norm), as msprobe checks bool first.
inline TensorStats zero_dim_rule(TensorStats s) {
  if (s.max.kind == StatValue::Kind::Bool) return s;
  s.mean = s.norm = StatValue::real(s.max.as_double());
  return s;
}

}  // namespace detail

// Dtypes the probe can summarise; others (quantized, float8, ...) get null statistics.
inline bool has_cpu_kernel(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
    case at::kBool: case at::kComplexFloat: case at::kComplexDouble:
      return true;
    default:
      return false;
  }
}

// Statistics of a CPU tensor of any layout. Empty tensors and unsupported dtypes give nulls.
inline TensorStats cpu_stats(const at::Tensor& tensor) {
  if (!tensor.defined() || tensor.numel() == 0 || !has_cpu_kernel(tensor.scalar_type()) ||
      !tensor.has_storage() || tensor.is_meta())
    return {};
  ProbeGuard guard;  // a strided input is copied; that copy must not be recorded or tracked
  const at::Tensor t = tensor.is_contiguous() ? tensor : tensor.contiguous();
  const std::int64_t n = t.numel();
  TensorStats s;
  switch (t.scalar_type()) {
    case at::kFloat: s = detail::floating(t.data_ptr<float>(), n); break;
    case at::kDouble: s = detail::floating(t.data_ptr<double>(), n); break;
    case at::kHalf: s = detail::floating(t.data_ptr<c10::Half>(), n); break;
    case at::kBFloat16: s = detail::floating(t.data_ptr<c10::BFloat16>(), n); break;
    case at::kByte: s = detail::integral(t.data_ptr<std::uint8_t>(), n); break;
    case at::kChar: s = detail::integral(t.data_ptr<std::int8_t>(), n); break;
    case at::kShort: s = detail::integral(t.data_ptr<std::int16_t>(), n); break;
    case at::kInt: s = detail::integral(t.data_ptr<std::int32_t>(), n); break;
    case at::kLong: s = detail::integral(t.data_ptr<std::int64_t>(), n); break;
    case at::kBool: s = detail::boolean(t.data_ptr<bool>(), n); break;
    case at::kComplexFloat: s = detail::complex_abs(t.data_ptr<c10::complex<float>>(), n); break;
    case at::kComplexDouble: s = detail::complex_abs(t.data_ptr<c10::complex<double>>(), n); break;
    default: return {};
  }
  return t.dim() == 0 ? detail::zero_dim_rule(s) : s;
}

}  // namespace torchprobe::stats

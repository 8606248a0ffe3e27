#pragma once
// free_benchmark's six perturbations of a call's inputs (msprobe-reference.md §7.2), on boxed values.
// Everything here runs under the caller's ProbeGuard and makes new tensors: nothing the user holds
// is changed.
//  - add_noise, bit_noise, change_value perturb one tensor: the first eligible floating tensor of the
//    call's first valid argument (the first positional one that is a floating tensor or a list);
//  - improve_precision turns every fp16/bf16 tensor into fp32, to_cpu moves every tensor to the CPU
//    (fp16/bf16 into fp32 as well); no_change re-runs the call as it is.
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <vector>

#include "torchprobe/config/types.hpp"

namespace torchprobe::free_benchmark {

// msprobe's FuzzThreshold by dtype: the noise add_noise adds, the smallest max|x| the noises act on,
// and (square-rooted) the comparison's abs_tol.
inline std::optional<double> epsilon(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return 1e-4;
    case at::kHalf: return 1e-6;
    case at::kFloat: return 1e-8;
    case at::kDouble: return 1e-16;
    default: return std::nullopt;
  }
}

// finfo(dtype).smallest_normal: bit_noise flips the last mantissa bit of values above it.
inline double smallest_normal(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return 6.103515625e-05;  // 2^-14
    case at::kBFloat16:
    case at::kFloat: return static_cast<double>(std::numeric_limits<float>::min());
    default: return std::numeric_limits<double>::min();
  }
}

inline bool is_floating(const at::Tensor& t) {
  return t.defined() && !t.is_meta() && t.layout() == c10::kStrided && at::isFloatingType(t.scalar_type());
}

// add_noise's and bit_noise's pre-check: a known dtype, elements, and max|x| >= eps. On a device the
// maximum is not read back (no host synchronisation per call): the perturbation carries the test.
inline bool noise_may_apply(const at::Tensor& t) {
  const auto eps = epsilon(t.scalar_type());
  if (!eps || t.numel() == 0) return false;
  if (!t.device().is_cpu()) return true;
  return t.abs().max().item<double>() >= *eps;
}

// On a device, the perturbed tensor when max|x| >= eps, else the tensor itself.
inline at::Tensor unless_below_eps(const at::Tensor& t, const at::Tensor& perturbed) {
  if (t.device().is_cpu()) return perturbed;
  return at::where(t.abs().max() >= *epsilon(t.scalar_type()), perturbed, t);
}

// x' = where(|x| > sqrt(eps), x + eps, x), in x's dtype.
inline at::Tensor add_noise(const at::Tensor& t) {
  const double eps = *epsilon(t.scalar_type());
  const at::Tensor noise = at::full_like(t, eps);
  return unless_below_eps(t, at::where(at::gt(at::abs(t), std::sqrt(eps)), at::add(noise, t), t).to(t.scalar_type()));
}

// The last mantissa bit flipped (XOR 1 on the same-width integer view) where |x| > smallest normal.
inline at::Tensor bit_noise(const at::Tensor& t) {
  const at::ScalarType bits = t.element_size() == 2 ? at::kShort : (t.element_size() == 4 ? at::kInt : at::kLong);
  const at::Tensor as_int = t.contiguous().view(bits);
  const at::Tensor flipped = at::bitwise_xor(as_int, at::ones_like(as_int));
  const at::Tensor out = at::where(at::gt(at::abs(t), smallest_normal(t.scalar_type())), flipped, as_int);
  return unless_below_eps(t, out.view(t.scalar_type()));
}

// change_value's condition: 1-D with >= 2 elements, or >= 2-D where t[0][0] and t[-1][-1] exist and
// are not both the same single element.
inline bool can_swap_ends(const at::Tensor& t) {
  if (t.dim() == 0) return false;
  if (t.dim() == 1) return t.size(0) >= 2;
  return t.size(0) > 0 && t.size(1) > 0 && !(t.size(0) < 2 && t.size(1) < 2);
}

// A copy with t[0] and t[-1] (1-D) or t[0][0] and t[-1][-1] (sub-tensors from 3-D on) swapped.
inline at::Tensor change_value(const at::Tensor& t) {
  at::Tensor out = t.clone();
  at::Tensor first = t.dim() == 1 ? out.select(0, 0) : out.select(0, 0).select(0, 0);
  at::Tensor last = t.dim() == 1 ? out.select(0, -1) : out.select(0, -1).select(0, -1);
  const at::Tensor first_value = first.clone(), last_value = last.clone();
  first.copy_(last_value);
  last.copy_(first_value);
  return out;
}

// Rebuilds a boxed value with each tensor replaced by `f(tensor)` (an undefined result keeps it).
template <class F>
c10::IValue map_tensors(const c10::IValue& v, F& f) {
  if (v.isTensor()) {
    at::Tensor r = f(v.toTensor());
    return r.defined() ? c10::IValue(std::move(r)) : v;
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList().vec()) {
      at::Tensor r = f(t);
      out.push_back(r.defined() ? r : t);
    }
    return c10::IValue(std::move(out));
  }
  if (v.isList()) {
    c10::impl::GenericList out(v.toList().elementType());
    // Through toListRef(): a List's iterator yields proxies, and a reference to one would dangle.
    for (const c10::IValue& e : v.toListRef()) out.push_back(map_tensors(e, f));
    return c10::IValue(std::move(out));
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> items;
    for (const c10::IValue& e : v.toTupleRef().elements()) items.push_back(map_tensors(e, f));
    return c10::IValue(c10::ivalue::Tuple::create(std::move(items)));
  }
  return v;
}

// The index of the first positional input that is a floating tensor or a list (msprobe's
// check_args_type), or -1: the call is not checked.
template <class IsPositional>
std::ptrdiff_t first_valid_input(const std::vector<c10::IValue>& inputs, IsPositional&& positional) {
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!positional(i)) continue;
    const c10::IValue& v = inputs[i];
    if ((v.isTensor() && is_floating(v.toTensor())) || v.isList() || v.isTuple()) return static_cast<std::ptrdiff_t>(i);
  }
  return -1;
}

// Perturbs `inputs` in place (they are the probe's own copies of the boxed values) as `mode` says.
// Returns false when nothing was perturbed: the call is then not re-run.
inline bool perturb(PertMode mode, std::vector<c10::IValue>& inputs, std::ptrdiff_t valid) {
  bool done = false;
  switch (mode) {
    case PertMode::NoChange: return true;
    case PertMode::ImprovePrecision:
    case PertMode::ToCpu: {
      const bool to_cpu = mode == PertMode::ToCpu;
      auto raise = [&](const at::Tensor& t) -> at::Tensor {
        if (!t.defined() || t.is_meta()) return at::Tensor();
        const bool low = t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
        if (!low && !(to_cpu && !t.device().is_cpu())) return at::Tensor();
        done = true;
        at::Tensor r = to_cpu ? t.detach().to(at::kCPU) : t;
        return low ? r.to(at::kFloat) : r;
      };
      for (c10::IValue& v : inputs) v = map_tensors(v, raise);
      return done || mode == PertMode::ToCpu;  // to_cpu re-runs on the CPU even with nothing to convert
    }
    case PertMode::AddNoise:
    case PertMode::BitNoise:
    case PertMode::ChangeValue: {
      auto once = [&](const at::Tensor& t) -> at::Tensor {
        if (done || !is_floating(t)) return at::Tensor();
        if (mode == PertMode::ChangeValue) {
          if (!can_swap_ends(t)) return at::Tensor();
          done = true;
          return change_value(t);
        }
        if (!noise_may_apply(t)) return at::Tensor();
        done = true;
        return mode == PertMode::AddNoise ? add_noise(t) : bit_noise(t);
      };
      if (valid >= 0)
        inputs[static_cast<std::size_t>(valid)] = map_tensors(inputs[static_cast<std::size_t>(valid)], once);
      return done;
    }
  }
  return false;
}

}  // namespace torchprobe::free_benchmark

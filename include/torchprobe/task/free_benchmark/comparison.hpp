#pragma once
// free_benchmark's comparison of an original output with the perturbed re-run's (msprobe-reference.md
// §7.3). The numbers are computed where the tensors are, as small tensors that are read back in one
// batch when the step is flushed (resolve()): no host synchronisation per call.
//  - ratio modes: the original converted to the perturbed dtype and device; abs_tol = sqrt(eps) of
//    the perturbed dtype; per chunk (clamp(2^(int(log2 MB) - 4), 1, 128) of them) symbol flipping
//    (min(a*b) < -abs_tol^2) and r = nan_to_num(clamp(|a|, abs_tol) / clamp(|b|, abs_tol), nan=1);
//    ratio = max(max r, 1/min r); consistent iff thd >= ratio >= 1/thd, thd by the original dtype;
//  - to_cpu: msprobe's single-benchmark standard in float64 against the CPU result;
//  - integer and boolean tensors: exactly equal.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "torchprobe/config/types.hpp"
#include "torchprobe/task/free_benchmark/perturbation.hpp"

namespace torchprobe::free_benchmark {

// One compared output (or output element) of a call.
struct Comparison {
  enum class Kind { Ratio, Benchmark, Exact, Scalar };
  Kind kind = Kind::Ratio;
  std::optional<int64_t> index;  // which output, for tuple/list outputs
  // to_cpu: part of a tuple/list output, which msprobe's compare_seq judges as a whole: one row for
  // the call, without output_index, dtype or shape.
  bool in_sequence = false;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  double threshold = 1.0;  // ratio modes
  at::Tensor values;       // on the device until resolved: [chunks, 3] / [4] / [1] doubles
  // Resolved:
  bool consistent = true;
  bool flipped = false;
  std::optional<double> ratio;  // ratio modes (and float scalars); empty for to_cpu and integers
  double score = 1.0;           // for the summary's ordering: the ratio, or to_cpu's worst error / its bound
};

// The consistency threshold for an original output of this dtype.
inline double ratio_threshold(at::ScalarType original, PertMode mode) {
  if (mode == PertMode::NoChange) return 1.0;
  switch (original) {
    case at::kHalf: return 1.002;
    case at::kBFloat16: return 1.004;
    default: return 1.0002;
  }
}

// msprobe's tensor_split_for_error_calculate: chunks by the size of the compared tensor.
inline int64_t chunk_count(const at::Tensor& t) {
  const double mb = static_cast<double>(t.element_size()) * static_cast<double>(t.numel()) / (1024.0 * 1024.0);
  if (mb == 0 || t.dim() == 0) return 1;
  const auto exp = static_cast<int64_t>(std::log2(mb));  // int() truncates towards zero
  const double chunks = std::pow(2.0, static_cast<double>(exp - 4));
  return static_cast<int64_t>(std::clamp(chunks, 1.0, 128.0));
}

// clamp(x, min=bound), NaN kept; written with where(): the CPU has no fp16 clamp in libtorch 1.13.
inline at::Tensor at_least(const at::Tensor& x, double bound) {
  return at::where(at::lt(x, bound), at::full({}, bound, x.options()), x);
}

// abs_tol: sqrt(eps) of the perturbed dtype in the forward stage, 1e-3 in the backward stage.
inline Comparison compare_ratio(const at::Tensor& original, const at::Tensor& perturbed, PertMode mode,
                                std::optional<double> tolerance = std::nullopt) {
  Comparison c;
  c.dtype = original.scalar_type();
  c.shape = original.sizes().vec();
  if (original.sizes() != perturbed.sizes() || !at::isFloatingType(original.scalar_type()) ||
      !at::isFloatingType(perturbed.scalar_type())) {
    c.kind = Comparison::Kind::Exact;  // integers, booleans (and a re-run of another shape): equal or not
    c.values = original.sizes() != perturbed.sizes()
                   ? at::zeros({1}, at::kDouble)
                   : at::eq(original, perturbed.to(original.device(), original.scalar_type()))
                         .all()
                         .to(at::kDouble)
                         .reshape({1});
    return c;
  }
  c.threshold = ratio_threshold(original.scalar_type(), mode);
  const double abs_tol = tolerance.value_or(std::sqrt(epsilon(perturbed.scalar_type()).value_or(1e-8)));
  const at::Tensor a = original.to(perturbed.device(), perturbed.scalar_type()).reshape({-1});
  const at::Tensor b = perturbed.reshape({-1});
  if (a.numel() == 0) {
    c.values = at::tensor({0.0, 1.0, 1.0}, at::kDouble).reshape({1, 3});
    return c;
  }
  std::vector<at::Tensor> rows;
  const auto chunks_a = at::tensor_split(a, chunk_count(a)), chunks_b = at::tensor_split(b, chunk_count(a));
  for (std::size_t i = 0; i < chunks_a.size(); ++i) {
    if (chunks_a[i].numel() == 0) break;
    const at::Tensor flip = at::lt(at::mul(chunks_a[i], chunks_b[i]).min(), -(abs_tol * abs_tol));
    const at::Tensor r =
        at::nan_to_num(at::div(at_least(at::abs(chunks_a[i]), abs_tol), at_least(at::abs(chunks_b[i]), abs_tol)), 1.0);
    rows.push_back(at::stack({flip.to(at::kDouble), r.min().to(at::kDouble), r.max().to(at::kDouble)}));
  }
  c.values = at::stack(rows);
  return c;
}

// to_cpu: the original (actual) against the CPU result (golden), in float64 on the original's device.
inline Comparison compare_benchmark(const at::Tensor& original, const at::Tensor& golden) {
  Comparison c;
  c.kind = Comparison::Kind::Benchmark;
  c.dtype = original.scalar_type();
  c.shape = original.sizes().vec();
  if (!at::isFloatingType(original.scalar_type()) || original.sizes() != golden.sizes()) {
    Comparison exact = compare_ratio(original, golden, PertMode::ToCpu);
    exact.kind = Comparison::Kind::Exact;
    return exact;
  }
  at::Tensor a = original.to(at::kDouble);
  a = at::where(at::isfinite(a), a, at::ones_like(a));  // inf/nan in the actual count as 1
  const at::Tensor g = golden.to(original.device(), at::kDouble);
  const at::Tensor diff = a - g, diff_abs = diff.abs(), g_abs = g.abs();
  const at::Tensor zero = at::zeros({}, a.options());
  const at::Tensor abs_err = a.numel() ? at::where(a.abs() < 1.0, diff_abs, zero).max() : zero;
  const at::Tensor rel_err = a.numel() ? at::where(a.abs() >= 1.0, diff_abs / g_abs, zero).max() : zero;
  const at::Tensor eb = a.numel() ? (diff / at::where(g_abs >= 1.0, g_abs, at::ones_like(g_abs))).mean() : zero;
  const at::Tensor golden_bad = (~at::isfinite(g)).any().to(at::kDouble);
  c.values = at::stack({golden_bad, abs_err, rel_err, eb});
  return c;
}

// {rtol (= small-value atol), err_balance} of the single-benchmark standard, by the original dtype.
struct BenchmarkBounds {
  double rtol, small_value_atol, err_balance;
};
inline BenchmarkBounds benchmark_bounds(at::ScalarType original) {
  switch (original) {
    case at::kHalf: return {std::ldexp(1.0, -11), std::ldexp(1.0, -11), 1e-4};
    case at::kBFloat16: return {std::ldexp(1.0, -8), std::ldexp(1.0, -8), 1e-4};
    default: return {std::ldexp(1.0, -14), std::ldexp(1.0, -14), 1e-4};
  }
}

// The decision from values read back to the CPU (doubles).
inline void decide(Comparison& c, const double* v, int64_t n) {
  switch (c.kind) {
    case Comparison::Kind::Scalar: return;  // decided when compared
    case Comparison::Kind::Exact:
      c.consistent = n > 0 && v[0] == 1.0;
      c.score = c.consistent ? 1.0 : std::numeric_limits<double>::infinity();
      return;
    case Comparison::Kind::Benchmark: {
      const BenchmarkBounds b = benchmark_bounds(c.dtype);
      if (v[0] != 0.0) {  // a golden with inf/nan is not judged (msprobe)
        c.consistent = true;
        c.score = 0.0;
        return;
      }
      c.score = std::max({v[1] / b.small_value_atol, v[2] / b.rtol, v[3] / b.err_balance});
      c.consistent = !(v[1] > b.small_value_atol) && !(v[2] > b.rtol) && !(v[3] > b.err_balance);
      return;
    }
    case Comparison::Kind::Ratio: {
      double ratio = 1.0;
      for (int64_t row = 0; row < n / 3; ++row) {
        const double* r = v + 3 * row;
        if (r[0] != 0.0) {
          c.flipped = true;
          c.consistent = false;
          c.score = std::numeric_limits<double>::infinity();
          return;
        }
        const double reciprocal = r[1] == 0.0 ? std::numeric_limits<double>::infinity() : 1.0 / r[1];
        ratio = row == 0 ? std::max(r[2], reciprocal) : std::max({ratio, r[2], reciprocal});
      }
      c.ratio = ratio;
      c.score = ratio;
      c.consistent = c.threshold >= ratio && ratio >= 1.0 / c.threshold;
      return;
    }
  }
}

// Reads every pending comparison back, one copy per device, and decides them.
inline void resolve(std::vector<Comparison*>& pending) {
  std::map<std::string, std::vector<Comparison*>> by_device;
  for (Comparison* c : pending)
    if (c->values.defined()) by_device[c->values.device().str()].push_back(c);
  for (auto& [device, group] : by_device) {
    std::vector<at::Tensor> flat;
    for (Comparison* c : group) flat.push_back(c->values.reshape({-1}).to(at::kDouble));
    const at::Tensor host = at::cat(flat).to(at::kCPU).contiguous();
    const double* p = host.data_ptr<double>();
    for (Comparison* c : group) {
      const int64_t n = c->values.numel();
      decide(*c, p, n);
      p += n;
      c->values = at::Tensor();
    }
  }
  pending.clear();
}

}  // namespace torchprobe::free_benchmark

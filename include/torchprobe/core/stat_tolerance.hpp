#pragma once
// How far two dumps' statistics of one tensor may differ before the tensor counts as diverging:
// the rule `torchprobe compare` judges with (analysis/compare/judge.hpp, "tol" mode) and the live
// check applies while training runs (task/live_check.hpp). Here so that both use one rule without
// the probe including the analysis component.
//
// Each statistic's difference is relative to the tensor's range -- |dMax|, |dMin|, |dMean| over
// max(|Max|, |Min|) of either side, |dNorm| over the larger Norm -- in units of the dtype's epsilon
// (float32 2^-23, float16 2^-10, bfloat16 2^-7, float64 2^-52; integers and bools must be equal).
// When a side's Mean and Norm are float sums (msprobe's Python dumps), what they differ by is
// counted beyond n/1024 epsilons for n elements (analysis/compare/statistics_origin.hpp says why).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>

namespace torchprobe {

// Rounding one element moves a statistic by at most eps/2 of the range, and a reduction of n
// elements in another order moves a mean or norm by about log2(n) eps: 64 covers reordered kernels
// of up to 2^60 elements while a layer computed in bfloat16 (about 2^16 float32 epsilons off)
// stands out by three orders.
constexpr double kDefaultTolEpsilons = 64;
constexpr double kStatInf = std::numeric_limits<double>::infinity();
// The float sums' allowance, in epsilons per element.
constexpr double kAccumulationEpsilonsPerElement = 1.0 / 1024;

// The epsilon of a dtype as dump.json names it; 0 for dtypes compared exactly.
inline double dtype_epsilon(std::string_view dtype) {
  if (dtype == "torch.float32" || dtype == "torch.complex64") return std::ldexp(1.0, -23);
  if (dtype == "torch.float16") return std::ldexp(1.0, -10);
  if (dtype == "torch.bfloat16") return std::ldexp(1.0, -7);
  if (dtype == "torch.float64" || dtype == "torch.complex128" || dtype == "<class 'float'>")
    return std::ldexp(1.0, -52);
  return 0;  // integers, bools, everything else: exact
}

// The dtypes whose Mean and Norm msprobe sums in their own precision.
inline bool float_dtype(std::string_view d) {
  return d == "torch.float16" || d == "torch.float32" || d == "torch.bfloat16";
}

// The error of statistic `s` (0 Max, 1 Min, 2 Mean, 3 Norm) between values x and y, in epsilons:
// `amax` is the larger |Max| or |Min| of both sides (finite ones), `eps` the dtype's epsilon (0:
// any difference is infinite), `sum_allowance` what Mean and Norm may differ by for free (the
// float sums' allowance, 0 when neither side sums in floats). NaN equals NaN; infinities must be
// equal.
inline double statistic_error(int s, double x, double y, double amax, double eps, double sum_allowance = 0) {
  if (std::isnan(x) && std::isnan(y)) return 0;
  if (!std::isfinite(x) || !std::isfinite(y)) return x == y ? 0 : kStatInf;
  if (x == y) return 0;
  if (eps == 0) return kStatInf;
  const double scale = s < 3 ? amax : std::max(std::fabs(x), std::fabs(y));
  const double e = scale == 0 ? kStatInf : std::fabs(x - y) / scale / eps;
  return s >= 2 ? std::max(0.0, e - sum_allowance) : e;
}

// The dtypes an input may arrive in from the other side's precision (a layer run in bfloat16 gets
// its input cast from float32): such an input is judged as a cast, not as a difference.
inline bool castable_dtype(std::string_view d) { return float_dtype(d) || d == "torch.float64"; }

// The coarser of two dtypes, the one an input cast between them is judged in (either side's own
// text: a std::string of the live check's reference, a TextRef of compare's rows).
template <class Dtype>
const Dtype& coarser_dtype(const Dtype& a, const Dtype& b) {
  return dtype_epsilon(a) > dtype_epsilon(b) ? a : b;
}

// A cast input's error, from `coarse_error` (its error in the coarser dtype's epsilons): within 2
// of them it is the cast's rounding (0); beyond, it counts in the finer dtype's epsilons, as any
// other difference does.
inline double cast_input_error(double coarse_error, std::string_view a, std::string_view b) {
  const double coarse = std::max(dtype_epsilon(a), dtype_epsilon(b));
  const double fine = std::min(dtype_epsilon(a), dtype_epsilon(b));
  return coarse_error <= 2 ? 0 : coarse_error * coarse / fine;
}

// An entry whose outputs diverge by more than this many times its inputs' error introduced the
// divergence (it is a source); below, it carries what it was given.
constexpr double kSourceFactor = 10;
inline bool is_source(bool outputs_diverge, double output_error, double input_error) {
  return outputs_diverge && output_error > kSourceFactor * input_error;
}

}  // namespace torchprobe

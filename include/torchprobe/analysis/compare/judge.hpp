#pragma once
// Whether a paired row, and a paired entry, diverges.
//   exact    bit-equal: equal statistics (equal CRC-32 in md5 dumps); error 0 or infinity.
//   tol      compare's tolerance (core/stat_tolerance.hpp, which the live check shares): each
//            statistic's difference relative to the tensor's range in units of the dtype's epsilon,
//            default threshold 64 epsilons.
//   msprobe  msprobe's own Result: a row diverges when msprobe marks it "error".
// Dtype or shape differences are infinite errors in every mode. In tol mode, when a side's Mean and
// Norm are float sums (msprobe's), their error is what exceeds the accumulation allowance of
// statistics_origin.hpp (n/1024 epsilons for n elements): the bench's rounding is no divergence.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "torchprobe/analysis/compare/matching.hpp"
#include "torchprobe/core/stat_tolerance.hpp"
#include "torchprobe/analysis/compare/msprobe_table.hpp"
#include "torchprobe/analysis/compare/statistics_origin.hpp"

namespace torchprobe::compare {

enum class JudgeMode { exact, tol, msprobe };
inline const char* judge_mode_name(JudgeMode m) {
  return m == JudgeMode::exact ? "exact" : m == JudgeMode::tol ? "tol" : "msprobe";
}
using torchprobe::dtype_epsilon;
using torchprobe::kDefaultTolEpsilons;
constexpr double kInf = kStatInf;

namespace details {
inline std::optional<double> number(const Json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  if (v.is_string()) {
    const std::string s = lower(v.get<std::string>());
    if (s == "nan") return std::nan("");
    if (s == "inf") return kInf;
    if (s == "-inf") return -kInf;
  }
  return std::nullopt;
}

// py_str(a) == py_str(b), without making the texts when both are doubles: Python's repr names each
// double apart (-0.0 too), and every NaN "nan".
inline bool same_text(const Json& a, const Json& b) {
  if (a.is_number_float() && b.is_number_float()) {
    const double x = a.get<double>(), y = b.get<double>();
    return (std::isnan(x) && std::isnan(y)) || (x == y && std::signbit(x) == std::signbit(y));
  }
  return py_str(a) == py_str(b);
}

inline std::string reversed_shape(std::string_view shape) {
  if (shape.size() < 2 || shape.front() != '[') return std::string(shape);
  std::vector<std::string> dims;
  std::string cur;
  for (const char c : shape.substr(1, shape.size() - 2)) {
    if (c == ',') {
      dims.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur += c;
    }
  }
  if (!cur.empty()) dims.push_back(cur);
  std::string out = "[";
  for (std::size_t i = dims.size(); i-- > 0;) out += dims[i] + (i ? ", " : "");
  return out + "]";
}
}  // namespace details

// A paired row's error in the mode's unit (epsilons for tol; 0 or infinity for exact).
// `float_sums`: a side's Mean and Norm are float sums, so theirs count beyond the allowance only.
// A Python number passed as an argument: str(type(value)) of an int or a float.
inline bool python_number_class(std::string_view dtype) {
  return dtype == "<class 'int'>" || dtype == "<class 'float'>";
}

inline double row_error(const RowLink& l, JudgeMode mode, bool md5, bool float_sums = false) {
  const Row& t = *l.target;
  const Row& b = *l.bench;
  // The same number written int on one side and float on the other (Python passes softplus's beta
  // as 1, C++ as 1.0) is judged as floats; any other dtype difference is a divergence.
  const bool int_and_float = t.dtype != b.dtype && python_number_class(t.dtype) && python_number_class(b.dtype);
  if (t.dtype != b.dtype && !int_and_float) return kInf;
  if (l.reshaped ? details::shape_numel(b.shape) != details::shape_numel(t.shape)
                 : (l.transposed ? details::reversed_shape(b.shape) != t.shape.view() : b.shape != t.shape))
    return kInf;
  const double crc = t.md5 == b.md5 ? 0 : kInf;
  // md5 dumps: exact mode is the checksum; tol mode judges the statistics they also carry (the
  // checksum only where there are none).
  // (An int and a float of one value have different checksums of their text: compared as numbers.)
  if (md5 && mode == JudgeMode::exact && !int_and_float) return crc;
  if (md5 && !int_and_float && !details::number(t.stat(0)) && !details::number(t.stat(3))) return crc;
  double amax = 0;
  for (const Row* r : {&t, &b}) {
    for (int s = 0; s < 2; ++s) {
      if (const auto v = details::number(r->stat(s)); v && std::isfinite(*v)) amax = std::max(amax, std::fabs(*v));
    }
  }
  const double eps = dtype_epsilon(int_and_float ? "<class 'float'>" : t.dtype);
  double worst = 0;
  for (int s = 0; s < 4; ++s) {
    const Json ts = t.stat(s), bs = b.stat(s);
    if (details::same_text(ts, bs)) continue;
    const auto x = details::number(ts), y = details::number(bs);
    if (!x || !y) {
      // msprobe leaves Mean and Norm of an integer tensor (indices, positions) null: a statistic
      // one side does not have is not compared, rather than judged as an error.
      const bool integer = dtype_epsilon(t.dtype) == 0 && t.dtype.rfind("torch.", 0) == 0;
      const auto none = [](const Json& v) { return v.is_null() || (v.is_string() && v.get<std::string>() == "None"); };
      if (integer && s >= 2 && (none(ts) || none(bs))) continue;
      return kInf;  // different non-numbers
    }
    const double allowance = float_sums && float_dtype(t.dtype) ? accumulation_allowance(t.shape) : 0;
    const double e = statistic_error(s, *x, *y, amax, mode == JudgeMode::exact ? 0 : eps, allowance);
    if (e == kInf) return kInf;
    worst = std::max(worst, e);
  }
  return worst;
}

struct EntryVerdict {
  const EntryPair* pair = nullptr;
  double input_error = 0, output_error = 0;
  std::string_view worst_input, worst_output;  // target row names
  bool inputs_diverge = false, outputs_diverge = false;
  bool source = false;                    // outputs diverge by more than 10x the inputs' error
  bool inputs_source = false;             // a source by its inputs (first_divergence.hpp)
  bool cast_inputs = false;               // some input is the other side's in another float precision
  std::size_t rows_within_allowance = 0;  // rows over the threshold but for the float sums' allowance
};

// An input that is the other side's values in another float precision (a layer run in bfloat16
// gets its input cast).
inline bool cast_input(const RowLink& l) {
  return !l.target->is_output() && l.target->dtype != l.bench->dtype && castable_dtype(l.target->dtype) &&
         castable_dtype(l.bench->dtype);
}

// Its error (core/stat_tolerance.hpp's rule, which the live check applies too): judged in the
// coarser precision, then counted in the finer one's epsilons beyond the cast's rounding.
inline double cast_input_error(const RowLink& l, JudgeMode mode, bool md5, bool float_sums) {
  Row t = *l.target, b = *l.bench;
  t.dtype = b.dtype = coarser_dtype(l.target->dtype, l.bench->dtype);
  RowLink cast = l;
  cast.target = &t;
  cast.bench = &b;
  return torchprobe::cast_input_error(row_error(cast, mode, md5, float_sums), l.target->dtype, l.bench->dtype);
}

// Judges one pair. `threshold` is in the mode's unit; `msprobe_levels` maps target rows to
// msprobe's verdict (used in msprobe mode).
inline EntryVerdict judge_pair(const EntryPair& p, JudgeMode mode, double threshold, bool md5,
                               const std::map<const Row*, int>& msprobe_levels, bool float_sums = false) {
  EntryVerdict v;
  v.pair = &p;
  for (const RowLink& l : p.links) {
    double e = 0;
    if (mode == JudgeMode::msprobe) {
      const auto it = msprobe_levels.find(l.target);
      e = it != msprobe_levels.end() && it->second >= 2 ? 1.0 : 0.0;
    } else if (cast_input(l)) {
      // An input that is the same values in another float precision: a layer run in bfloat16 gets
      // its input cast. Judged in the coarser precision's epsilons, so that the layer, whose output
      // then diverges, is the source rather than a victim of its own cast.
      e = cast_input_error(l, mode, md5, float_sums);
      v.cast_inputs = true;
    } else {
      e = row_error(l, mode, md5, float_sums);
      if (float_sums && e <= threshold && row_error(l, mode, md5) > threshold) ++v.rows_within_allowance;
    }
    const bool out = l.target->is_output();
    double& worst = out ? v.output_error : v.input_error;
    if (e > worst || ((out ? v.worst_output : v.worst_input).empty() && e == worst)) {
      worst = e;
      (out ? v.worst_output : v.worst_input) = l.target->name;
    }
  }
  v.inputs_diverge = v.input_error > threshold;
  v.outputs_diverge = v.output_error > threshold;
  v.source = is_source(v.outputs_diverge, v.output_error, v.input_error);
  return v;
}

// msprobe's verdict for every linked row, from a table built on the links themselves (so pairs
// made by templates or values get msprobe's rules as well).
// The table's rows are copies of the linked rows in `storage_t` / `storage_b`, keyed by their
// number (its text kept in storage_t's store).
inline std::map<const Row*, int> msprobe_levels(const Matching& m, CsvMode mode, RowSet& storage_t,
                                                std::vector<Row>& storage_b) {
  for (const EntryPair& p : m.pairs) {
    for (const RowLink& l : p.links) {
      std::vector<Row>& rows_t = storage_t.rows;
      rows_t.push_back(*l.target);
      rows_t.back().key = storage_t.text.keep(std::to_string(rows_t.size()));
      rows_t.back().set_entry(storage_t.text.own(RowEntry{p.target->name, p.target->key, p.target->index}));
      storage_b.push_back(*l.bench);
      storage_b.back().key = rows_t.back().key;
    }
  }
  const Table table = msprobe_table(storage_t.rows, storage_b, mode, false);
  std::map<const Row*, int> out;
  std::size_t i = 0;
  for (const EntryPair& p : m.pairs) {
    for (const RowLink& l : p.links) out[l.target] = table.rows[i++].level;
  }
  return out;
}

}  // namespace torchprobe::compare

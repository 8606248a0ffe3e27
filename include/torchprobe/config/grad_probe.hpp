#pragma once
// The "grad_probe" section: msprobe's GradToolConfig (msprobe-grad-probe-run-ut.md §A.1), each
// violation named by key, value and what is allowed. rank, step and dump_path are the common keys.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchprobe/config/readers.hpp"
#include "torchprobe/config/types.hpp"
#include "torchprobe/io/json_text.hpp"

namespace torchprobe {

namespace details {

// Python's str() of the number json.load makes of `v`: "-1" for an int, "0.5", "1.0", "1e-05" for a float.
inline std::string python_number_text(const json& v) {
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  return io::python_float_repr(v.get<double>());
}

// bounds: a list of int (not bool) or float numbers in int64 range, strictly ascending.
inline std::vector<GradBound> parse_grad_bounds(const json& value, const std::string& label) {
  const std::string allowed = "a list of strictly ascending numbers within the int64 range, such as [-1, 0, 1]";
  if (!value.is_array()) reject(label, value, "it should be a list", allowed);
  std::vector<GradBound> bounds;
  for (const json& item : value) {
    if (item.is_boolean() || !item.is_number())
      reject(label, value, "the element " + show(item) + " is not an int or a float", allowed);
    const bool too_large_int = item.is_number_unsigned() && item.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX);
    const double d = item.get<double>();
    // 2^63 is the first double above INT64_MAX; -2^63 is INT64_MIN itself.
    if (too_large_int || (item.is_number_float() && !(d >= -9223372036854775808.0 && d < 9223372036854775808.0)))
      reject(label, value, "the element " + show(item) + " is outside the int64 range", allowed);
    if (!bounds.empty() && !(bounds.back().value < d))
      reject(label, value, "it is not strictly ascending at " + show(item), allowed);
    bounds.push_back({d, python_number_text(item)});
  }
  return bounds;
}

// `label(key)` spells a key as the messages show it: "grad_probe.bounds".
template <class Label>
GradProbeConfig parse_grad_probe(const json& section, Label&& label) {
  GradProbeConfig g;
  static constexpr Choice<GradLevel> kLevels[] = {{"L0", GradLevel::L0}, {"L1", GradLevel::L1}, {"L2", GradLevel::L2}};
  g.grad_level = read_choice(section, "grad_level", label("grad_level"), kLevels, GradLevel::L1);
  g.param_list = read_string_list(section, "param_list", label("param_list"),
                                  "a list of parameter names as named_parameters() gives them ([] = every parameter)");
  if (const json* v = find(section, "bounds")) g.bounds = parse_grad_bounds(*v, label("bounds"));
  return g;
}

}  // namespace details

constexpr const char* grad_level_name(GradLevel l) {
  switch (l) {
    case GradLevel::L0: return "L0";
    case GradLevel::L1: return "L1";
    case GradLevel::L2: return "L2";
  }
  return "?";
}

}  // namespace torchprobe

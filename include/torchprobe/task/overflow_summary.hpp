#pragma once
// overflow_summary.json: which of a step's overflowing calls made the first inf/NaN, and which
// only passed it on. Built from the entries overflow_check kept (their statistics resolved), so
// it costs nothing until a step has an overflow. The schema is described in docs/overflow.md.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "torchprobe/core/names.hpp"
#include "torchprobe/core/record.hpp"

namespace torchprobe::overflow {

using Json = nlohmann::ordered_json;

// A Max or Min that is inf or NaN. Integer and bool statistics are always finite; null is not a value.
inline bool is_nonfinite_stat(const Json& v) { return v.is_number_float() && !std::isfinite(v.get<double>()); }

inline bool is_tensor_item(const Json& j) { return j.is_object() && j.contains("Max") && j.contains("type"); }

// Does any tensor item in `v` (an entry's body, or a part of it) have a non-finite Max or Min?
// msprobe's overflow test. Runs for every entry overflow_check sees, so it allocates nothing.
inline bool any_nonfinite_stat(const Json& v) {
  if (v.is_array()) {
    for (const Json& e : v)
      if (any_nonfinite_stat(e)) return true;
    return false;
  }
  if (!v.is_object()) return false;
  const auto max = v.find("Max");
  if (max != v.end()) {
    if (is_nonfinite_stat(*max)) return true;
    const auto min = v.find("Min");
    return min != v.end() && is_nonfinite_stat(*min);
  }
  for (const Json& e : v)
    if (any_nonfinite_stat(e)) return true;
  return false;
}

// Where the non-finite tensors of one entry are, split by side. Keys use msprobe's .pt spelling
// relative to the entry: "input.0", "input.1.0", "kwargs.bias", "output.0", "parameters.weight".
struct NonFiniteTensors {
  bool in_inputs = false;
  bool in_outputs = false;
  std::vector<std::string> keys;
};

namespace details {

inline void scan_value(const Json& v, const std::string& key, bool input, NonFiniteTensors& out) {
  if (is_tensor_item(v)) {
    if (is_nonfinite_stat(v["Max"]) || is_nonfinite_stat(v["Min"])) {
      (input ? out.in_inputs : out.in_outputs) = true;
      out.keys.push_back(key);
    }
    return;
  }
  if (v.is_array()) {
    std::size_t k = 0;
    for (const Json& e : v) scan_value(e, key + "." + std::to_string(k++), input, out);
  } else if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) scan_value(it.value(), key + "." + it.key(), input, out);
  }
}

}  // namespace details

// The sides of an entry: a forward entry's inputs are its arguments and a module's parameters;
// a backward entry's "input" are the gradients flowing in (msprobe's naming) and its "output"
// the gradients it produced. A parameters_grad entry ({"weight": [grad]}) holds only results.
inline NonFiniteTensors nonfinite_tensors(const Record& r) {
  NonFiniteTensors out;
  if (!r.body.is_object()) return out;
  for (auto it = r.body.begin(); it != r.body.end(); ++it) {
    const std::string& k = it.key();
    if (k == "input_args" || k == "input") {
      details::scan_value(it.value(), "input", true, out);
    } else if (k == "input_kwargs") {
      details::scan_value(it.value(), "kwargs", true, out);
    } else if (k == "parameters") {
      details::scan_value(it.value(), "parameters", true, out);
    } else if (k == "output") {
      details::scan_value(it.value(), "output", false, out);
    } else if (it.value().is_array() && it.value().size() == 1) {
      details::scan_value(it.value()[0], k, false, out);  // a parameter gradient: "weight", as its .pt is named
    }
  }
  return out;
}

inline bool is_parameters_grad(const std::string& name) { return name.find(".parameters_grad.") != std::string::npos; }

// "Aten.exp.0.backward" -> "Aten.exp.0.forward", "Module.fc.Linear.backward.0" -> "...forward.0"; "" otherwise.
inline std::string forward_name_of(const std::string& backward_name) {
  const std::size_t at = backward_name.rfind(".backward");
  if (at == std::string::npos) return std::string();
  return backward_name.substr(0, at) + ".forward" + backward_name.substr(at + 9);
}

// The summary of one step's overflowing entries, given in dump order. Null when there are none.
//
// Roles, decided in dump order (an API's entry comes before the module entry that contains it):
//   origin           the first entry whose inputs were all finite but which has a non-finite output
//   encloses_origin  a module entry with finite inputs that contains the origin (construct.json parent chain)
//   propagated       an entry that received a non-finite input; also a backward entry whose forward
//                    entry overflowed (it computes with the forward's values) and a parameter
//                    gradient (which records no inputs of its own)
//   new_origin       a later entry with finite inputs and a non-finite output that does not contain
//                    the origin: a second, independent overflow
inline Json summarize(const std::vector<const Record*>& records, std::int64_t step, bool limit_reached) {
  std::unordered_map<std::string, std::string> parent_of;
  std::unordered_set<std::string> names;
  std::size_t calls_seen = 0;
  for (const Record* record : records) {
    const Record& r = *record;
    if (is_save_entry(r.name)) continue;  // save() entries: written as asked, not summarised
    ++calls_seen;
    names.insert(r.name);
    if (r.parent && !r.parent->empty()) parent_of.emplace(r.name, *r.parent);
  }
  if (calls_seen == 0) return Json();

  const Record* origin = nullptr;
  std::unordered_set<std::string> around_origin;  // the origin's enclosing modules
  Json calls = Json::array();
  for (const Record* record : records) {
    const Record& r = *record;
    if (is_save_entry(r.name)) continue;  // save() entries: written as asked, not summarised
    const NonFiniteTensors n = nonfinite_tensors(r);
    const std::string forward = forward_name_of(r.name);
    const bool finite_inputs = !n.in_inputs && !is_parameters_grad(r.name) && !(forward.size() && names.count(forward));
    const char* role = "propagated";
    if (finite_inputs && n.in_outputs) {
      if (!origin) {
        origin = &r;
        role = "origin";
        std::string p = r.parent ? *r.parent : std::string();
        for (int depth = 0; !p.empty() && depth < 256; ++depth) {
          around_origin.insert(p);
          auto it = parent_of.find(p);
          p = it == parent_of.end() ? std::string() : it->second;
        }
      } else {
        role = around_origin.count(r.name) ? "encloses_origin" : "new_origin";
      }
    }
    Json c = Json::object();
    c["name"] = r.name;
    c["role"] = role;
    c["parent"] = r.parent && !r.parent->empty() ? Json(*r.parent) : Json(nullptr);
    c["nonfinite"] = n.keys;
    calls.push_back(std::move(c));
  }

  Json s = Json::object();
  s["step"] = step;
  s["origin"] = origin ? Json(origin->name) : Json(nullptr);
  s["origin_parent"] = origin && origin->parent && !origin->parent->empty() ? Json(*origin->parent) : Json(nullptr);
  s["overflowing_calls"] = calls_seen;
  s["limit_reached"] = limit_reached;
  s["calls"] = std::move(calls);
  return s;
}

}  // namespace torchprobe::overflow

#pragma once
// Reading single config values: each reader names the key, the bad value and what is allowed
// when it rejects one (ConfigError).
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchprobe/config/types.hpp"

namespace torchprobe {

namespace details {

using json = nlohmann::json;

// A value as the user wrote it, cut short so that a huge list cannot flood the message.
inline std::string show(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 160) text = text.substr(0, 150) + " ...";
  return text;
}

inline std::string quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

[[noreturn]] inline void reject(const std::string& key, const json& value, const std::string& reason,
                                const std::string& allowed) {
  throw ConfigError("config key " + quote(key) + ": " + show(value) + " is invalid: " + reason +
                    " (allowed: " + allowed + ")");
}

inline const json* find(const json& object, const std::string& key) {
  auto it = object.find(key);
  return (it == object.end() || it->is_null()) ? nullptr : &*it;  // null reads as "not given"
}

inline bool is_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

inline bool strip_suffix(std::string_view& s, std::string_view suffix) {
  if (s.size() < suffix.size() || s.substr(s.size() - suffix.size()) != suffix) return false;
  s.remove_suffix(suffix.size());
  return true;
}

// Text after the last '.' is a non-empty run of digits (and a '.' exists).
inline bool strip_dot_number(std::string_view& s) {
  const auto dot = s.rfind('.');
  if (dot == std::string_view::npos || !is_digits(s.substr(dot + 1))) return false;
  s = s.substr(0, dot);
  return true;
}

// ^(Distributed|Functional|Torch|Tensor|Aten|VF|NPU|Jit)\..*\.\d+\.(forward|backward)$
inline bool is_api_name(std::string_view name) {
  static constexpr std::string_view kPrefixes[] = {"Distributed.", "Functional.", "Torch.", "Tensor.",
                                                   "Aten.",        "VF.",         "NPU.",   "Jit."};
  for (std::string_view prefix : kPrefixes) {
    if (name.substr(0, prefix.size()) != prefix) continue;
    std::string_view rest = name.substr(prefix.size());
    if (!strip_suffix(rest, ".forward") && !strip_suffix(rest, ".backward")) return false;
    return strip_dot_number(rest);
  }
  return false;
}

// ^(Cell|Module)\..*\.(forward|backward)\.\d+$
inline bool is_module_name(std::string_view name) {
  for (std::string_view prefix : {std::string_view("Module."), std::string_view("Cell.")}) {
    if (name.substr(0, prefix.size()) != prefix) continue;
    std::string_view rest = name.substr(prefix.size());
    if (!strip_dot_number(rest)) return false;
    return strip_suffix(rest, ".forward") || strip_suffix(rest, ".backward");
  }
  return false;
}

inline DataMode parse_data_mode(const std::vector<std::string>& modes, const std::string& key) {
  const std::string allowed =
      "a list of up to 4 of \"all\", \"input\", \"output\", \"forward\", \"backward\", with \"all\" only on its own";
  const json shown = modes;
  if (modes.size() >= 5) reject(key, shown, "it has " + std::to_string(modes.size()) + " modes", allowed);
  bool all = false, fwd = false, bwd = false, in = false, out = false;
  for (const std::string& m : modes) {
    if (m == "all")
      all = true;
    else if (m == "forward")
      fwd = true;
    else if (m == "backward")
      bwd = true;
    else if (m == "input")
      in = true;
    else if (m == "output")
      out = true;
    else
      reject(key, shown, quote(m) + " is not a data mode", allowed);
  }
  if (all && modes.size() > 1) reject(key, shown, "\"all\" cannot be combined with other modes", allowed);
  DataMode mode;  // everything allowed: "all" or an empty list
  // Naming neither direction (or neither side) means both, as in msprobe.
  if (fwd || bwd) {
    mode.forward = fwd;
    mode.backward = bwd;
  }
  if (in || out) {
    mode.input = in;
    mode.output = out;
  }
  return mode;
}

// Reads "a" or "a-b" into [first, last]; throws with the element itself as the bad value.
inline std::pair<int64_t, int64_t> parse_index_text(const std::string& text, const std::string& key,
                                                    const std::string& allowed) {
  auto bounded = [&](std::string_view digits) {
    const auto nonzero = digits.find_first_not_of('0');
    const std::string_view significant = nonzero == std::string_view::npos ? "0" : digits.substr(nonzero);
    int64_t v = IndexSet::kMax + 1;  // more than 7 significant digits is out of range (and would overflow)
    if (significant.size() <= 7) {
      v = 0;
      for (char c : significant) v = v * 10 + (c - '0');
    }
    if (v > IndexSet::kMax)
      reject(key, text, "the boundary " + std::string(digits) + " is outside [0, 1000000]", allowed);
    return v;
  };
  const auto dash = text.find('-');
  if (dash == std::string::npos) {
    if (!is_digits(text)) reject(key, text, "it is not a decimal number", allowed);
    const int64_t v = bounded(text);
    return {v, v};
  }
  const std::string_view left = std::string_view(text).substr(0, dash), right = std::string_view(text).substr(dash + 1);
  if (!is_digits(left) || !is_digits(right))
    reject(key, text, "a range must be two decimal numbers joined by one hyphen", allowed);
  const int64_t a = bounded(left), b = bounded(right);
  if (a > b)
    reject(key, text,
           "the left boundary " + std::to_string(a) + " is greater than the right boundary " + std::to_string(b),
           allowed);
  return {a, b};
}

}  // namespace details

inline DataMode DataMode::parse(const std::vector<std::string>& modes) {
  return details::parse_data_mode(modes, "data_mode");
}

inline IndexSet IndexSet::parse(const nlohmann::json& value, const std::string& key) {
  const std::string allowed = "integers or \"a-b\" ranges with 0 <= a <= b <= 1000000";
  IndexSet set;
  if (value.is_null()) return set;
  if (!value.is_array()) details::reject(key, value, "it should be a list", "a list of " + allowed);
  if (value.size() > static_cast<size_t>(kMax))
    details::reject(key, value, "it has more than 1000000 elements", "a list of " + allowed);
  for (const auto& item : value) {
    int64_t first = 0, last = 0;
    if (item.is_boolean()) {
      details::reject(key, item, "booleans are not indices", allowed);
    } else if (item.is_number_integer()) {
      const bool in_range = item.is_number_unsigned() ? item.get<uint64_t>() <= static_cast<uint64_t>(kMax)
                                                      : (item.get<int64_t>() >= 0 && item.get<int64_t>() <= kMax);
      if (!in_range) details::reject(key, item, "it is outside [0, 1000000]", allowed);
      first = last = item.get<int64_t>();
    } else if (item.is_string()) {
      std::tie(first, last) = details::parse_index_text(item.get<std::string>(), key, allowed);
    } else {
      details::reject(key, item, "it is neither an integer nor a string", allowed);
    }
    for (int64_t v = first; v <= last; ++v) set.values_.push_back(v);
  }
  std::sort(set.values_.begin(), set.values_.end());
  set.values_.erase(std::unique(set.values_.begin(), set.values_.end()), set.values_.end());
  return set;
}

namespace details {

inline bool read_bool(const json& object, const std::string& key, bool fallback) {
  const json* v = find(object, key);
  if (!v) return fallback;
  if (!v->is_boolean()) reject(key, *v, "it should be a boolean", "true or false");
  return v->get<bool>();
}

template <class E>
struct Choice {
  std::string_view name;
  E value;
};

template <class E, size_t N>
E read_choice(const json& object, const std::string& key, const std::string& label, const Choice<E> (&choices)[N],
              E fallback) {
  const json* v = find(object, key);
  if (!v) return fallback;
  std::string allowed;
  for (const auto& c : choices) allowed += (allowed.empty() ? "" : ", ") + quote(c.name);
  if (!v->is_string()) reject(label, *v, "it should be a string", allowed);
  for (const auto& c : choices)
    if (c.name == v->get_ref<const std::string&>()) return c.value;
  reject(label, *v, "it is not one of the allowed values (they are case-sensitive)", allowed);
}

inline std::vector<std::string> read_string_list(const json& object, const std::string& key, const std::string& label,
                                                 const std::string& allowed = "a list of strings") {
  const json* v = find(object, key);
  if (!v) return {};
  const bool ok = v->is_array() && std::all_of(v->begin(), v->end(), [](const json& e) { return e.is_string(); });
  if (!ok) reject(label, *v, "it should be a list of strings", allowed);
  return v->get<std::vector<std::string>>();
}

}  // namespace details

}  // namespace torchprobe

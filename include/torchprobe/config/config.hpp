#pragma once
// The validated TorchProbe configuration: msprobe's config.json schema (msprobe-reference §5) cut down
// to what TorchProbe implements. parse_config() is the only place a configuration is checked; the file
// loader below and Options::resolve (options.hpp) both end there, so every entry point rejects the same
// values with the same messages.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchprobe/core/kinds.hpp"

namespace torchprobe {

// Thrown for every invalid configuration; the message names the key, the bad value and what is allowed.
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

enum class SummaryMode { Statistics, Md5, Xor };
enum class RiskLevel { All, Focus, Core };

// Spellings used in config.json.
constexpr std::string_view summary_mode_name(SummaryMode m) {
  switch (m) {
    case SummaryMode::Statistics: return "statistics";
    case SummaryMode::Md5: return "md5";
    case SummaryMode::Xor: return "xor";
  }
  return "?";
}

constexpr std::string_view risk_level_name(RiskLevel r) {
  switch (r) {
    case RiskLevel::All: return "ALL";
    case RiskLevel::Focus: return "FOCUS";
    case RiskLevel::Core: return "CORE";
  }
  return "?";
}

// msprobe's data_mode (reference §5.4): which directions (forward/backward) and which sides
// (input/output) of an entry are dumped. A key is dumped iff both its direction and its side are allowed.
struct DataMode {
  bool forward = true, backward = true, input = true, output = true;

  bool allows(bool is_forward, bool is_input) const {
    return (is_forward ? forward : backward) && (is_input ? input : output);
  }
  // Module "parameters" ride on the forward output (msprobe collects them with it).
  bool allows_parameters() const { return allows(true, false); }
  // parameters_grad entries: msprobe registers the grad hooks only when backward is dumped.
  bool allows_parameter_grads() const { return backward; }

  static DataMode parse(const std::vector<std::string>& modes);  // throws ConfigError
};

// A step or rank selection. Empty means "every step / every rank", as in msprobe.
class IndexSet {
 public:
  static constexpr int64_t kMax = 1000000;  // msprobe's bound for indices and for the list length

  bool all() const { return values_.empty(); }
  bool contains(int64_t v) const { return all() || std::binary_search(values_.begin(), values_.end(), v); }
  const std::vector<int64_t>& values() const { return values_; }  // sorted, without duplicates
  std::optional<int64_t> max() const {
    if (values_.empty()) return std::nullopt;
    return values_.back();
  }

  // A JSON list of integers and "a" / "a-b" strings (reference §5.3); null counts as [].
  static IndexSet parse(const nlohmann::json& value, const std::string& key);

 private:
  std::vector<int64_t> values_;
};

struct Config {
  Task task = Task::Statistics;
  Level level = Level::L1;
  std::string dump_path;
  IndexSet step, rank;
  bool async_dump = false;
  bool extra_info = true;
  std::string precision = "low";
  // msprobe defaults to FOCUS; a C++ user who asks for a dump expects every op, so TorchProbe says ALL.
  RiskLevel risk_level = RiskLevel::All;
  // TorchProbe's own: memory (MiB) that tensor snapshots waiting to be written may hold before the
  // training thread waits for the writer (tensor task, tensor_list, save()).
  int64_t max_pending_mb = 1024;

  // Keys of the task's own section ("statistics": {...}, "tensor": {...}, ...).
  std::vector<std::string> scope, list, tensor_list;
  DataMode data_mode;
  SummaryMode summary_mode = SummaryMode::Statistics;
  int64_t overflow_nums = 1;  // "overflow_check" section; -1 = no limit

  // Unknown keys, ignored keys and forced values: one readable sentence each.
  std::vector<std::string> warnings;
};

namespace detail {

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
    if (m == "all") all = true;
    else if (m == "forward") fwd = true;
    else if (m == "backward") bwd = true;
    else if (m == "input") in = true;
    else if (m == "output") out = true;
    else reject(key, shown, quote(m) + " is not a data mode", allowed);
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
    reject(key, text, "the left boundary " + std::to_string(a) + " is greater than the right boundary " + std::to_string(b),
           allowed);
  return {a, b};
}

}  // namespace detail

inline DataMode DataMode::parse(const std::vector<std::string>& modes) { return detail::parse_data_mode(modes, "data_mode"); }

inline IndexSet IndexSet::parse(const nlohmann::json& value, const std::string& key) {
  const std::string allowed = "integers or \"a-b\" ranges with 0 <= a <= b <= 1000000";
  IndexSet set;
  if (value.is_null()) return set;
  if (!value.is_array()) detail::reject(key, value, "it should be a list", "a list of " + allowed);
  if (value.size() > static_cast<size_t>(kMax))
    detail::reject(key, value, "it has more than 1000000 elements", "a list of " + allowed);
  for (const auto& item : value) {
    int64_t first = 0, last = 0;
    if (item.is_boolean()) {
      detail::reject(key, item, "booleans are not indices", allowed);
    } else if (item.is_number_integer()) {
      const bool in_range = item.is_number_unsigned() ? item.get<uint64_t>() <= static_cast<uint64_t>(kMax)
                                                      : (item.get<int64_t>() >= 0 && item.get<int64_t>() <= kMax);
      if (!in_range) detail::reject(key, item, "it is outside [0, 1000000]", allowed);
      first = last = item.get<int64_t>();
    } else if (item.is_string()) {
      std::tie(first, last) = detail::parse_index_text(item.get<std::string>(), key, allowed);
    } else {
      detail::reject(key, item, "it is neither an integer nor a string", allowed);
    }
    for (int64_t v = first; v <= last; ++v) set.values_.push_back(v);
  }
  std::sort(set.values_.begin(), set.values_.end());
  set.values_.erase(std::unique(set.values_.begin(), set.values_.end()), set.values_.end());
  return set;
}

namespace detail {

// ---- Which keys exist. Kept in one place: parse_config warns with it, Options routes keys with it. ----

inline bool contains(std::initializer_list<std::string_view> names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

inline bool is_common_key(std::string_view k) {
  return contains({"task", "level", "dump_path", "rank", "step", "async_dump", "extra_info", "precision", "risk_level",
                   "max_pending_mb"},
                  k);
}

inline bool is_task_section_name(std::string_view k) {
  return contains({"statistics", "tensor", "overflow_check", "free_benchmark", "structure"}, k);
}

// msprobe tasks TorchProbe does not have; their sections are warned about, naming them as a task is an error.
inline bool is_foreign_task(std::string_view k) {
  return contains({"acc_check", "run_ut", "grad_probe", "diff_check", "nan_check", "exception_dump"}, k);
}

// Top-level msprobe keys TorchProbe knows but does not implement yet.
inline bool is_unsupported_common_key(std::string_view k) {
  return contains({"enable_dataloader", "dump_enable", "custom_op_namespaces"}, k);
}

// Section keys TorchProbe reads, and the tasks that use them.
inline bool is_section_key_used(std::string_view k, Task task) {
  if (contains({"scope", "list", "data_mode"}, k)) return true;
  if (k == "summary_mode") return task == Task::Statistics || task == Task::Tensor;
  if (k == "tensor_list") return task == Task::Statistics;
  if (k == "overflow_nums") return task == Task::OverflowCheck;
  return false;
}

// Section keys msprobe has and TorchProbe does not implement yet (slicing, diff dumps, free_benchmark knobs).
inline bool is_unsupported_section_key(std::string_view k) {
  return contains({"slice", "request_id", "bench_path", "diff_nums", "file_format", "check_mode", "fuzz_device",
                   "pert_mode", "handler_type", "fuzz_level", "fuzz_stage", "if_preheat", "preheat_step", "max_sample"},
                  k);
}

// Whether a key lives in the task section (Options uses this to put its overrides in the right place).
inline bool is_section_key(std::string_view k) {
  return contains({"scope", "list", "data_mode", "summary_mode", "tensor_list", "overflow_nums"}, k) ||
         is_unsupported_section_key(k);
}

// A disabled feature ("enable_dataloader": false) needs no warning that it is unsupported.
inline bool asks_for_something(const json& v) {
  return !(v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_array() && v.empty()));
}

// ---- Readers for single keys. ----

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

inline Task parse_task(const json& v) {
  const std::string allowed = "\"statistics\", \"tensor\", \"overflow_check\", \"free_benchmark\", \"structure\"";
  if (!v.is_string()) reject("task", v, "it should be a string", allowed);
  const std::string& name = v.get_ref<const std::string&>();
  for (Task t : {Task::Statistics, Task::Tensor, Task::OverflowCheck, Task::FreeBenchmark, Task::Structure})
    if (task_name(t) == name) return t;
  if (is_foreign_task(name)) reject("task", v, "TorchProbe does not support msprobe's " + quote(name) + " task", allowed);
  reject("task", v, "it is not a task (names are case-sensitive)", allowed);
}

inline Level parse_level(const json& v) {
  const std::string allowed = "\"L0\", \"L1\", \"mix\", \"L2\", \"debug\"";
  if (!v.is_string()) reject("level", v, "it should be a string", allowed);
  const std::string& name = v.get_ref<const std::string&>();
  for (Level l : {Level::L0, Level::L1, Level::Mix, Level::L2, Level::Debug})
    if (level_name(l) == name) return l;
  reject("level", v, "it is not a level (names are case-sensitive)", allowed);
}

inline std::string parse_dump_path(const json& doc) {
  const std::string allowed = "a non-empty string without NUL characters naming the dump directory";
  const json* v = find(doc, "dump_path");
  if (!v) throw ConfigError("config key \"dump_path\" is missing: it is required (allowed: " + allowed + ")");
  if (!v->is_string()) reject("dump_path", *v, "it should be a string", allowed);
  const std::string& path = v->get_ref<const std::string&>();
  if (path.empty()) reject("dump_path", *v, "it is empty", allowed);
  // The C library would stop at the NUL: "a<NUL>b" would create the directory ./a.
  if (path.find('\0') != std::string::npos) reject("dump_path", *v, "it contains a NUL character", allowed);
  return path;
}

inline int64_t parse_overflow_nums(const json& section, const std::string& label) {
  const std::string allowed = "-1 (no limit) or an integer greater than 0";
  const json* v = find(section, "overflow_nums");
  if (!v) return 1;
  if (!v->is_number_integer()) reject(label, *v, "it should be an integer", allowed);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    reject(label, *v, "it is too large", allowed);
  const int64_t n = v->get<int64_t>();
  if (n == 0 || n < -1) reject(label, *v, "it is neither -1 nor positive", allowed);
  return n;
}

inline int64_t parse_max_pending_mb(const json& doc) {
  const std::string allowed = "an integer number of MiB from 1 to 1048576";
  const json* v = find(doc, "max_pending_mb");
  if (!v) return 1024;
  if (v->is_boolean() || !v->is_number_integer()) reject("max_pending_mb", *v, "it should be an integer", allowed);
  const bool in_range = v->is_number_unsigned() ? (v->get<uint64_t>() >= 1 && v->get<uint64_t>() <= 1048576u)
                                                : (v->get<int64_t>() >= 1 && v->get<int64_t>() <= 1048576);
  if (!in_range) reject("max_pending_mb", *v, "it is outside [1, 1048576]", allowed);
  return v->get<int64_t>();
}

inline void warn_about_top_level_keys(const json& doc, std::vector<std::string>& warnings) {
  for (const auto& item : doc.items()) {
    const std::string& k = item.key();
    if (is_common_key(k) || is_task_section_name(k)) continue;  // other tasks' sections: silently ignored
    if (is_foreign_task(k))
      warnings.push_back("config section " + quote(k) + " is not supported by TorchProbe yet and was ignored");
    else if (is_unsupported_common_key(k)) {
      if (asks_for_something(item.value()))
        warnings.push_back("config key " + quote(k) + " is not supported by TorchProbe yet and was ignored");
    } else {
      warnings.push_back("unknown config key " + quote(k) + " ignored");
    }
  }
}

inline void warn_about_section_keys(const json& section, Task task, std::vector<std::string>& warnings) {
  const std::string name(task_name(task));
  for (const auto& item : section.items()) {
    const std::string& k = item.key();
    const std::string label = quote(name + "." + k);
    if (is_section_key_used(k, task)) continue;
    if (is_section_key(k) && !is_unsupported_section_key(k))
      warnings.push_back("config key " + label + " is ignored: task " + quote(name) + " does not use it");
    else if (k == "check_mode")
      warnings.push_back("config key " + label + " is ignored: msprobe uses it only for MindSpore");
    else if (is_unsupported_section_key(k))
      warnings.push_back("config key " + label + " is not supported by TorchProbe yet and was ignored");
    else
      warnings.push_back("unknown config key " + label + " ignored");
  }
}

// Scope names must name entries of the configured level (reference §5.3, msprobe's scope.py).
inline void check_scope(const Config& c, const std::string& label) {
  if (c.scope.empty() || c.level == Level::Debug) return;
  const json shown = c.scope;
  if (c.task == Task::FreeBenchmark) {  // msprobe's ListScope: a set of exact names, exclusive with list
    if (!c.list.empty())
      reject(label, shown, "task \"free_benchmark\" takes either scope or list, not both",
             "scope (exact API names) or list, one of them empty");
    return;
  }
  if (c.level == Level::L2)
    reject(label, shown, "level \"L2\" does not take a scope", "[] when level is \"L2\" (follow one API with \"list\")");
  if (c.scope.size() != 2)
    reject(label, shown, "a scope is a [start, end] pair, this one has " + std::to_string(c.scope.size()) + " names",
           "[] or exactly 2 names: [start_name, end_name]");
  const std::string api_rule =
      "API names like \"Aten.relu.0.forward\" matching "
      "^(Distributed|Functional|Torch|Tensor|Aten|VF|NPU|Jit)\\..*\\.\\d+\\.(forward|backward)$";
  const std::string module_rule =
      "module names like \"Module.fc.Linear.forward.0\" matching ^(Cell|Module)\\..*\\.(forward|backward)\\.\\d+$";
  for (const std::string& name : c.scope) {
    const bool api = is_api_name(name), module = is_module_name(name);
    if (c.level == Level::L1 && !api) reject(label, name, "level \"L1\" scopes are API names", api_rule);
    if (c.level == Level::L0 && !module) reject(label, name, "level \"L0\" scopes are module names", module_rule);
    if (c.level == Level::Mix && !api && !module)
      reject(label, name, "it is neither an API nor a module name", api_rule + ", or " + module_rule);
  }
  // With the per-level patterns above, L0 and L1 scopes are necessarily of one kind; mix may combine both.
}

}  // namespace detail

inline Config parse_config(const nlohmann::json& doc) {
  using namespace detail;
  if (!doc.is_object()) throw ConfigError("a configuration must be a JSON object, not " + show(doc));
  Config c;
  warn_about_top_level_keys(doc, c.warnings);

  if (const json* v = find(doc, "task")) c.task = parse_task(*v);
  if (const json* v = find(doc, "level")) c.level = parse_level(*v);
  c.dump_path = parse_dump_path(doc);
  if (const json* v = find(doc, "rank")) c.rank = IndexSet::parse(*v, "rank");
  if (const json* v = find(doc, "step")) c.step = IndexSet::parse(*v, "step");
  c.async_dump = read_bool(doc, "async_dump", false);
  c.extra_info = read_bool(doc, "extra_info", true);
  static constexpr Choice<std::string_view> kPrecisions[] = {{"low", "low"}, {"high", "high"}};
  c.precision = std::string(read_choice(doc, "precision", "precision", kPrecisions, std::string_view("low")));
  static constexpr Choice<RiskLevel> kRisks[] = {
      {"ALL", RiskLevel::All}, {"FOCUS", RiskLevel::Focus}, {"CORE", RiskLevel::Core}};
  c.risk_level = read_choice(doc, "risk_level", "risk_level", kRisks, RiskLevel::All);
  c.max_pending_mb = parse_max_pending_mb(doc);

  // structure records the module tree, which only L0 and mix capture (msprobe forces mix the same way).
  if (c.task == Task::Structure && c.level != Level::L0 && c.level != Level::Mix) {
    c.warnings.push_back("task \"structure\" needs level \"L0\" or \"mix\": level " + quote(level_name(c.level)) +
                         " was changed to \"mix\"");
    c.level = Level::Mix;
  }
  if (c.level == Level::L2 && c.task != Task::Tensor)
    reject("task", std::string(task_name(c.task)), "level \"L2\" only works with task \"tensor\"",
           "\"tensor\" when level is \"L2\"");

  // The task's own section; sections of other tasks are not read.
  const std::string section_name(task_name(c.task));
  const json empty = json::object();
  const json* section = find(doc, section_name);
  if (section && !section->is_object())
    reject(section_name, *section, "a task section should be a JSON object", "an object such as {\"list\": [\"relu\"]}");
  if (!section) section = &empty;
  auto label = [&](const char* key) { return section_name + "." + key; };
  warn_about_section_keys(*section, c.task, c.warnings);

  c.scope = read_string_list(*section, "scope", label("scope"), "[] or a list of 2 entry names [start, end]");
  c.list = read_string_list(*section, "list", label("list"));
  c.data_mode = parse_data_mode(
      read_string_list(*section, "data_mode", label("data_mode"),
                       "a list of strings from \"all\", \"input\", \"output\", \"forward\", \"backward\""),
      label("data_mode"));
  if (is_section_key_used("tensor_list", c.task)) c.tensor_list = read_string_list(*section, "tensor_list", label("tensor_list"));
  if (is_section_key_used("summary_mode", c.task)) {
    static constexpr Choice<SummaryMode> kModes[] = {
        {"statistics", SummaryMode::Statistics}, {"md5", SummaryMode::Md5}, {"xor", SummaryMode::Xor}};
    c.summary_mode = read_choice(*section, "summary_mode", label("summary_mode"), kModes, SummaryMode::Statistics);
  }
  if (is_section_key_used("overflow_nums", c.task)) c.overflow_nums = parse_overflow_nums(*section, label("overflow_nums"));
  check_scope(c, label("scope"));
  // save() names its own entries; msprobe applies no filter to them.
  if (c.level == Level::Debug && (!c.scope.empty() || !c.list.empty()))
    c.warnings.push_back("config keys " + quote(label("scope")) + "/" + quote(label("list")) +
                         " are ignored at level \"debug\": save() writes every value it is given");

  // Rules that tie keys together (reference §5.3).
  if (c.level == Level::L2 && c.list.size() != 1)
    reject(label("list"), c.list, "level \"L2\" follows exactly one API", "a list with exactly one name when level is \"L2\"");
  if (c.async_dump && c.summary_mode == SummaryMode::Md5)
    reject(label("summary_mode"), "md5", "md5 checksums cannot be computed with async_dump true",
           "\"statistics\" or \"xor\" with async_dump true, or async_dump false");
  if (c.async_dump && c.task == Task::Tensor && c.list.empty() && c.level != Level::Debug)
    reject(label("list"), c.list, "task \"tensor\" with async_dump true must name the APIs to save",
           "a non-empty list with async_dump true, or async_dump false");
  return c;
}

namespace detail {

// The raw JSON object of a config file; every failure names the path.
inline nlohmann::json read_config_json(const std::string& path) {
  const std::string where = "config file " + quote(path);
  if (path.find('\0') != std::string::npos)  // shown escaped: what() would end at the NUL
    throw ConfigError("config file " + show(path) + " is invalid: its path contains a NUL character");
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw ConfigError(where + " does not exist");
  if (std::filesystem::is_directory(path, ec)) throw ConfigError(where + " is a directory, not a file");
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(where + " cannot be read" + (errno ? ": " + std::string(std::strerror(errno)) : std::string()));
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::parse_error& e) {
    throw ConfigError(where + " is not valid JSON: " + e.what());
  }
  if (!doc.is_object()) throw ConfigError(where + " should hold a JSON object, not " + show(doc));
  return doc;
}

}  // namespace detail

inline Config load_config_file(const std::string& path) {
  const nlohmann::json doc = detail::read_config_json(path);
  try {
    return parse_config(doc);
  } catch (const ConfigError& e) {
    throw ConfigError("config file " + detail::quote(path) + ": " + e.what());
  }
}

}  // namespace torchprobe

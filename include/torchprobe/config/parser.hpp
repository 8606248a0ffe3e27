#pragma once
// parse_config: the only place a configuration is checked. The file loader below and
// Options::resolve (config/options.hpp) both end here, so every entry point rejects the same values
// with the same messages.
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchprobe/config/free_benchmark.hpp"
#include "torchprobe/config/grad_probe.hpp"
#include "torchprobe/config/keys.hpp"
#include "torchprobe/config/readers.hpp"
#include "torchprobe/config/run_ut.hpp"
#include "torchprobe/config/types.hpp"

namespace torchprobe {

namespace details {

// A disabled feature ("enable_dataloader": false) needs no warning that it is unsupported.
inline bool asks_for_something(const json& v) {
  return !(v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_array() && v.empty()));
}

// One of msprobe's tasks, or a task the catalog declares (a task of the user's own).
inline TaskName parse_task(const json& v, const TaskCatalog* catalog) {
  const std::string allowed = allowed_task_names(catalog);
  if (!v.is_string()) reject("task", v, "it should be a string", allowed);
  const std::string& name = v.get_ref<const std::string&>();
  if (const Task* t = find_msprobe_task(name)) return *t;
  if (const TaskDeclaration* d = catalog ? find_task(*catalog, name) : nullptr) return d->name;
  if (is_foreign_task(name))
    reject("task", v, "TorchProbe does not support msprobe's " + quote(name) + " task", allowed);
  reject("task", v, "it is not a task (names are case-sensitive)", allowed);
}

inline Level parse_level(const json& v) {
  std::string allowed;
  for (Level l : kLevels) add_quoted(allowed, level_name(l));
  if (!v.is_string()) reject("level", v, "it should be a string", allowed);
  const std::string& name = v.get_ref<const std::string&>();
  for (Level l : kLevels)
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

// overflow_nums, diff_nums: how many calls; -1 is no limit.
inline int64_t parse_call_count(const json& section, const char* key, const std::string& label) {
  const std::string allowed = "-1 (no limit) or an integer greater than 0";
  const json* v = find(section, key);
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

// msprobe's seed: an integer in [0, 2^32 - 1].
inline std::optional<std::uint32_t> parse_seed(const json& doc) {
  const std::string allowed = "an integer from 0 to 4294967295";
  const json* v = find(doc, "seed");
  if (!v) return std::nullopt;
  if (v->is_boolean() || !v->is_number_integer()) reject("seed", *v, "it should be an integer", allowed);
  const bool in_range = v->is_number_unsigned() ? v->get<uint64_t>() <= 4294967295u
                                                : (v->get<int64_t>() >= 0 && v->get<int64_t>() <= 4294967295LL);
  if (!in_range) reject("seed", *v, "it is outside [0, 4294967295]", allowed);
  return static_cast<std::uint32_t>(v->get<uint64_t>());
}

inline void warn_about_top_level_keys(const json& doc, const TaskCatalog* catalog, std::vector<std::string>& warnings) {
  for (const auto& item : doc.items()) {
    const std::string& k = item.key();
    if (is_task_section_name(k, catalog)) continue;  // other tasks' sections: silently ignored
    const ConfigKey* known = find_config_key(k);
    if (known && known->place == KeyPlace::Top && known->support == KeySupport::Read) continue;
    if (is_foreign_task(k))
      warnings.push_back("config section " + quote(k) + " is not supported by TorchProbe yet and was ignored");
    else if (known && known->place == KeyPlace::Top) {
      if (asks_for_something(item.value()))
        warnings.push_back("config key " + quote(k) + " is not supported by TorchProbe yet and was ignored");
    } else {
      warnings.push_back("unknown config key " + quote(k) + " ignored");
    }
  }
}

// `reads(key)`: whether the task that runs reads this key of its section.
template <class Reads>
void warn_about_section_keys(const json& section, TaskName task, const Reads& reads,
                             std::vector<std::string>& warnings) {
  const std::string name(task.str());
  for (const auto& item : section.items()) {
    const std::string& k = item.key();
    const std::string label = quote(name + "." + k);
    if (reads(k)) continue;
    const ConfigKey* known = find_config_key(k);
    if (!known || known->place != KeyPlace::Section)
      warnings.push_back("unknown config key " + label + " ignored");
    else if (known->support == KeySupport::Read)
      warnings.push_back("config key " + label + " is ignored: task " + quote(name) + " does not use it");
    else if (known->support == KeySupport::MindSporeOnly)
      warnings.push_back("config key " + label + " is ignored: msprobe uses it only for MindSpore");
    else if (known->support == KeySupport::OnlineRunUt) {
      if (asks_for_something(item.value()))
        warnings.push_back("config key " + label +
                           " is ignored: it switches on msprobe's online run_ut (each API's data sent to a GPU "
                           "machine over the network while training runs), which TorchProbe does not have; run "
                           "`torchprobe run_ut -api_info DUMP.json` on a dump instead");
    } else
      warnings.push_back("config key " + label + " is not supported by TorchProbe yet and was ignored");
  }
}

// Scope names must name entries of the configured level (msprobe's scope rules).
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
    reject(label, shown, "level \"L2\" does not take a scope",
           "[] when level is \"L2\" (follow one API with \"list\")");
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

// msprobe's Python API names (Functional.linear.0.forward, Torch.matmul, Tensor.add_) name no call
// of a libtorch program, whose calls TorchProbe records by ATen operator ("Aten.linear.0.forward"):
// a list or scope entry copied from a Python config would select nothing, without a word.
inline void warn_about_python_names(const std::vector<std::string>& names, const std::string& key,
                                    std::vector<std::string>& warnings) {
  static constexpr std::string_view kPython[] = {"Functional.", "Torch.", "Tensor.",         "VF.",       "NPU.",
                                                 "Jit.",        "Mint.",  "MintFunctional.", "Primitive."};
  for (const std::string& n : names)
    for (std::string_view prefix : kPython)
      if (n.compare(0, prefix.size(), prefix) == 0) {
        warnings.push_back("config key " + quote(key) + ": " + quote(n) +
                           " is a name of msprobe's Python APIs, which a libtorch program does not call, so it "
                           "selects nothing; TorchProbe names calls by ATen operator, here " +
                           quote("Aten." + n.substr(prefix.size())) +
                           " (the operator libtorch runs may differ: a Linear runs Aten.linear or Aten.addmm; an L1 "
                           "dump.json shows the names)");
        break;
      }
}

}  // namespace details

// The configuration a config.json object describes. `implemented` (the Debugger's task list) adds
// the checks of what this build implements: a (task, level) pair it lacks is an error naming what
// it has, and section keys the task does not declare are ignored with a warning. Without it the
// document is checked against msprobe's schema only, and every section key TorchProbe knows is read.
inline Config parse_config(const nlohmann::json& doc, const TaskCatalog* implemented = nullptr) {
  using namespace details;
  if (!doc.is_object()) throw ConfigError("a configuration must be a JSON object, not " + show(doc));
  Config c;
  warn_about_top_level_keys(doc, implemented, c.warnings);

  if (const json* v = find(doc, "task")) c.task = parse_task(*v, implemented);
  if (const json* v = find(doc, "level")) c.level = parse_level(*v);
  // run_ut writes under -o, not dump_path: msprobe's run_ut configs carry one, but it is not needed.
  if (c.task != Task::RunUt || find(doc, "dump_path")) c.dump_path = parse_dump_path(doc);
  if (const json* v = find(doc, "rank")) c.rank = IndexSet::parse(*v, "rank");
  if (const json* v = find(doc, "step")) c.step = IndexSet::parse(*v, "step");
  c.async_dump = read_bool(doc, "async_dump", false);
  c.extra_info = read_bool(doc, "extra_info", true);
  if (find(doc, "dump_enable")) c.dump_enable = read_bool(doc, "dump_enable", true);
  static constexpr Choice<std::string_view> kPrecisions[] = {{"low", "low"}, {"high", "high"}};
  c.precision = std::string(read_choice(doc, "precision", "precision", kPrecisions, std::string_view("low")));
  static constexpr Choice<RiskLevel> kRisks[] = {
      {"ALL", RiskLevel::All}, {"FOCUS", RiskLevel::Focus}, {"CORE", RiskLevel::Core}};
  c.risk_level = read_choice(doc, "risk_level", "risk_level", kRisks, RiskLevel::All);
  c.max_pending_mb = parse_max_pending_mb(doc);
  c.rank_digest = read_bool(doc, "rank_digest", true);
  c.seed = parse_seed(doc);
  c.is_deterministic = read_bool(doc, "is_deterministic", false);

  // structure records the module tree, which only L0 and mix capture (msprobe forces mix the same way).
  if (c.task == Task::Structure && c.level != Level::L0 && c.level != Level::Mix) {
    c.warnings.push_back("task \"structure\" needs level \"L0\" or \"mix\": level " + quote(level_name(c.level)) +
                         " was changed to \"mix\"");
    c.level = Level::Mix;
  }
  // msprobe's L2 is a kernel dump, tensor task only; TorchProbe's L2 records ATen calls, nested ones
  // too, so statistics are as meaningful there as at L1.
  if (c.level == Level::L2 && c.task != Task::Tensor && c.task != Task::Statistics)
    reject("task", std::string(c.task.str()), "level \"L2\" works with task \"statistics\" or \"tensor\"",
           "\"statistics\" or \"tensor\" when level is \"L2\"");

  if (implemented && c.task == Task::RunUt)
    reject("task", "run_ut", "task \"run_ut\" configures the `torchprobe run_ut` command (its -config), not a dump",
           describe_available(*implemented));
  const TaskDeclaration* declared = implemented ? find_task(*implemented, c.task.str()) : nullptr;
  if (implemented && (!declared || !declared->levels.contains(c.level)))
    throw ConfigError(
        "config keys \"level\"/\"task\": level " + quote(level_name(c.level)) + " with task " + quote(c.task.str()) +
        " is not available in this TorchProbe version (available: " + describe_available(*implemented) + ")");
  auto reads = [&](std::string_view key) {
    if (declared) return declared->reads(key);
    const ConfigKey* known = find_config_key(key);
    return known && known->place == KeyPlace::Section && known->support == KeySupport::Read;
  };

  // The task's own section; sections of other tasks are not read.
  const std::string section_name(c.task.str());
  const json empty = json::object();
  const json* section = find(doc, section_name);
  if (section && !section->is_object())
    reject(section_name, *section, "a task section should be a JSON object",
           "an object such as {\"list\": [\"relu\"]}");
  if (!section) section = &empty;
  auto label = [&](const char* key) { return section_name + "." + key; };
  warn_about_section_keys(*section, c.task, reads, c.warnings);

  c.scope = read_string_list(*section, "scope", label("scope"), "[] or a list of 2 entry names [start, end]");
  c.list = read_string_list(*section, "list", label("list"));
  c.data_mode = parse_data_mode(
      read_string_list(*section, "data_mode", label("data_mode"),
                       "a list of strings from \"all\", \"input\", \"output\", \"forward\", \"backward\""),
      label("data_mode"));
  if (reads("tensor_list")) c.tensor_list = read_string_list(*section, "tensor_list", label("tensor_list"));
  if (reads("summary_mode")) {
    static constexpr Choice<SummaryMode> kModes[] = {
        {"statistics", SummaryMode::Statistics}, {"md5", SummaryMode::Md5}, {"xor", SummaryMode::Xor}};
    c.summary_mode = read_choice(*section, "summary_mode", label("summary_mode"), kModes, SummaryMode::Statistics);
  }
  if (reads("overflow_nums")) c.overflow_nums = parse_call_count(*section, "overflow_nums", label("overflow_nums"));
  if (reads("bench_path")) {
    if (const json* v = find(*section, "bench_path")) {
      const std::string allowed = "a path to the dump.json of an earlier run, or to its rank directory";
      if (!v->is_string()) reject(label("bench_path"), *v, "it should be a string", allowed);
      c.bench_path = v->get<std::string>();
      if (c.bench_path.empty() || c.bench_path.find('\0') != std::string::npos)
        reject(label("bench_path"), *v, "it is empty or contains a NUL character", allowed);
    }
  }
  if (reads("diff_nums")) c.diff_nums = parse_call_count(*section, "diff_nums", label("diff_nums"));
  if (c.task == Task::FreeBenchmark && reads("pert_mode"))
    c.free_benchmark = parse_free_benchmark(*section, c.list, [&](const char* key) { return label(key); });
  if (c.task == Task::GradProbe) c.grad_probe = parse_grad_probe(*section, [&](const char* key) { return label(key); });
  if (c.task == Task::RunUt) c.run_ut = parse_run_ut(*section, section_name, c.warnings);
  check_scope(c, label("scope"));
  if (c.level != Level::Debug) {
    warn_about_python_names(c.scope, label("scope"), c.warnings);
    warn_about_python_names(c.list, label("list"), c.warnings);
  }
  // save() names its own entries; msprobe applies no filter to them.
  if (c.level == Level::Debug && (!c.scope.empty() || !c.list.empty()))
    c.warnings.push_back("config keys " + quote(label("scope")) + "/" + quote(label("list")) +
                         " are ignored at level \"debug\": save() writes every value it is given");

  // Rules that tie keys together (msprobe's).
  // msprobe: one API to descend into. An empty list (not msprobe's) descends into every call.
  const std::string l2_list =
      "[] (every call) or one API entry name such as \"Aten.linear.0.forward\" or "
      "\"Aten.linear.0.backward\" when level is \"L2\"";
  if (c.level == Level::L2 && c.list.size() > 1)
    reject(label("list"), c.list,
           "level \"L2\" descends into one API call, this list has " + std::to_string(c.list.size()) + " names",
           l2_list);
  if (c.level == Level::L2 && c.list.size() == 1 && !is_api_name(c.list.front()))
    reject(label("list"), c.list.front(), "level \"L2\" names the call to descend into by its entry name", l2_list);
  if (c.async_dump && c.summary_mode == SummaryMode::Md5)
    reject(label("summary_mode"), "md5", "md5 checksums cannot be computed with async_dump true",
           "\"statistics\" or \"xor\" with async_dump true, or async_dump false");
  if (c.async_dump && !c.bench_path.empty())
    reject(label("bench_path"), c.bench_path,
           "the live check reads each entry's values as it ends, which async_dump true forbids",
           "no bench_path with async_dump true, or async_dump false");
  if (c.async_dump && c.task == Task::Tensor && c.list.empty() && c.level != Level::Debug)
    reject(label("list"), c.list, "task \"tensor\" with async_dump true must name the APIs to save",
           "a non-empty list with async_dump true, or async_dump false");
  return c;
}

namespace details {

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
  if (!in)
    throw ConfigError(where + " cannot be read" + (errno ? ": " + std::string(std::strerror(errno)) : std::string()));
  json doc;
  try {
    // Bounded nesting: messages show values (dump() recurses once a level).
    doc = json::parse(in, [&](int depth, json::parse_event_t, json&) {
      if (depth >= 64) throw ConfigError(where + " nests values deeper than 64 levels");  // 65 containers
      return true;
    });
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number such as 1E999
    throw ConfigError(where + " is not valid JSON: " + e.what());
  }
  if (!doc.is_object()) throw ConfigError(where + " should hold a JSON object, not " + show(doc));
  return doc;
}

}  // namespace details

inline Config load_config_file(const std::string& path, const TaskCatalog* implemented = nullptr) {
  const nlohmann::json doc = details::read_config_json(path);
  try {
    return parse_config(doc, implemented);
  } catch (const ConfigError& e) {
    throw ConfigError("config file " + details::quote(path) + ": " + e.what());
  }
}

}  // namespace torchprobe

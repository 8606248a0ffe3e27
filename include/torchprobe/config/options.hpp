#pragma once
// Options: the fluent builder a C++ user writes instead of (or on top of) msprobe's config.json.
//
//   torchprobe::Options().config_file("config.json").dump_path("./dump").step({0, "4-6"}).list({"relu"})
//
// It only records overrides, as config.json keys; resolve() merges them over the file (or over msprobe's
// shipped defaults) and validates the result with parse_config, so a value set here is checked exactly
// like the same value in a file.
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchprobe/config/keys.hpp"
#include "torchprobe/config/parser.hpp"
#include "torchprobe/config/types.hpp"

namespace torchprobe {

class Options {
 public:
  Options& config_file(std::string path) {
    config_file_ = std::move(path);
    return *this;
  }
  Options& dump_path(std::string path) { return set("dump_path", std::move(path)); }
  // msprobe's "task" and "level", as set("task", ...) and set("level", ...): what a PrecisionDebugger
  // builds; a Debugger's own are its template arguments (a different value here is reported).
  Options& task(std::string name) { return set("task", std::move(name)); }
  Options& level(std::string name) { return set("level", std::move(name)); }
  Options& level(Level l) { return set("level", std::string(level_name(l))); }
  // Steps and ranks mix integers and "a-b" ranges: step({0, "4-6"}).
  Options& step(std::initializer_list<nlohmann::json> items) { return set("step", nlohmann::json::array_t(items)); }
  Options& step(const std::vector<nlohmann::json>& items) { return set("step", items); }
  Options& rank(std::initializer_list<nlohmann::json> items) { return set("rank", nlohmann::json::array_t(items)); }
  Options& rank(const std::vector<nlohmann::json>& items) { return set("rank", items); }
  Options& async_dump(bool on) { return set("async_dump", on); }
  Options& extra_info(bool on) { return set("extra_info", on); }
  Options& precision(std::string p) { return set("precision", std::move(p)); }
  // msprobe's seed / is_deterministic: the Debugger calls seed_all(seed, is_deterministic) (seed.hpp).
  Options& seed(int64_t seed) { return set("seed", seed); }
  Options& is_deterministic(bool on) { return set("is_deterministic", on); }
  Options& risk_level(std::string level) { return set("risk_level", std::move(level)); }
  // Keys of the task section; resolve() files them under the effective task.
  Options& scope(std::vector<std::string> names) { return set("scope", std::move(names)); }
  Options& list(std::vector<std::string> names) { return set("list", std::move(names)); }
  Options& tensor_list(std::vector<std::string> names) { return set("tensor_list", std::move(names)); }
  Options& data_mode(std::vector<std::string> modes) { return set("data_mode", std::move(modes)); }
  Options& summary_mode(std::string mode) { return set("summary_mode", std::move(mode)); }
  Options& overflow_nums(int64_t n) { return set("overflow_nums", n); }
  // The live check: each entry judged against the reference dump.json at `path` as the run goes on.
  Options& bench_path(std::string path) { return set("bench_path", std::move(path)); }
  Options& diff_nums(int64_t n) { return set("diff_nums", n); }
  // Memory (MiB) tensor snapshots may hold while they wait to be written; default 1024.
  Options& max_pending_mb(int64_t mb) { return set("max_pending_mb", mb); }
  // ranks_digest.bin beside dump.json when the process has a rank (the default), or not.
  Options& rank_digest(bool on) { return set("rank_digest", on); }

  // The c10d process group this process trains with (a c10::intrusive_ptr, or any pointer with
  // getRank()): its rank names the rank{R} directory unless start() is given a rank_id; it comes
  // before the launcher's environment variables (details/session.hpp has the whole order).
  template <class ProcessGroupPtr>
  Options& process_group(const ProcessGroupPtr& pg) {
    group_rank_ = static_cast<int64_t>(pg->getRank());
    return *this;
  }

  // Any config.json key (e.g. set("level", "mix")); the last value set for a key wins.
  Options& set(std::string key, nlohmann::json value) {
    overrides_[std::move(key)] = std::move(value);
    return *this;
  }

  const nlohmann::json& overrides() const { return overrides_; }

  // The "task" value as given (set() before the file, the file before msprobe's default), unchecked:
  // PrecisionDebugger decides by it which debugger to build before resolving against that one's tasks.
  nlohmann::json named_task() const {
    if (overrides_.contains("task")) return overrides_["task"];
    const nlohmann::json doc = config_file_ ? details::read_config_json(*config_file_) : msprobe_defaults();
    return doc.is_object() && doc.contains("task") ? doc["task"] : nlohmann::json(std::string(Config().task.str()));
  }
  const std::optional<std::string>& config_path() const { return config_file_; }

  // The configuration to run with. `level` / `task` come from a Debugger's template arguments and win
  // over the file and over set("level"/"task"); a disagreement is reported in Config::warnings.
  // `implemented`: the tasks of the Debugger that will run (see parse_config).
  Config resolve(std::optional<Level> level = {}, std::optional<TaskName> task = {},
                 const TaskCatalog* implemented = nullptr) const;

  // msprobe's shipped config.json without its "acc_check" section, which TorchProbe lacks.
  static nlohmann::json msprobe_defaults() {
    return nlohmann::json::parse(R"({
      "task": "statistics", "dump_path": "./dump_path", "rank": [], "step": [], "level": "L1",
      "extra_info": true, "async_dump": false,
      "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
      "tensor": {"scope": [], "list": [], "data_mode": ["all"]}})");
  }

 private:
  std::optional<std::string> config_file_;
  std::optional<int64_t> group_rank_;
  nlohmann::json overrides_ = nlohmann::json::object();
};

inline Config Options::resolve(std::optional<Level> level, std::optional<TaskName> task,
                               const TaskCatalog* implemented) const {
  using details::quote;
  using nlohmann::json;
  json doc = config_file_ ? details::read_config_json(*config_file_) : msprobe_defaults();
  std::vector<std::string> notes;

  // Who named level/task, for the warning when the Debugger disagrees (the shipped defaults name nobody).
  auto source_of = [&](const char* key) -> std::string {
    if (overrides_.contains(key)) return "Options";
    if (config_file_ && doc.contains(key)) return "config file " + quote(*config_file_);
    return "";
  };
  const std::string level_source = source_of("level"), task_source = source_of("task");

  // Common keys go to the top level; a whole task section given with set() is merged key by key.
  for (const auto& item : overrides_.items()) {
    if (is_section_key(item.key())) continue;
    json& slot = doc[item.key()];
    if (is_task_section_name(item.key(), implemented) && slot.is_object() && item.value().is_object())
      slot.update(item.value());
    else
      slot = item.value();
  }

  auto impose = [&](const char* key, std::string_view wanted, const std::string& source) {
    json& slot = doc[key];
    if (!source.empty() && slot != json(std::string(wanted))) {
      std::string note = source + " says " + key + " " + details::show(slot) + ", this Debugger is " + quote(wanted) +
                         ": using " + quote(wanted);
      if (std::string(key) == "task" && slot.is_string() && doc.contains(slot.get<std::string>()))
        note += " (its " + quote(slot.get<std::string>()) + " section is ignored)";
      // PrecisionDebugger runs task structure at mix when the file names another level: say why.
      if (std::string(key) == "level" && task == TaskName(Task::Structure) && wanted == "mix" && slot != json("L0"))
        note = "task \"structure\" needs level \"L0\" or \"mix\": level " + details::show(slot) +
               " was changed to \"mix\"";
      notes.push_back(note);
    }
    slot = std::string(wanted);
  };
  if (level) impose("level", level_name(*level), level_source);
  if (task) impose("task", task->str(), task_source);

  // Section keys go into the section of the task that will actually run.
  const json* task_value = details::find(doc, "task");
  const std::string section = (task_value && task_value->is_string()) ? task_value->get<std::string>() : "statistics";
  for (const auto& item : overrides_.items()) {
    if (!is_section_key(item.key())) continue;
    json& slot = doc[section];
    if (slot.is_null()) slot = json::object();
    if (slot.is_object()) slot[item.key()] = item.value();  // otherwise parse_config rejects the section itself
  }

  Config config = parse_config(doc, implemented);
  config.warnings.insert(config.warnings.begin(), notes.begin(), notes.end());
  config.group_rank = group_rank_;
  return config;
}

}  // namespace torchprobe

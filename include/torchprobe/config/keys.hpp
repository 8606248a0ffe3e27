#pragma once
// Which config.json keys exist, in one table: parse_config warns and reads with it, Options
// files its overrides with it. And what a task implementation declares about the keys of its
// section and the levels it supports (TaskCatalog; task/task_list.hpp makes it from the tasks).
#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "torchprobe/core/kinds.hpp"

namespace torchprobe {

enum class KeyPlace { Top, Section };  // top level, or inside the task's section
enum class KeySupport {
  Read,           // TorchProbe reads it
  NotYet,         // msprobe has it, TorchProbe does not implement it yet: warned about when it asks for something
  MindSporeOnly,  // msprobe reads it only for MindSpore: warned about as ignored
  OnlineRunUt,    // msprobe's online run_ut, in a dump task's section: warned about when switched on
};

struct ConfigKey {
  std::string_view name;
  KeyPlace place;
  KeySupport support;
};

inline constexpr ConfigKey kConfigKeys[] = {
    {"task", KeyPlace::Top, KeySupport::Read},
    {"level", KeyPlace::Top, KeySupport::Read},
    {"dump_path", KeyPlace::Top, KeySupport::Read},
    {"rank", KeyPlace::Top, KeySupport::Read},
    {"step", KeyPlace::Top, KeySupport::Read},
    {"async_dump", KeyPlace::Top, KeySupport::Read},
    {"extra_info", KeyPlace::Top, KeySupport::Read},
    {"precision", KeyPlace::Top, KeySupport::Read},
    {"risk_level", KeyPlace::Top, KeySupport::Read},
    {"seed", KeyPlace::Top, KeySupport::Read},
    {"is_deterministic", KeyPlace::Top, KeySupport::Read},
    {"max_pending_mb", KeyPlace::Top, KeySupport::Read},  // TorchProbe's own
    {"rank_digest", KeyPlace::Top, KeySupport::Read},     // TorchProbe's own (io/rank_digest.hpp)
    {"enable_dataloader", KeyPlace::Top, KeySupport::NotYet},
    {"dump_enable", KeyPlace::Top, KeySupport::Read},
    {"custom_op_namespaces", KeyPlace::Top, KeySupport::NotYet},
    // Every task reads scope, list and data_mode; the others only the tasks that declare them.
    {"scope", KeyPlace::Section, KeySupport::Read},
    {"list", KeyPlace::Section, KeySupport::Read},
    {"data_mode", KeyPlace::Section, KeySupport::Read},
    {"summary_mode", KeyPlace::Section, KeySupport::Read},
    {"tensor_list", KeyPlace::Section, KeySupport::Read},
    {"overflow_nums", KeyPlace::Section, KeySupport::Read},
    {"check_mode", KeyPlace::Section, KeySupport::MindSporeOnly},
    {"slice", KeyPlace::Section, KeySupport::NotYet},
    {"request_id", KeyPlace::Section, KeySupport::NotYet},
    {"bench_path", KeyPlace::Section, KeySupport::Read},  // the live check (task/live_check.hpp)
    {"diff_nums", KeyPlace::Section, KeySupport::Read},
    {"file_format", KeyPlace::Section, KeySupport::MindSporeOnly},  // npy or bin, for MindSpore's dumps
    {"fuzz_device", KeyPlace::Section, KeySupport::Read},
    {"pert_mode", KeyPlace::Section, KeySupport::Read},
    {"handler_type", KeyPlace::Section, KeySupport::Read},
    {"fuzz_level", KeyPlace::Section, KeySupport::Read},
    {"fuzz_stage", KeyPlace::Section, KeySupport::Read},
    {"if_preheat", KeyPlace::Section, KeySupport::Read},
    {"preheat_step", KeyPlace::Section, KeySupport::Read},
    {"max_sample", KeyPlace::Section, KeySupport::Read},
    {"grad_level", KeyPlace::Section, KeySupport::Read},
    {"param_list", KeyPlace::Section, KeySupport::Read},
    {"bounds", KeyPlace::Section, KeySupport::Read},
    {"white_list", KeyPlace::Section, KeySupport::Read},       // run_ut
    {"black_list", KeyPlace::Section, KeySupport::Read},       // run_ut
    {"error_data_path", KeyPlace::Section, KeySupport::Read},  // run_ut
    // run_ut's online mode (NPU<->GPU over the network): read only to say it is not supported.
    {"is_online", KeyPlace::Section, KeySupport::Read},
    {"nfs_path", KeyPlace::Section, KeySupport::Read},
    {"host", KeyPlace::Section, KeySupport::Read},
    {"port", KeyPlace::Section, KeySupport::Read},
    {"rank_list", KeyPlace::Section, KeySupport::Read},
    {"tls_path", KeyPlace::Section, KeySupport::Read},
    // ... and the switch of that mode in the tensor task's section.
    {"online_run_ut", KeyPlace::Section, KeySupport::OnlineRunUt},
    {"online_run_ut_recompute", KeyPlace::Section, KeySupport::OnlineRunUt},
};

inline constexpr std::string_view kCommonSectionKeys[] = {"scope", "list", "data_mode"};

// msprobe tasks TorchProbe does not know; their sections are warned about, naming one as the task
// is an error.
inline constexpr std::string_view kForeignTasks[] = {"acc_check", "diff_check", "nan_check", "exception_dump"};

inline const ConfigKey* find_config_key(std::string_view name) {
  for (const ConfigKey& k : kConfigKeys)
    if (k.name == name) return &k;
  return nullptr;
}

// The key belongs in the task's section (Options files its overrides there).
inline bool is_section_key(std::string_view name) {
  const ConfigKey* k = find_config_key(name);
  return k && k->place == KeyPlace::Section;
}

inline bool is_foreign_task(std::string_view name) {
  return std::find(std::begin(kForeignTasks), std::end(kForeignTasks), name) != std::end(kForeignTasks);
}

// What a task implementation declares (task/task_list.hpp makes these from the task classes): the
// levels it supports and the keys of its section it reads besides kCommonSectionKeys.
struct TaskDeclaration {
  TaskName name;
  LevelSet levels;
  std::vector<std::string_view> keys;

  bool reads(std::string_view key) const {
    return std::find(std::begin(kCommonSectionKeys), std::end(kCommonSectionKeys), key) !=
               std::end(kCommonSectionKeys) ||
           std::find(keys.begin(), keys.end(), key) != keys.end();
  }
};
using TaskCatalog = std::vector<TaskDeclaration>;

inline const TaskDeclaration* find_task(const TaskCatalog& catalog, std::string_view name) {
  for (const TaskDeclaration& d : catalog)
    if (d.name.str() == name) return &d;
  return nullptr;
}

// A task's section: one of msprobe's tasks, or a task of the catalog (a task of the user's own).
inline bool is_task_section_name(std::string_view name, const TaskCatalog* catalog = nullptr) {
  return find_msprobe_task(name) != nullptr || (catalog && find_task(*catalog, name) != nullptr);
}

// `name` quoted at the end of a list of allowed values ("a", "b"), for error messages.
inline void add_quoted(std::string& list, std::string_view name) {
  list += (list.empty() ? "\"" : ", \"") + std::string(name) + "\"";
}

// The names config key "task" takes: msprobe's, then the catalog's own, for error messages.
inline std::string allowed_task_names(const TaskCatalog* catalog = nullptr) {
  std::string text;
  auto add = [&](std::string_view name) { add_quoted(text, name); };
  for (Task t : kMsprobeTasks) add(task_name(t));
  if (catalog)
    for (const TaskDeclaration& d : *catalog)
      if (!find_msprobe_task(d.name.str())) add(d.name.str());
  return text;
}

// What a catalog offers, for error messages: levels "L0", "L1", "mix", "debug" with tasks
// "statistics" and "tensor"; levels "L0", "L1", "mix" with task "overflow_check"
inline std::string describe_available(const TaskCatalog& catalog) {
  auto quoted = [](std::string_view s) { return "\"" + std::string(s) + "\""; };
  auto join = [](const std::vector<std::string>& items) {
    std::string out;
    for (std::size_t i = 0; i < items.size(); ++i)
      out += (i == 0 ? "" : (i + 1 == items.size() ? " and " : ", ")) + items[i];
    return out;
  };
  std::vector<const TaskDeclaration*> done;
  std::string text;
  for (const TaskDeclaration& d : catalog) {
    if (std::any_of(done.begin(), done.end(), [&](const TaskDeclaration* e) { return e->levels == d.levels; }))
      continue;
    done.push_back(&d);
    std::vector<std::string> levels, tasks;
    for (Level l : kLevels)
      if (d.levels.contains(l)) levels.push_back(quoted(level_name(l)));
    for (const TaskDeclaration& e : catalog)
      if (e.levels == d.levels) tasks.push_back(quoted(e.name.str()));
    std::string levels_text;
    for (const std::string& l : levels) levels_text += (levels_text.empty() ? "" : ", ") + l;
    text += (text.empty() ? "" : "; ") + std::string(levels.size() == 1 ? "level " : "levels ") + levels_text +
            (tasks.size() == 1 ? " with task " : " with tasks ") + join(tasks);
  }
  return text;
}

}  // namespace torchprobe

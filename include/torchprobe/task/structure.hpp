#pragma once
// Task::Structure (msprobe's "structure"): the names of the calls and modules and how they nest,
// no data. construct.json and stack.json are written as for statistics; dump.json keeps its
// header and an empty "data" (msprobe writes it so). No statistic is computed, and the
// parameters_grad entries, which have no construct.json parent, are written nowhere (msprobe
// hooks none for this task). msprobe runs it at level L0 or mix only: a config naming another
// level gets mix with a warning (config/parser.hpp, config/options.hpp);
// Debugger<Level::L1, Task::Structure> does not compile.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <array>
#include <string_view>

#include "torchprobe/core/site.hpp"
#include "torchprobe/config/types.hpp"
#include "torchprobe/core/record.hpp"

namespace torchprobe {

class StructureTask {
 public:
  static constexpr std::string_view name = task_name(Task::Structure);
  static constexpr LevelSet levels{Level::L0, Level::Mix};
  static constexpr std::array<std::string_view, 0> config_keys{};
  static bool saves_tensors(const Config&) { return false; }

  explicit StructureTask(const Config&) {}

  // Nothing of a tensor is kept: the item is dropped with the body in keep().
  nlohmann::ordered_json describe(const at::Tensor&, const Site&, Record&, bool /*gradient*/ = false) const {
    return nullptr;
  }

  // Every entry is kept for its name, parent and call stack; its body is dropped.
  bool keep(Record& r) const {
    r.body = nullptr;
    r.deferred.reset();
    r.pending.clear();
    r.pending_checksums.clear();
    r.saves.clear();
    r.construct_only = true;
    return true;
  }
};

}  // namespace torchprobe

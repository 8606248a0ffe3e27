#pragma once
// TaskList<Tasks...>: the tasks a Debugger can run, as one list that PrecisionDebugger dispatches
// on and that configuration checks and error messages read (TaskCatalog).
//
// A task class declares, besides what it does with each tensor (describe, keep, ...):
//   static constexpr Task kind;                       // its msprobe name, through task_name(kind)
//   static constexpr LevelSet levels;                 // the levels it supports
//   static constexpr std::array<std::string_view, N> config_keys;  // section keys it reads besides
//                                                     // scope, list and data_mode
//   static bool saves_tensors(const Config&);         // does the step get dump_tensor_data/?
// Adding a task is its header and one entry in the list of task/registry.hpp.
#include <memory>
#include <type_traits>

#include "torchprobe/config/keys.hpp"
#include "torchprobe/config/types.hpp"
#include "torchprobe/core/kinds.hpp"

namespace torchprobe {

template <class TaskT>
struct TaskTag {
  using type = TaskT;
};

template <class TaskT>
TaskDeclaration declaration_of() {
  return TaskDeclaration{TaskT::kind, TaskT::levels,
                         std::vector<std::string_view>(TaskT::config_keys.begin(), TaskT::config_keys.end())};
}

namespace details {
template <Task T, class... Tasks>
struct find_task_class {
  using type = void;
};
template <Task T, class First, class... Rest>
struct find_task_class<T, First, Rest...> {
  using type = std::conditional_t<First::kind == T, First, typename find_task_class<T, Rest...>::type>;
};
}  // namespace details

template <class... Tasks>
struct TaskList {
  // The class of kind T, or void when the list has none.
  template <Task T>
  using find = typename details::find_task_class<T, Tasks...>::type;

  static const TaskCatalog& catalog() {
    static const TaskCatalog c{declaration_of<Tasks>()...};
    return c;
  }

  // Calls f(TaskTag<TaskT>{}) for the task of this kind; false when the list has none.
  template <class F>
  static bool visit(Task kind, F&& f) {
    return ((Tasks::kind == kind ? (f(TaskTag<Tasks>{}), true) : false) || ...);
  }
};

}  // namespace torchprobe

#pragma once
// TaskList<Tasks...>: the tasks a Debugger can run, as one list that PrecisionDebugger dispatches
// on and that configuration checks and error messages read (TaskCatalog). What a task class must
// declare is task/task_traits.hpp's contract, checked here for every task of the list. Adding a
// task is its header and one entry in the list of task/registry.hpp (or a list of your own).
#include <string_view>
#include <type_traits>

#include "torchprobe/config/keys.hpp"
#include "torchprobe/config/types.hpp"
#include "torchprobe/core/kinds.hpp"
#include "torchprobe/task/task_traits.hpp"

namespace torchprobe {

template <class TaskT>
struct TaskTag {
  using type = TaskT;
};

template <class TaskT>
TaskDeclaration declaration_of() {
  return TaskDeclaration{TaskName(TaskT::name), TaskT::levels,
                         std::vector<std::string_view>(std::begin(TaskT::config_keys), std::end(TaskT::config_keys))};
}

namespace details {
template <Task T, class... Tasks>
struct find_task_class {
  using type = void;
};
template <Task T, class First, class... Rest>
struct find_task_class<T, First, Rest...> {
  using type = std::conditional_t<First::name == task_name(T), First, typename find_task_class<T, Rest...>::type>;
};
}  // namespace details

template <class... Tasks>
struct TaskList {
  static_assert((check_task<Tasks>() && ...), "torchprobe: every task of a TaskList keeps the task contract");

  // The class of msprobe's task T, or void when the list has none.
  template <Task T>
  using find = typename details::find_task_class<T, Tasks...>::type;

  static const TaskCatalog& catalog() {
    static const TaskCatalog c{declaration_of<Tasks>()...};
    return c;
  }

  // Calls f(TaskTag<TaskT>{}) for the task of this name; false when the list has none.
  template <class F>
  static bool visit(TaskName name, F&& f) {
    return ((TaskName(Tasks::name) == name ? (f(TaskTag<Tasks>{}), true) : false) || ...);
  }
};

}  // namespace torchprobe

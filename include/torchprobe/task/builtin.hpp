#pragma once
// The tasks this TorchProbe implements, by msprobe's name, without their definitions: enough to
// name Debugger<L, Task::X>'s class in a file that uses the compiled library (it never sees a
// task's code). task/registry.hpp completes the list; adding a task is its header and one entry
// here.
#include <tuple>
#include <type_traits>

#include "torchprobe/core/kinds.hpp"

namespace torchprobe {

class StatisticsTask;
class TensorTask;
class OverflowCheckTask;
class FreeBenchmarkTask;
class StructureTask;
template <class... Tasks>
struct TaskList;

// One task of the list: msprobe's task and the class that implements it.
template <Task Id, class TaskT>
struct BuiltinTask {
  static constexpr Task id = Id;
  using type = TaskT;
};

using BuiltinTaskEntries =
    std::tuple<BuiltinTask<Task::Statistics, StatisticsTask>, BuiltinTask<Task::Tensor, TensorTask>,
               BuiltinTask<Task::OverflowCheck, OverflowCheckTask>, BuiltinTask<Task::FreeBenchmark, FreeBenchmarkTask>,
               BuiltinTask<Task::Structure, StructureTask>>;

namespace details {
template <Task T, class Entries>
struct find_builtin;
template <Task T>
struct find_builtin<T, std::tuple<>> {
  using type = void;
};
template <Task T, class First, class... Rest>
struct find_builtin<T, std::tuple<First, Rest...>> {
  using type =
      std::conditional_t<First::id == T, typename First::type, typename find_builtin<T, std::tuple<Rest...>>::type>;
};
template <class Entries>
struct builtin_task_list;
template <class... Entries>
struct builtin_task_list<std::tuple<Entries...>> {
  using type = TaskList<typename Entries::type...>;
};
}  // namespace details

// The list as a TaskList (task/task_list.hpp), which PrecisionDebugger dispatches on; named here,
// complete where task/registry.hpp is included.
using BuiltinTasks = typename details::builtin_task_list<BuiltinTaskEntries>::type;

// Debugger<L, Task::X>'s task class; a task that is not in the list stops the build here.
template <Task T>
struct builtin_task {
  using type = typename details::find_builtin<T, BuiltinTaskEntries>::type;
  static_assert(!std::is_void_v<type>,
                "torchprobe: this task is not available yet; task/builtin.hpp lists the implemented ones");
};

}  // namespace torchprobe

#pragma once
// The tasks this TorchProbe implements. Adding one: its header under task/, and one entry here.
#include "torchprobe/task/free_benchmark.hpp"
#include "torchprobe/task/overflow_check.hpp"
#include "torchprobe/task/statistics.hpp"
#include "torchprobe/task/structure.hpp"
#include "torchprobe/task/task_list.hpp"
#include "torchprobe/task/tensor.hpp"

namespace torchprobe {

using BuiltinTasks = TaskList<StatisticsTask, TensorTask, OverflowCheckTask, FreeBenchmarkTask, StructureTask>;

// Debugger<L, Task::X>'s task class; a task that is not in the list stops the build here.
template <Task T>
struct builtin_task {
  using type = BuiltinTasks::find<T>;
  static_assert(!std::is_void_v<type>,
                "torchprobe: this task is not available yet; task/registry.hpp lists the implemented ones");
};

}  // namespace torchprobe

#pragma once
// Task -> policy class. Adding a task is one header under task/ and one specialisation here.
#include "task.hpp"
#include "statistics.hpp"

namespace torchprobe {

template <Task T>
struct TaskPolicy {
  static_assert(T == Task::Statistics,
                "torchprobe: this task is not available yet; Task::Statistics is implemented");
  using type = StatisticsTask;
};

template <>
struct TaskPolicy<Task::Statistics> {
  using type = StatisticsTask;
};

}  // namespace torchprobe

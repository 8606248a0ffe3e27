#pragma once
// Task -> policy class. Adding a task is one header under task/ and one specialisation here.
#include "torchprobe/core/kinds.hpp"
#include "torchprobe/task/statistics.hpp"
#include "torchprobe/task/tensor.hpp"
#include "torchprobe/task/overflow_check.hpp"

namespace torchprobe {

template <Task T>
struct TaskPolicy {
  static_assert(T == Task::Statistics || T == Task::Tensor || T == Task::OverflowCheck,
                "torchprobe: this task is not available yet; Task::Statistics, Task::Tensor and Task::OverflowCheck are implemented");
  using type = StatisticsTask;
};

template <>
struct TaskPolicy<Task::Statistics> {
  using type = StatisticsTask;
};

template <>
struct TaskPolicy<Task::Tensor> {
  using type = TensorTask;
};

template <>
struct TaskPolicy<Task::OverflowCheck> {
  using type = OverflowCheckTask;
};

}  // namespace torchprobe

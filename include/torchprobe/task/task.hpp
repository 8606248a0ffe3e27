#pragma once
// Task: what a Debugger does with each captured tensor (msprobe's "task").
#include <string_view>

namespace torchprobe {

enum class Task { Statistics, Tensor, OverflowCheck, FreeBenchmark, Structure };

// The spelling msprobe uses in config.json and in dump.json's "task" field.
constexpr std::string_view task_name(Task t) {
  switch (t) {
    case Task::Statistics: return "statistics";
    case Task::Tensor: return "tensor";
    case Task::OverflowCheck: return "overflow_check";
    case Task::FreeBenchmark: return "free_benchmark";
    case Task::Structure: return "structure";
  }
  return "?";
}

}  // namespace torchprobe

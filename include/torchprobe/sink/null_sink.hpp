#pragma once
// Records nothing: for measuring the cost of capture alone (tensor files of a task that saves them
// are still written: the step lifecycle makes dump_tensor_data/ whatever the sink).
#include <string>

#include "torchprobe/sink/step_dump.hpp"

namespace torchprobe {

class NullSink {
 public:
  void open(const std::string&) {}
  void write_step(const StepDump&) {}
  void write_debug(const StepDump&) {}
};

}  // namespace torchprobe

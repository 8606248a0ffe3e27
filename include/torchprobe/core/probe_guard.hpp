#pragma once
// Everything the probe itself does with tensors runs under this guard: RecordFunction is off so
// the probe's own ops are never recorded (nor re-enter the observer), and grad mode is off so the
// probe never adds nodes to the user's autograd graph.
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

namespace torchprobe {

class ProbeGuard {
 public:
  ProbeGuard() = default;
  ProbeGuard(const ProbeGuard&) = delete;
  ProbeGuard& operator=(const ProbeGuard&) = delete;

 private:
  at::DisableRecordFunctionGuard no_record_;
  c10::NoGradGuard no_grad_;
};

}  // namespace torchprobe

#pragma once
// free_benchmark's backward stage (fuzz_stage backward, for the APIs in `list`; msprobe-reference.md
// §7.3): when a checked call's gradient arrives, the op's backward is recomputed twice on the probe's
// snapshot of the inputs, taken when the call started, with the original and with the perturbed
// inputs (a re-run through the dispatcher with grad mode on, then torch::autograd::grad with the
// gradient that arrived), and the input gradients are compared (abs_tol 1e-3).
// The gradient is that of the call's first floating output that requires grad (the others count as
// zero); the inputs differentiated are those that required grad.
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "torchprobe/config/types.hpp"
#include "torchprobe/core/probe_guard.hpp"
#include "torchprobe/task/free_benchmark/comparison.hpp"
#include "torchprobe/task/free_benchmark/perturbation.hpp"
#include "torchprobe/task/free_benchmark/report.hpp"

namespace torchprobe::free_benchmark {

// The backward checks decided by hooks, until the task collects them (hooks may outlive the task).
struct BackwardCalls {
  std::mutex mutex;
  std::vector<CheckedCall> calls;
};

// A call of the backward stage, from its start to its gradient.
struct BackwardCall {
  c10::OperatorHandle op;
  std::string name;
  std::vector<c10::IValue> inputs;   // snapshot: detached copies
  std::vector<bool> differentiated;  // per tensor met in map_tensors order: it required grad
  std::ptrdiff_t valid = -1;
  std::size_t output = 0;  // the output whose gradient is hooked
  PertMode mode = PertMode::ImprovePrecision;
  std::shared_ptr<BackwardCalls> into;

  BackwardCall(c10::OperatorHandle handle) : op(std::move(handle)) {}

  // The snapshot of the call's inputs, or false when no floating input requires grad.
  bool take(const std::vector<c10::IValue>& stack) {
    bool any = false;
    auto copy = [&](const at::Tensor& t) -> at::Tensor {
      const bool d = t.defined() && is_floating(t) && t.requires_grad();
      differentiated.push_back(d);
      any = any || d;
      return t.defined() ? t.detach().clone() : at::Tensor();
    };
    for (const c10::IValue& v : stack) inputs.push_back(map_tensors(v, copy));
    return any;
  }

  // d(output)/d(inputs that required grad) . grad, on `stack` (the snapshot, perturbed or not).
  std::vector<at::Tensor> gradients(std::vector<c10::IValue> stack, const at::Tensor& grad) const {
    std::vector<at::Tensor> leaves;
    std::size_t i = 0;
    auto leaf = [&](const at::Tensor& t) -> at::Tensor {
      const bool d = i < differentiated.size() && differentiated[i];
      ++i;
      if (!d || !t.defined()) return at::Tensor();
      leaves.push_back(t.detach().requires_grad_(true));
      return leaves.back();
    };
    for (c10::IValue& v : stack) v = map_tensors(v, leaf);
    op.callBoxed(&stack);
    if (output >= stack.size() || !stack[output].isTensor()) return {};
    const at::Tensor out = stack[output].toTensor();
    if (!out.requires_grad()) return {};
    return torch::autograd::grad({out}, leaves, {grad.to(out.device(), out.scalar_type())},
                                 /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
  }

  // The hook's work: both backwards, compared; the result joins `into`.
  void check(const at::Tensor& grad) const {
    ProbeGuard guard;
    at::AutoGradMode grad_mode(true);
    std::vector<c10::IValue> perturbed = inputs;
    if (!perturb(mode, perturbed, valid)) return;
    const std::vector<at::Tensor> a = gradients(inputs, grad), b = gradients(std::move(perturbed), grad);
    CheckedCall call{name, {}, std::nullopt, {}};
    const std::size_t n = std::min(a.size(), b.size());
    for (std::size_t k = 0; k < n; ++k) {
      if (!a[k].defined() || !b[k].defined()) continue;
      Comparison c = mode == PertMode::ToCpu ? compare_benchmark(a[k], b[k]) : compare_ratio(a[k], b[k], mode, 1e-3);
      if (n > 1) c.index = static_cast<int64_t>(k);
      call.outputs.push_back(std::move(c));
    }
    if (call.outputs.empty()) return;
    std::lock_guard<std::mutex> lock(into->mutex);
    into->calls.push_back(std::move(call));
  }
};

}  // namespace torchprobe::free_benchmark

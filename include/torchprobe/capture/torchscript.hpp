#pragma once
// Module entries for TorchScript models (torch::jit::load), with no change to the model.
//
// TorchScript modules have no C++ hooks that survive compilation, and the optimised executor
// inlines submodule calls. So, before the model first runs, each method graph of each module type
// gets two probe ops around every `prim::CallMethod[name="forward"]`:
//     torchprobe::module_pre(%submodule, (%args...))   ...call...   torchprobe::module_post(%submodule, %out)
// Registered with CONSERVATIVE alias analysis they count as side effects, so no pass removes
// them, and they stay in place when the call is inlined. At run time they tell the running
// capture (if any) which module object begins and ends, with its exact inputs and output.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <mutex>
#include <vector>

#include "torchprobe/capture/api_observer.hpp"
#include "torchprobe/capture/module_events.hpp"

namespace torchprobe::capture {

namespace script_detail {

inline ModuleEvents* active_events(std::shared_ptr<ApiHandler>& keep) {
  keep = ApiObserver::active();
  return dynamic_cast<ModuleEvents*>(keep.get());
}

inline void pre_probe(torch::jit::Stack& stack) {
  c10::IValue inputs = torch::jit::pop(stack);
  c10::IValue module = torch::jit::pop(stack);
  std::shared_ptr<ApiHandler> keep;
  if (ModuleEvents* events = active_events(keep)) {
    std::vector<c10::IValue> args;
    if (inputs.isTuple())
      for (const c10::IValue& e : inputs.toTupleRef().elements()) args.push_back(e);
    events->script_module_enter(module.isObject() ? module.toObject().get() : nullptr, std::move(args));
  }
}

inline void post_probe(torch::jit::Stack& stack) {
  c10::IValue output = torch::jit::pop(stack);
  torch::jit::pop(stack);
  std::shared_ptr<ApiHandler> keep;
  if (ModuleEvents* events = active_events(keep)) events->script_module_exit(output);
}

inline void register_probe_ops() {
  // Built by moving, not from an initializer list: copying jit::Operator trips g++ 14's
  // maybe-uninitialized warning inside libtorch's own types.
  static const torch::jit::RegisterOperators registered = [] {
    std::vector<c10::optional<torch::jit::Operator>> ops;
    ops.emplace_back(torch::jit::Operator("torchprobe::module_pre(Any module, Any inputs) -> ()", &pre_probe,
                                          c10::AliasAnalysisKind::CONSERVATIVE));
    ops.emplace_back(torch::jit::Operator("torchprobe::module_post(Any module, Any output) -> ()", &post_probe,
                                          c10::AliasAnalysisKind::CONSERVATIVE));
    return torch::jit::RegisterOperators(std::move(ops));
  }();
  (void)registered;
}

// The forward calls in a graph; false if the graph already carries the probes.
inline bool collect_forward_calls(torch::jit::Block* block, c10::Symbol pre, std::vector<torch::jit::Node*>& out) {
  for (torch::jit::Node* n : block->nodes()) {
    if (n->kind() == pre) return false;
    if (n->kind() == c10::prim::CallMethod && n->s(c10::attr::name) == "forward") out.push_back(n);
    for (torch::jit::Block* b : n->blocks())
      if (!collect_forward_calls(b, pre, out)) return false;
  }
  return true;
}

inline void instrument_graph(torch::jit::Graph& graph) {
  static const c10::Symbol pre = c10::Symbol::fromQualString("torchprobe::module_pre");
  static const c10::Symbol post = c10::Symbol::fromQualString("torchprobe::module_post");
  std::vector<torch::jit::Node*> calls;
  if (!collect_forward_calls(graph.block(), pre, calls)) return;
  for (torch::jit::Node* call : calls) {
    torch::jit::Value* self = call->inputs()[0];
    std::vector<torch::jit::Value*> args(call->inputs().begin() + 1, call->inputs().end());
    torch::jit::WithInsertPoint before(call);
    torch::jit::Value* packed = graph.insertNode(graph.createTuple(args))->output();
    graph.insertNode(graph.create(pre, {self, packed}, 0));
    torch::jit::Node* after = graph.create(post, {self, call->output()}, 0);
    after->insertAfter(call);
  }
}

}  // namespace script_detail

// Puts the probes into every method of the model's type and of every submodule's type (a graph
// that has them already is left alone). Every method, not only forward: a forward that calls a
// helper (`self._forward_impl(x)`, as torchvision's ResNet does) runs the submodules from the
// helper's graph, and inlining copies that graph, probes included, into the caller. Must run
// before the model's first forward: TorchScript compiles a method on its first call and keeps
// that plan.
inline void instrument_script_module(const torch::jit::Module& root) {
  script_detail::register_probe_ops();
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& item : root.named_modules())
    for (const torch::jit::Method& method : item.value.get_methods())
      if (auto* graph_fn = dynamic_cast<torch::jit::GraphFunction*>(&method.function()))
        script_detail::instrument_graph(*graph_fn->graph());
}

// Autograd's per-op nodes (what API and module backward entries hook) exist only when the
// TorchScript executor does not fuse a model's ops into one differentiable graph; this switches
// its optimisation off while a capture of TorchScript models runs, and back on at stop().
class ScriptExecutorSettings {
 public:
  void enter() {
    if (active_) return;
    previous_ = torch::jit::getGraphExecutorOptimize();
    torch::jit::setGraphExecutorOptimize(false);
    active_ = true;
  }
  void leave() {
    if (!active_) return;
    torch::jit::setGraphExecutorOptimize(previous_);
    active_ = false;
  }

 private:
  bool active_ = false;
  bool previous_ = true;
};

}  // namespace torchprobe::capture

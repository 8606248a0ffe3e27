#pragma once
// Module entries for modules the probe cannot see by itself.
//
// Parameter-owning leaf modules (Linear, Conv, norms, Embedding, RNNs) are found automatically.
// Parameter-free modules (ReLU, Dropout) and containers (Sequential, your own blocks) have no
// parameters to recognise them by and torch::nn has no forward hooks, so they take one line:
//
//   torch::Tensor BlockImpl::forward(torch::Tensor x) {
//     torchprobe::ModuleGuard guard(this, x);   // Module.block.Block.forward.{n}, with backward
//     return proj(x).relu();
//   }
//
// The module's output is the result of the last ATen call made inside it; a forward whose
// result is something else (an input returned as is, a tuple assembled by hand) says so:
// `return guard.output(result);`. A guard for a module that is not part of the model given to
// start(model), or while nothing is being dumped, does nothing.
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "torchprobe/capture/module_events.hpp"

namespace torchprobe {

namespace details {

class ModuleScopeBase {
 protected:
  ModuleScopeBase(const torch::nn::Module& module, const std::string* dump_name, std::vector<c10::IValue> inputs)
      : events_(capture::active_module_events()), uncaught_(std::uncaught_exceptions()) {
    if (events_) token_ = events_->module_enter(module, dump_name, std::move(inputs));
  }
  ~ModuleScopeBase() {
    if (events_ && token_)
      events_->module_exit(token_, has_outputs_ ? &outputs_ : nullptr, std::uncaught_exceptions() > uncaught_);
  }

  std::shared_ptr<capture::ModuleEvents> events_;  // keeps the capture alive until the scope ends
  void* token_ = nullptr;
  int uncaught_;
  bool has_outputs_ = false;
  std::vector<c10::IValue> outputs_;

 public:
  ModuleScopeBase(const ModuleScopeBase&) = delete;
  ModuleScopeBase& operator=(const ModuleScopeBase&) = delete;
};

}  // namespace details

class ModuleGuard : public details::ModuleScopeBase {
 public:
  template <class... Inputs>
  explicit ModuleGuard(const torch::nn::Module* module, const Inputs&... inputs)
      : ModuleScopeBase(*module, nullptr, std::vector<c10::IValue>{c10::IValue(inputs)...}) {}

  // The module's result, when it is not simply what the last ATen call returned.
  template <class T>
  const T& output(const T& value) {
    outputs_ = {c10::IValue(value)};
    has_outputs_ = true;
    return value;
  }
};

// msprobe's module_dump(module, name) ... module_dump_end(): while it lives, this thread records
// only `module`, as Module.{name}.{Class}.forward.{n} (and its backward), and no API entries.
// A parameter-owning leaf module is recognised call by call; any other module counts as called
// once for the scope, with the inputs given here.
class ScopedModuleDump : public details::ModuleScopeBase {
 public:
  template <class Holder, class... Inputs>
  ScopedModuleDump(const Holder& module, const std::string& name, const Inputs&... inputs)
      : ModuleScopeBase(as_module(module), &name, std::vector<c10::IValue>{c10::IValue(inputs)...}) {}

  template <class T>
  const T& output(const T& value) {
    outputs_ = {c10::IValue(value)};
    has_outputs_ = true;
    return value;
  }

 private:
  template <class Holder>
  static const torch::nn::Module& as_module(const Holder& m) {
    if constexpr (std::is_base_of_v<torch::nn::Module, Holder>)
      return m;
    else
      return *m;  // a module holder or a pointer
  }
};

// A Sequential's children, each wrapped so its forward is a module entry: the one-line way to
// cover parameter-free children (ReLU, Dropout) of a Sequential, whose forward you cannot edit.
//
//   layer = register_module("layer", torchprobe::probe_children(torch::nn::Sequential(
//       torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2))));
//
// The wrappers are invisible in names: the children stay "layer.0", "layer.1", ... Children
// must map one tensor to one tensor, as a Sequential chains them.
class ProbedChildImpl : public torch::nn::Module {
 public:
  explicit ProbedChildImpl(torch::nn::AnyModule inner) : inner_(std::move(inner)) {
    register_module("inner", inner_.ptr());
  }
  torch::Tensor forward(torch::Tensor x) {
    ModuleGuard guard(inner_.ptr().get(), x);
    return inner_.forward<torch::Tensor>(std::move(x));
  }

 private:
  torch::nn::AnyModule inner_;
};
TORCH_MODULE(ProbedChild);

inline torch::nn::Sequential probe_children(const torch::nn::Sequential& seq) {
  torch::nn::Sequential out;
  const auto names = seq->named_children();
  std::size_t k = 0;
  for (const torch::nn::AnyModule& child : *seq) out->push_back(std::string(names[k++].key()), ProbedChild(child));
  return out;
}

}  // namespace torchprobe

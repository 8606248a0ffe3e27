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

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "capture/api_observer.hpp"
#include "capture/module_events.hpp"

namespace torchprobe {

namespace details {

class ModuleScopeBase {
 protected:
  ModuleScopeBase(const torch::nn::Module& module, const std::string* dump_name, std::vector<c10::IValue> inputs)
      : handler_(capture::ApiObserver::active()), uncaught_(std::uncaught_exceptions()) {
    events_ = dynamic_cast<capture::ModuleEvents*>(handler_.get());
    if (events_) token_ = events_->module_enter(module, dump_name, std::move(inputs));
  }
  ~ModuleScopeBase() {
    if (events_ && token_)
      events_->module_exit(token_, has_outputs_ ? &outputs_ : nullptr, std::uncaught_exceptions() > uncaught_);
  }

  std::shared_ptr<capture::ApiHandler> handler_;  // keeps the capture alive until the scope ends
  capture::ModuleEvents* events_ = nullptr;
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
    if constexpr (std::is_base_of_v<torch::nn::Module, Holder>) return m;
    else return *m;  // a module holder or a pointer
  }
};

}  // namespace torchprobe

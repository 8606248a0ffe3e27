#pragma once
// How a ModuleGuard or ScopedModuleDump reaches the running capture without knowing its type.
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace torchprobe::capture {

class ModuleEvents {
 public:
  virtual ~ModuleEvents() = default;
  // A module's forward begins on this thread. `dump_name` set: ScopedModuleDump, which records
  // only this module, under that name, and nothing else on this thread until it ends.
  // Returns a token for module_exit, or nullptr when the module is not one the capture knows.
  virtual void* module_enter(const torch::nn::Module& module, const std::string* dump_name,
                             std::vector<c10::IValue> inputs) = 0;
  // `outputs` null: the module's output is that of the last outermost call made inside it.
  virtual void module_exit(void* token, const std::vector<c10::IValue>* outputs, bool unwinding) = 0;

  // TorchScript submodule calls, from the probes put around them (torchscript.hpp): `object` is
  // the module's object; calls nest, so the exit pairs with the latest enter on this thread.
  virtual void script_module_enter(const void* object, std::vector<c10::IValue> inputs) = 0;
  virtual void script_module_exit(const c10::IValue& output) = 0;
};

// The running capture's module events, or null: what a ModuleGuard reaches. ApiObserver sets it
// beside its handler (attach/detach); kept here, apart from the observer's code, so that a file with
// ModuleGuards in its model parses this header only (issue 43). The pointer shares the handler's
// ownership: a guard keeps the capture alive until it ends.
inline std::shared_ptr<ModuleEvents>& module_events_slot() {
  static std::shared_ptr<ModuleEvents> slot;
  return slot;
}
inline std::shared_ptr<ModuleEvents> active_module_events() { return std::atomic_load(&module_events_slot()); }

}  // namespace torchprobe::capture

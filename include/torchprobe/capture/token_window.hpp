#pragma once
// start(model, token_range): msprobe's inference dump of chosen tokens. The forward calls of the
// model given to start() are counted from 0 (one call = one token); recording is on from the
// beginning of forward `start` to the beginning of forward `end + 1` (or stop()), so the calls a
// generation loop makes between two forwards (sampling) belong to the token before them, as in
// msprobe, whose forward pre-hook on the root model switches the dump on and off.
//
// How a root forward is seen:
//  - torch::nn: a ModuleGuard on the root module, in its forward (`ModuleGuard guard(this, x);`)
//    or around the call (`{ ModuleGuard g(model.get()); model->forward(x); }`); torch::nn has no
//    forward hooks, so a root forward without a guard is not seen (stop() then says so);
//  - TorchScript: the RecordFunction record libtorch makes for every Module::forward call
//    (scope TORCHSCRIPT_FUNCTION, `self` as first input), the outermost one on its thread.
#include <ATen/record_function.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "torchprobe/capture/model_ref.hpp"
#include "torchprobe/capture/record_depth.hpp"

namespace torchprobe {

// The forward calls to dump, counted from 0, both ends included (msprobe's [start, end]).
struct TokenRange {
  std::int64_t start = 0;
  std::int64_t end = 0;
};

// msprobe's checks of start(model, token_range): a model is required, and 0 <= start <= end.
// Throws std::invalid_argument naming what is wrong.
inline void check_token_range(const TokenRange& r, const ModelRef& model) {
  const std::string shown = "{" + std::to_string(r.start) + ", " + std::to_string(r.end) + "}";
  if (r.start < 0 || r.end < r.start)
    throw std::invalid_argument("torchprobe: start(): token_range " + shown +
                                " is invalid; it must be {start, end} with 0 <= start <= end");
  if (model.empty())
    throw std::invalid_argument("torchprobe: start(): missing the parameter 'model': token_range " + shown +
                                " counts the forward calls of the model given to start(model, token_range)");
}

namespace capture {

// The count of root forwards and whether the current one is inside the range. Shared by the
// capture (which records only while open()) and the TorchScript observer below.
class TokenWindow {
 public:
  enum class Change { None, Opened, Closed };

  // `root`: the torch::nn::Module, or the TorchScript module's object, whose forwards count.
  TokenWindow(TokenRange range, const void* root) : range_(range), root_(root) {}

  const void* root() const { return root_; }
  const TokenRange& range() const { return range_; }
  bool open() const { return open_.load(std::memory_order_acquire); }
  std::int64_t forwards() const { return next_.load(); }

  // A forward of the root begins.
  Change forward_begins() {
    const std::int64_t id = next_.fetch_add(1);
    if (id == range_.start) {
      open_.store(true, std::memory_order_release);
      return Change::Opened;
    }
    if (id == range_.end + 1) {
      open_.store(false, std::memory_order_release);
      return Change::Closed;
    }
    return Change::None;
  }

  // A user ATen call ran while the window was closed (for stop()'s diagnosis).
  void saw_call() { saw_calls_.store(true, std::memory_order_relaxed); }
  bool saw_calls() const { return saw_calls_.load(std::memory_order_relaxed); }

 private:
  const TokenRange range_;
  const void* const root_;
  std::atomic<std::int64_t> next_{0};
  std::atomic<bool> open_{false};
  std::atomic<bool> saw_calls_{false};
};

// Counts the forward calls of a TorchScript root: a global callback on TORCHSCRIPT_FUNCTION
// records, registered between attach() and detach() only.
class ScriptForwardObserver : private ObserverStatics<ScriptForwardObserver, TokenWindow> {
 public:
  ScriptForwardObserver() = default;
  ScriptForwardObserver(const ScriptForwardObserver&) = delete;
  ScriptForwardObserver& operator=(const ScriptForwardObserver&) = delete;
  ~ScriptForwardObserver() { detach(); }

  void attach(std::shared_ptr<TokenWindow> window) {
    std::lock_guard<std::mutex> lock(mutex());
    if (handle_ != 0) return;
    std::atomic_store(&slot(), std::move(window));
    epoch().fetch_add(1, std::memory_order_acq_rel);  // depths left by an earlier session are void
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                        .needsInputs(true)
                                        .scopes({at::RecordScope::TORCHSCRIPT_FUNCTION}));
  }

  void detach() {
    std::lock_guard<std::mutex> lock(mutex());
    if (handle_ == 0) return;
    at::removeCallback(handle_);
    handle_ = 0;
    std::atomic_store(&slot(), std::shared_ptr<TokenWindow>());
  }

 private:
  // Only the outermost record counts: libtorch records a forward again inside the executor.
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    if (!depth().enter(epoch().load(std::memory_order_acquire))) return nullptr;
    if (std::string(fn.name()) != "forward") return nullptr;
    const auto inputs = fn.inputs();
    if (inputs.empty() || !inputs[0].isObject()) return nullptr;
    std::shared_ptr<TokenWindow> w = std::atomic_load(&slot());
    if (w && inputs[0].toObject().get() == w->root()) w->forward_begins();
    return nullptr;
  }
  static void on_end(const at::RecordFunction&, at::ObserverContext*) {
    depth().leave(epoch().load(std::memory_order_relaxed));
  }

  at::CallbackHandle handle_ = 0;
};

}  // namespace capture
}  // namespace torchprobe

#pragma once
// The one RecordFunction observer through which the probe sees ATen calls.
//
// RecordFunction callbacks are plain function pointers, so the observer keeps the active handler
// in a process-wide slot. The callback is global (not thread-local) because autograd runs
// backward on its own threads and users run models on several; it is registered only between
// attach() and detach(), so a debugger that is not started costs nothing at all.
#include <ATen/record_function.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "torchprobe/capture/backend_threads.hpp"
#include "torchprobe/capture/collective.hpp"
#include "torchprobe/capture/dispatched_collectives.hpp"
#include "torchprobe/capture/module_events.hpp"
#include "torchprobe/capture/op_registry.hpp"
#include "torchprobe/capture/record_depth.hpp"

namespace torchprobe::capture {

// What a debugger implements to receive calls. `on_api_start` is called for outermost calls of
// user-visible ATen ops only, and is the only place where fn.inputs() is valid; the context it
// returns comes back to `on_api_end` with the outputs.
class ApiHandler;

// A call in flight. It owns a reference to its handler, so a call that is still running when
// the debugger stops (a backward thread, say) finishes safely.
struct CallContext : at::ObserverContext {
  std::shared_ptr<ApiHandler> handler;
  bool dispatched_collective = false;  // a DispatchedCall (below)
};

// A collective that went through the dispatcher, between its operator's start and end.
struct DispatchedCall : CallContext {
  Collective collective;
  std::unique_ptr<CallContext> entry;  // the handler's, from on_collective_start
};

// Level L2: what the records running inside a record inherit from it (one per open record on a
// thread). A recorded call makes itself the parent of what it runs; autograd's node records make
// the backward entry of the call that created the node the parent of the ops the node runs.
struct Enclosing {
  std::shared_ptr<const std::string> forward;   // construct.json parent of the calls inside
  std::shared_ptr<const std::string> backward;  // and of their backward entries
  bool hidden = false;           // inside an op that hides what it runs (infrastructure), or a node no call owns
  bool inside = false;           // inside the call the L2 list names: everything is dumped
  bool inside_backward = false;  // inside (or running the ops of) the backward entry the list names
};

class ApiHandler {
 public:
  virtual ~ApiHandler() = default;
  // Called for every outermost call: user APIs (op.user_api) and also infrastructure ops and
  // autograd's own records, which a module tracker needs to see as boundaries.
  // Return nullptr to ignore the call.
  virtual std::unique_ptr<CallContext> on_api_start(const at::RecordFunction& fn, const OpInfo& op) = 0;
  virtual void on_api_end(const at::RecordFunction& fn, CallContext& ctx) = 0;
  // Level L2 (attach(handler, /*nested=*/true)): every operator call at every depth, with `frame`
  // holding what encloses it; the handler leaves in `frame` what the call's own ops inherit.
  virtual std::unique_ptr<CallContext> on_nested_start(const at::RecordFunction& /*fn*/, const OpInfo& /*op*/,
                                                       Enclosing& /*frame*/) {
    return nullptr;
  }
  // Level L2: the backward entry of the call that created the autograd node (forward thread,
  // sequence number) that is about to run, if a recorded call did.
  virtual std::optional<Enclosing> backward_node(std::uint64_t /*forward_thread*/, std::int64_t /*seq*/) {
    return std::nullopt;
  }
  // A collective, from the wrappers of distributed.hpp: its start (inputs as they are before it
  // runs) and, once its work has completed, its end (the same arguments, now written).
  virtual std::unique_ptr<CallContext> on_collective_start(const Collective&) { return nullptr; }
  virtual void on_collective_end(const Collective&, CallContext&) {}
  // A collective that went through the dispatcher returned; its work may still be running
  // (Collective::completed says). A handler that keeps it finishes it once the work completed.
  virtual void on_collective_dispatched(Collective c, std::unique_ptr<CallContext> entry) {
    on_collective_end(c, *entry);
  }
};

class ApiObserver : private ObserverStatics<ApiObserver, ApiHandler> {
 public:
  ApiObserver() = default;
  ApiObserver(const ApiObserver&) = delete;
  ApiObserver& operator=(const ApiObserver&) = delete;
  ~ApiObserver() { detach(); }

  // `nested` (level L2): every call reaches the handler, not only outermost ones, and autograd's
  // node records are watched too (they say which backward entry the ops inside belong to).
  void attach(std::shared_ptr<ApiHandler> handler, bool nested = false) {
    std::lock_guard<std::mutex> lock(mutex());
    if (handle_ != 0) return;
    if (std::atomic_load(&slot()))
      throw std::logic_error("torchprobe: another Debugger is already started in this process; stop() it first");
    // A new epoch makes every thread forget a nesting depth left over from an earlier session
    // (a call that was in flight when the previous session detached never saw its end).
    // The slot is filled before the epoch moves: a thread that sees the new epoch finds the handler.
    auto* events = dynamic_cast<ModuleEvents*>(handler.get());
    std::atomic_store(&module_events_slot(), events ? std::shared_ptr<ModuleEvents>(handler, events) : nullptr);
    std::atomic_store(&slot(), std::move(handler));
    epoch().fetch_add(1, std::memory_order_acq_rel);
    handle_ = nested
                  ? at::addGlobalCallback(at::RecordFunctionCallback(&on_nested_start, &on_nested_end)
                                              .needsInputs(true)
                                              .needsOutputs(true)
                                              .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}))
                  : at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                              .needsInputs(true)
                                              .needsOutputs(true)
                                              .scopes({at::RecordScope::FUNCTION}));
  }

  void detach() {
    std::lock_guard<std::mutex> lock(mutex());
    if (handle_ == 0) return;
    at::removeCallback(handle_);
    handle_ = 0;
    // Calls already in flight keep their handler alive through the context they hold.
    std::atomic_store(&slot(), std::shared_ptr<ApiHandler>());
    std::atomic_store(&module_events_slot(), std::shared_ptr<ModuleEvents>());
    epoch().fetch_add(1, std::memory_order_acq_rel);  // threads drop their cached handler
  }

  bool attached() const { return handle_ != 0; }

  // The handler of the running capture, or null: how RAII module guards find it.
  static std::shared_ptr<ApiHandler> active() { return std::atomic_load(&slot()); }

 private:
  // Every record of FUNCTION scope counts towards the nesting depth, including non-ATen ones
  // such as autograd's "evaluate_function: XBackward0": that is what keeps the ATen ops run
  // inside a backward node from being mistaken for user calls.
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    const std::uint64_t e = epoch().load(std::memory_order_acquire);
    if (!depth().enter(e)) return nullptr;
    const OpInfo& op = OpRegistry::lookup(fn);
    std::shared_ptr<ApiHandler> h = current_handler(e);
    if (!h) return nullptr;
    // A collective's c10d operator is no API of OpRegistry's (its namespace is internal).
    if (!op.user_api)
      if (const DispatchedCollective* kind = dispatched_collective(fn.name()))
        return start_dispatched(fn, *kind, std::move(h));
    std::unique_ptr<CallContext> ctx = h->on_api_start(fn, op);
    if (ctx) ctx->handler = std::move(h);
    return ctx;
  }

  static void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
    depth().leave(epoch().load(std::memory_order_relaxed));
    if (ctx == nullptr) return;
    // Only this observer's start callback made contexts for this callback.
    auto* call = static_cast<CallContext*>(ctx);
    if (call->dispatched_collective) return end_dispatched(fn, static_cast<DispatchedCall&>(*call));
    call->handler->on_api_end(fn, *call);
  }

  // A collective's c10d operator (capture/dispatched_collectives.hpp), read by the reader that
  // distributed.hpp installs; not when a torchprobe::dist wrapper made the call (it records it).
  static std::unique_ptr<at::ObserverContext> start_dispatched(const at::RecordFunction& fn,
                                                               const DispatchedCollective& kind,
                                                               std::shared_ptr<ApiHandler> h) {
    const DispatchedReader* reader = dispatched_reader().load(std::memory_order_acquire);
    if (reader == nullptr || wrapper_running()) return nullptr;
    try {
      auto call = std::make_unique<DispatchedCall>();
      if (!reader->describe(fn, kind, call->collective)) return nullptr;
      call->entry = h->on_collective_start(call->collective);
      if (!call->entry) return nullptr;
      call->handler = std::move(h);
      call->dispatched_collective = true;
      return call;
    } catch (...) {  // the probe never fails the training step
      return nullptr;
    }
  }

  static void end_dispatched(const at::RecordFunction& fn, DispatchedCall& call) {
    try {
      dispatched_reader().load(std::memory_order_acquire)->attach_work(fn, call.collective);
    } catch (...) {  // no work to poll: the entry is finished as it is now
    }
    call.handler->on_collective_dispatched(std::move(call.collective), std::move(call.entry));
  }

  // Level L2: one frame per open record on this thread, whatever it is, so that on_end pops
  // exactly what on_start pushed.
  struct Frames {
    std::vector<Enclosing> open;
    std::uint64_t epoch = 0;
  };
  static Frames& frames() {
    thread_local Frames f;
    return f;
  }

  static std::unique_ptr<at::ObserverContext> on_nested_start(const at::RecordFunction& fn) {
    Frames& fs = frames();
    const std::uint64_t e = epoch().load(std::memory_order_acquire);
    if (fs.epoch != e) fs = Frames{{}, e};
    Enclosing frame = fs.open.empty() ? Enclosing{} : fs.open.back();
    std::unique_ptr<CallContext> ctx;
    const bool node = fn.scope() == at::RecordScope::BACKWARD_FUNCTION;
    std::shared_ptr<ApiHandler> h = frame.hidden && !node ? nullptr : current_handler(e);
    if (h && node) {
      // A node runs: its ops, and what the engine does with its results in the enclosing
      // evaluate_function record, belong to the backward entry of the call that created it.
      std::optional<Enclosing> owner = h->backward_node(fn.forwardThreadId(), fn.seqNr());
      frame = owner ? std::move(*owner) : Enclosing{{}, {}, /*hidden=*/true, false, false};
      if (!fs.open.empty()) fs.open.back() = frame;
    } else if (h) {
      const char* name = fn.name();
      const OpInfo& op = OpRegistry::lookup(fn);
      if (!op.qualified.empty()) {
        ctx = h->on_nested_start(fn, op, frame);
        if (ctx) ctx->handler = std::move(h);
      } else if (std::strncmp(name, "autograd::engine::evaluate_function:", 36) == 0) {
        frame = Enclosing{{}, {}, /*hidden=*/true, false, false};  // until its node record says whose it is
      }
    }
    fs.open.push_back(std::move(frame));
    return ctx;
  }

  static void on_nested_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
    Frames& fs = frames();
    if (fs.epoch == epoch().load(std::memory_order_relaxed) && !fs.open.empty()) fs.open.pop_back();
    if (ctx == nullptr) return;
    auto* call = static_cast<CallContext*>(ctx);
    call->handler->on_api_end(fn, *call);
  }

  // The handler, through a per-thread weak reference refreshed when the epoch changes: an
  // atomic_load of the shared slot takes a lock (libstdc++), which every call would pay.
  // A backend's own thread (capture/backend_threads.hpp) gets none.
  static std::shared_ptr<ApiHandler> current_handler(std::uint64_t epoch_now) {
    if (on_backend_thread()) return nullptr;
    struct Cached {
      std::uint64_t epoch = 0;
      std::weak_ptr<ApiHandler> handler;
    };
    thread_local Cached cached;
    if (cached.epoch != epoch_now) cached = {epoch_now, std::atomic_load(&slot())};
    return cached.handler.lock();
  }

  at::CallbackHandle handle_ = 0;
};

}  // namespace torchprobe::capture

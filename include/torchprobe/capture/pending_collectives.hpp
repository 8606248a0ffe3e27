#pragma once
// The dispatched collectives of a running capture whose work is still running
// (capture/dispatched_collectives.hpp says which calls these are).
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "torchprobe/capture/api_observer.hpp"
#include "torchprobe/capture/collective.hpp"

namespace torchprobe::capture {

// Dispatched collectives whose work had not completed when the operator returned (all of them on
// Gloo and NCCL: the operator only enqueues the work). The probe never waits: each is finished
// when a later call on any thread finds its work completed, and at stop() whatever is left is
// finished too (without an output when its work is still running).
class PendingCollectives {
 public:
  void add(Collective c, std::unique_ptr<CallContext> ctx) {
    std::lock_guard<std::mutex> lock(mutex_);
    calls_.emplace_back(std::move(c), std::move(ctx));
    waiting_.store(true, std::memory_order_release);
  }
  bool waiting() const { return waiting_.load(std::memory_order_acquire); }

  // Whether a call's work has completed. A work that cannot say (its backend threw) counts as
  // still running: at stop() its entry is written without an output. Never throws (stop() may not).
  static bool completed(const Collective& c) noexcept {
    try {
      return !c.completed || c.completed();
    } catch (...) {
      return false;
    }
  }

  // Takes out the calls whose work completed (every call when `final`); `finish(c, ctx)` records
  // each, outside the lock (reading a tensor's statistics runs ATen ops).
  template <class Finish>
  void poll(bool final, Finish&& finish) {
    std::vector<std::pair<Collective, std::unique_ptr<CallContext>>> done;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (std::size_t i = 0; i < calls_.size();) {
        Collective& c = calls_[i].first;
        const bool done_now = completed(c);
        if (done_now || final) {
          c.ended = done_now;
          done.push_back(std::move(calls_[i]));
          calls_.erase(calls_.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
      waiting_.store(!calls_.empty(), std::memory_order_release);
    }
    for (auto& [c, ctx] : done) finish(c, *ctx);
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<Collective, std::unique_ptr<CallContext>>> calls_;
  std::atomic<bool> waiting_{false};
};

}  // namespace torchprobe::capture

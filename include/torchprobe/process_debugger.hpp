#pragma once
// The process's debugger. msprobe's guide makes the PrecisionDebugger in one file and calls start()
// and stop() in another, through the class. Here the first PrecisionDebugger made (and still alive)
// is the process's: torchprobe::start(model), torchprobe::stop() and torchprobe::step(), or
// PrecisionDebugger::instance(), reach it from any translation unit of the program. Once it is
// destroyed, the next PrecisionDebugger made takes its place.
#include <atomic>
#include <stdexcept>
#include <utility>

#include "torchprobe/debugger_interface.hpp"

namespace torchprobe {

namespace details {

// One slot per process: an inline function's static is one object in every translation unit.
inline std::atomic<DebuggerInterface*>& process_debugger_slot() {
  static std::atomic<DebuggerInterface*> slot{nullptr};
  return slot;
}
// A PrecisionDebugger made: it becomes the process's debugger when there is none.
inline void claim_process_debugger(DebuggerInterface* d) {
  DebuggerInterface* none = nullptr;
  process_debugger_slot().compare_exchange_strong(none, d);
}
// A PrecisionDebugger destroyed: the slot is free again if it was this one.
inline void release_process_debugger(DebuggerInterface* d) {
  process_debugger_slot().compare_exchange_strong(d, nullptr);
}

}  // namespace details

// The first PrecisionDebugger made and still alive; std::logic_error when there is none.
inline DebuggerInterface& process_debugger() {
  DebuggerInterface* d = details::process_debugger_slot().load();
  if (d == nullptr)
    throw std::logic_error(
        "torchprobe: no PrecisionDebugger exists in this process: make one first (PrecisionDebugger "
        "dbg(\"config.json\")), and keep it alive while torchprobe::start()/stop()/step() are called");
  return *d;
}

// start() in any of its forms (start(), start(rank_id), start(model), start(model, rank_id),
// start(model, token_range), start(model, pg)), stop() and step() of the process's debugger.
template <class... Args>
void start(Args&&... args) {
  process_debugger().start(std::forward<Args>(args)...);
}
inline void stop() { process_debugger().stop(); }
inline void step() { process_debugger().step(); }
// stop() under the name earlier msprobe releases gave it.
inline void forward_backward_dump_end() { process_debugger().forward_backward_dump_end(); }

}  // namespace torchprobe

#pragma once
// The state a running capture needs, owned jointly by the Debugger and by every call in flight:
// a backward thread may still be finishing a call after the Debugger stopped or went away.
#include <atomic>
#include <cstdint>

#include "../config/config.hpp"
#include "../io/error_log.hpp"
#include "step_state.hpp"

namespace torchprobe::details {

template <class TaskT>
struct DumpCore {
  explicit DumpCore(Config c) : config(std::move(c)), task(config), state(config), errors(std::string()) {}
  const Config config;
  TaskT task;
  StepState state;
  io::ErrorLog errors;
  // Between start() and stop(). Gradients that arrive while stopped are not recorded.
  std::atomic<bool> capturing{false};
  // Advanced by step(): a backward pass that belongs to an earlier step records nothing.
  std::atomic<std::uint64_t> generation{0};

  bool live(std::uint64_t gen) const { return capturing.load() && generation.load() == gen; }

  // Every finished entry goes through here: the task has the last word on it (a task may keep
  // only some entries, or act on the ones it keeps) before it joins the step.
  void commit(Record&& r) {
    if (task.keep(r)) state.commit(std::move(r));
  }
  // The same, for entries placed in dump order when they complete (backward, modules).
  void commit_last(Record&& r) {
    if (task.keep(r)) state.commit_last(std::move(r));
  }
};

}  // namespace torchprobe::details

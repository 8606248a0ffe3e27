#pragma once
// A task that checks calls instead of recording them (free_benchmark re-runs each one) sees every
// admitted outermost call whole: its operator, its inputs at the start, its outputs at the end.
// Such a task makes no entries of calls (dump.json's "data" stays {}): no statistics, no stacks,
// no backward hooks are built for them.
//
// Optional part of a task policy, found by detection:
//   template <class Values>
//   std::unique_ptr<CallCheck> check_call(const OpInfo&, const Values& inputs, const std::string& name);
//       at the start of the call named `name` (inputs are valid only now); null: not checked
//   template <class Values> void check_call_end(CallCheck&, const Values& outputs);
#include <ATen/core/ivalue.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "torchprobe/capture/op_registry.hpp"

namespace torchprobe::capture {

// What the task keeps of a call from its start to its end.
struct CallCheck {
  virtual ~CallCheck() = default;
};

template <class T, class = void>
struct task_checks_calls : std::false_type {};
template <class T>
struct task_checks_calls<T, std::void_t<decltype(std::declval<T&>().check_call(
                                std::declval<const OpInfo&>(), std::declval<const std::vector<c10::IValue>&>(),
                                std::declval<const std::string&>()))>> : std::true_type {};

}  // namespace torchprobe::capture

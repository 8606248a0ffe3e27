#pragma once
// The sink contract, written once: what a sink class must have, what it may have, and how the
// rest of TorchProbe finds out. check_sink<S>() stops the build with a message that names what a
// sink lacks, before any deeper error (as task/task_traits.hpp does for tasks).
//
// Must have:
//   void open(const std::string& directory);   // a dumped step starts; {dump_path}/step{N}/{rank dir}
//                                              // (dump_tensor_data/ is made before, when tensors are saved)
//   void write_step(const StepDump&);          // a step (or a part of it) is flushed
// May have (found by detection):
//   void write_debug(const StepDump&);         // debug.json, save()'s entries (dropped without it)
//   static constexpr bool keeps_journal = true;         // its JSON goes to the step directory, so the
//                                                       // step journal (io/journal.hpp) is kept there
//                                                       // for crash recovery
//   static constexpr bool writes_in_background = true;  // written on the writer's thread
//                                                       // (details/step_writer.hpp); without it
//                                                       // stop()/step() write it themselves
// A sink is made by the Debugger when none is given (then it needs a default constructor; MemorySink,
// with its mutex, cannot be moved), or made by the user and moved in: BasicDebugger(options,
// MySink{...}) (then it needs a move constructor). write_step/write_debug of a background sink
// run on the writer's thread, one at a time; of other sinks, on the thread that calls
// stop()/step().
#include <string>
#include <type_traits>
#include <utility>

#include "torchprobe/sink/step_dump.hpp"

namespace torchprobe {
namespace sink_traits {

template <class S, class = void>
struct has_open : std::false_type {};
template <class S>
struct has_open<S, std::void_t<decltype(std::declval<S&>().open(std::declval<const std::string&>()))>>
    : std::true_type {};

template <class S, class = void>
struct has_write_step : std::false_type {};
template <class S>
struct has_write_step<S, std::void_t<decltype(std::declval<S&>().write_step(std::declval<const StepDump&>()))>>
    : std::true_type {};

template <class S, class = void>
struct writes_debug : std::false_type {};
template <class S>
struct writes_debug<S, std::void_t<decltype(std::declval<S&>().write_debug(std::declval<const StepDump&>()))>>
    : std::true_type {};

template <class S, class = void>
struct keeps_journal : std::false_type {};
template <class S>
struct keeps_journal<S, std::void_t<decltype(S::keeps_journal)>> : std::bool_constant<S::keeps_journal> {};

template <class S, class = void>
struct writes_in_background : std::false_type {};
template <class S>
struct writes_in_background<S, std::void_t<decltype(S::writes_in_background)>>
    : std::bool_constant<S::writes_in_background> {};

}  // namespace sink_traits

// True when S is a complete sink; check_sink<S>() says what is missing.
template <class S>
inline constexpr bool is_sink_v = sink_traits::has_open<S>::value&& sink_traits::has_write_step<S>::value;

template <class S>
constexpr bool check_sink() {
  static_assert(sink_traits::has_open<S>::value,
                "torchprobe: a sink needs `void open(const std::string& directory)` (a dumped step starts)");
  static_assert(sink_traits::has_write_step<S>::value,
                "torchprobe: a sink needs `void write_step(const StepDump&)` (a step is flushed)");
  return is_sink_v<S>;
}

}  // namespace torchprobe

// The compiled library's PrecisionDebugger: it makes the debugger of the configured task and level,
// each compiled once in debuggers_*.cpp.
// The target defines TORCHPROBE_INCLUDE_IMPLEMENTATION: torchprobe.hpp includes the implementations.
#include "torchprobe/torchprobe.hpp"

#include <cstddef>

namespace {
// torchprobe/compiled.hpp lists every (level, task) pair of the built-in tasks, so that no user's
// file compiles one: as many pairs as the tasks' `levels` hold.
#define TORCHPROBE_COUNT_COMPILED(level, task) +1
constexpr std::size_t kListed = 0 TORCHPROBE_COMPILED_DEBUGGERS(TORCHPROBE_COUNT_COMPILED);
#undef TORCHPROBE_COUNT_COMPILED
template <class... Tasks>
constexpr std::size_t supported_pairs(torchprobe::TaskList<Tasks...>*) {
  std::size_t n = 0;
  for (torchprobe::Level l : torchprobe::kLevels) n += ((Tasks::levels.contains(l) ? 1 : 0) + ...);
  return n;
}
static_assert(kListed == supported_pairs(static_cast<torchprobe::BuiltinTasks*>(nullptr)),
              "torchprobe/compiled.hpp lists every level of every built-in task");
}  // namespace

TORCHPROBE_DEFINE_COMPILED_PRECISION_DEBUGGER

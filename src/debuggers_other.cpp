// The compiled library's other debuggers (torchprobe/compiled.hpp lists them): each is compiled
// here once instead of in every file that uses it.
#include "torchprobe/torchprobe.hpp"

#include "torchprobe/debugger_impl.hpp"
#include "torchprobe/task/registry.hpp"

TORCHPROBE_OTHER_DEBUGGERS(TORCHPROBE_DEFINE_COMPILED)

// The compiled library's other debuggers (torchprobe/compiled.hpp lists them): each is compiled
// here once instead of in every file that uses it.
// The target defines TORCHPROBE_INCLUDE_IMPLEMENTATION: torchprobe.hpp includes the implementations.
#include "torchprobe/torchprobe.hpp"

TORCHPROBE_OTHER_DEBUGGERS(TORCHPROBE_DEFINE_COMPILED)

// The compiled library's tensor debuggers (torchprobe/compiled.hpp lists them): each is compiled
// here once instead of in every file that uses it.
#include "torchprobe/torchprobe.hpp"

#include "torchprobe/debugger_impl.hpp"
#include "torchprobe/task/registry.hpp"

#define TORCHPROBE_DEFINE_COMPILED(level, task) \
  template class ::torchprobe::BasicDebugger<::torchprobe::Level::level, ::torchprobe::task>;
TORCHPROBE_TENSOR_DEBUGGERS(TORCHPROBE_DEFINE_COMPILED)

#pragma once
// The debuggers the compiled library (CMake target torchprobe::compiled) holds: every built-in
// task at each level it supports, with the default sink, and PrecisionDebugger. A file that
// includes torchprobe.hpp with TORCHPROBE_COMPILED_LIB defined declares them here and compiles
// none of them (an explicit instantiation declaration); the library's sources (src/, or
// single_include/torchprobe_compiled.cpp) define TORCHPROBE_INCLUDE_IMPLEMENTATION, which makes
// torchprobe.hpp include the implementations, and define them. Without TORCHPROBE_COMPILED_LIB
// (header-only use) only the lists below are defined: every file compiles what it uses.
#include "torchprobe/debugger.hpp"
#include "torchprobe/precision_debugger.hpp"
#include "torchprobe/task/builtin.hpp"

// X(level, task class) for each of them, grouped by task so that the library can compile each
// group in a file of its own.
// clang-format off
#define TORCHPROBE_STATISTICS_DEBUGGERS(X) \
  X(L0, StatisticsTask) X(L1, StatisticsTask) X(Mix, StatisticsTask) X(L2, StatisticsTask) X(Debug, StatisticsTask)
#define TORCHPROBE_TENSOR_DEBUGGERS(X) \
  X(L0, TensorTask) X(L1, TensorTask) X(Mix, TensorTask) X(L2, TensorTask) X(Debug, TensorTask)
#define TORCHPROBE_OTHER_DEBUGGERS(X) \
  X(L0, OverflowCheckTask) X(L1, OverflowCheckTask) X(Mix, OverflowCheckTask) \
  X(L1, FreeBenchmarkTask) \
  X(L0, StructureTask) X(Mix, StructureTask)
#define TORCHPROBE_COMPILED_DEBUGGERS(X) \
  TORCHPROBE_STATISTICS_DEBUGGERS(X) TORCHPROBE_TENSOR_DEBUGGERS(X) TORCHPROBE_OTHER_DEBUGGERS(X)
// clang-format on

// Declared here for every file; defined by the library's sources, a group each.
#define TORCHPROBE_DECLARE_COMPILED(level, task) \
  extern template class ::torchprobe::BasicDebugger<::torchprobe::Level::level, ::torchprobe::task>;
#define TORCHPROBE_DEFINE_COMPILED(level, task) \
  template class ::torchprobe::BasicDebugger<::torchprobe::Level::level, ::torchprobe::task>;
#define TORCHPROBE_DEFINE_COMPILED_PRECISION_DEBUGGER \
  template class ::torchprobe::BasicPrecisionDebugger<::torchprobe::BuiltinTasks>;
#if defined(TORCHPROBE_COMPILED_LIB)
TORCHPROBE_COMPILED_DEBUGGERS(TORCHPROBE_DECLARE_COMPILED)
extern template class ::torchprobe::BasicPrecisionDebugger<::torchprobe::BuiltinTasks>;
#endif

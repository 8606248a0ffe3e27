#pragma once
// TorchProbe: msprobe-compatible precision dumps for libtorch programs.
//
//   #include <torchprobe/torchprobe.hpp>
//   torchprobe::Debugger<torchprobe::Level::L1, torchprobe::Task::Statistics> dbg(
//       torchprobe::Options().dump_path("./dump"));
//   { torchprobe::ScopedDump scope(dbg, model); auto loss = model->forward(x).sum(); loss.backward(); }
//   dbg.step();

#if __cplusplus < 201703L
#error "TorchProbe needs C++17 (-std=c++17); the CMake target torchprobe::torchprobe sets it"
#endif
// libtorch ships as an NDEBUG build. Without NDEBUG its inline RecordFunction::inputs() asserts on a
// flag the library never sets, so every capture would fail, and the struct layout differs.
#ifndef NDEBUG
#error \
    "TorchProbe must be compiled with -DNDEBUG to match the release libtorch; link the CMake target torchprobe::torchprobe, which sets it"
#endif
// at::parallel_for is an inline OpenMP template: without -fopenmp the statistics of large tensors
// silently run on one thread. Define TORCHPROBE_NO_OPENMP to accept that.
#if !defined(_OPENMP) && !defined(TORCHPROBE_NO_OPENMP)
#error \
    "TorchProbe expects -fopenmp (as libtorch's at::parallel_for does); link torchprobe::torchprobe, which adds it, or define TORCHPROBE_NO_OPENMP"
#endif

#include "torchprobe/version.hpp"
#include "torchprobe/core/kinds.hpp"
#include "torchprobe/core/save_value.hpp"
#include "torchprobe/config/config.hpp"
#include "torchprobe/config/options.hpp"
#include "torchprobe/debugger.hpp"
#include "torchprobe/precision_debugger.hpp"
#include "torchprobe/process_debugger.hpp"
#include "torchprobe/scoped_dump.hpp"
#include "torchprobe/module_guard.hpp"
#include "torchprobe/seed.hpp"

#if defined(TORCHPROBE_COMPILED_LIB) && !defined(TORCHPROBE_INCLUDE_IMPLEMENTATION)
// The compiled library (CMake target torchprobe::compiled, or single_include/torchprobe_compiled.cpp
// beside the single header): the built-in debuggers and PrecisionDebugger are compiled there once,
// so this file parses their faces only. A Debugger of your own task or sink, and the features
// below, have their own headers:
// torchprobe/debugger_impl.hpp (a Debugger of your own task or sink), torchprobe/sink/*.hpp,
// torchprobe/custom_api.hpp, torchprobe/random_save.hpp, torchprobe/distributed.hpp,
// torchprobe/task/grad_probe/monitor.hpp.
#include "torchprobe/compiled.hpp"
#else
// Header-only: everything, the implementations included (each Debugger is compiled in the file
// that uses it). With the compiled library and TORCHPROBE_INCLUDE_IMPLEMENTATION, everything too,
// while the built-in debuggers stay declared extern (compiled.hpp): the library's own sources, which
// define them, and a single-header user's file with a Debugger of its own task or sink.
#include "torchprobe/sink/directory_sink.hpp"
#include "torchprobe/sink/memory_sink.hpp"
#include "torchprobe/sink/null_sink.hpp"
#include "torchprobe/sink/sink_traits.hpp"
#include "torchprobe/task/registry.hpp"
#include "torchprobe/debugger_impl.hpp"
#include "torchprobe/precision_debugger_impl.hpp"
#include "torchprobe/custom_api.hpp"
#include "torchprobe/random_save.hpp"
#include "torchprobe/task/grad_probe/monitor.hpp"
#include "torchprobe/compiled.hpp"
#endif

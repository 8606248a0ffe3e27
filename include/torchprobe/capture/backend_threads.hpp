#pragma once
// Threads that a c10d backend owns: Gloo's (and MPI's) work loops run ATen ops of their own while
// a collective executes (all_gather flattens, copies the result out). Those are the collective's
// insides, not calls of the user's: msprobe, which wraps Python functions, never sees them. The
// observer gives such a thread no handler. A thread's role never changes, so each thread is
// classified once, by the functions at the bottom of its stack at its first call.
#include <dlfcn.h>

#include <cstddef>
#include <string_view>

#include "torchprobe/io/call_stack_capture.hpp"

namespace torchprobe::capture {

namespace details {

// A c10d function that only a backend's own thread runs: ProcessGroupGloo::runLoop,
// ProcessGroupMPI::runLoop, the NCCL watchdog and its work-cleanup loop.
inline bool backend_loop_symbol(std::string_view mangled) {
  if (mangled.rfind("_ZN4c10d", 0) != 0) return false;
  return mangled.find("runLoop") != std::string_view::npos || mangled.find("atchdog") != std::string_view::npos ||
         mangled.find("CleanupLoop") != std::string_view::npos;
}

// A thread's first function sits at the bottom of its stack, under at most the C library's and
// std::thread's entry frames: only the outermost frames are named (dladdr searches a library's
// whole symbol table, libtorch's is large).
inline bool stack_runs_backend_loop() {
  constexpr std::size_t kOutermost = 8;
  const CallStack stack = io::capture_call_stack(256);
  const std::size_t n = stack.frames.size();
  for (std::size_t i = n > kOutermost ? n - kOutermost : 0; i < n; ++i) {
    Dl_info info{};
    if (::dladdr(stack.frames[i], &info) != 0 && info.dli_sname != nullptr && backend_loop_symbol(info.dli_sname))
      return true;
  }
  return false;
}

}  // namespace details

inline bool on_backend_thread() {
  thread_local const bool backend = details::stack_runs_backend_loop();
  return backend;
}

}  // namespace torchprobe::capture

#pragma once
// Capturing a call site cheaply: the return addresses of the current thread, nothing else.
//
// msprobe records, for every forward call, the Python stack that led to it; our equivalent is the
// native stack. Capturing happens on every recorded op, so it only stores return addresses
// (libunwind's or glibc's backtrace). Turning them into names and lines happens once per distinct
// address when stack.json is written (io/symbolizer.hpp, io/stack_json.hpp). Costs: docs/io.md.
#include <dlfcn.h>
#include <execinfo.h>

#include <memory>
#include <mutex>
#include <unordered_map>

#include "torchprobe/core/call_stack.hpp"

namespace torchprobe::io {

namespace details {

using BacktraceFunction = int (*)(void**, int);

// libunwind's unw_backtrace, when the process can load libunwind.so.8 (Debian 12 installs it with
// libtorch, through glog; Debian 13 does not). It walks a cached description of each frame, where
// glibc's backtrace() interprets the DWARF unwind tables every time (about ten times slower, most
// of a call stack's cost). It is opened RTLD_LOCAL, so it stays out of the global symbol scope:
// linked normally, its _Unwind_* functions and its weak backtrace() would replace libgcc's and
// glibc's for the whole process, C++ exceptions included. Where DWARF information is missing it
// falls back to the frame-pointer chain with its memory reads validated.
inline BacktraceFunction libunwind_backtrace() {
  static const BacktraceFunction fn = []() -> BacktraceFunction {
#if defined(__linux__) && defined(__x86_64__)
    void* lib = ::dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return nullptr;
    return reinterpret_cast<BacktraceFunction>(::dlsym(lib, "unw_backtrace"));
#else
    return nullptr;
#endif
  }();
  return fn;
}

}  // namespace details

// Which unwinder capture_call_stack uses: the fastest one available (libunwind when it loads,
// else glibc), or glibc's backtrace() always.
enum class Unwinder { Fastest, Glibc };

// Whether Unwinder::Fastest is libunwind in this process.
inline bool libunwind_available() { return details::libunwind_backtrace() != nullptr; }

// Up to max_frames return addresses of the current thread (at most 256), innermost first: the
// first is in the function that called capture_call_stack. No symbol lookup, no lock; the only
// cost is the unwind itself. The first call in a process loads the unwinder, so it allocates and
// must not happen inside a signal handler.
inline CallStack capture_call_stack(int max_frames = 48, Unwinder how = Unwinder::Fastest) {
  constexpr int kLimit = 256;
  CallStack out;
  if (max_frames <= 0) return out;
  if (max_frames > kLimit) max_frames = kLimit;
  void* buf[kLimit];
  int n = 0;
  if (how == Unwinder::Fastest)
    if (const details::BacktraceFunction fast = details::libunwind_backtrace()) n = fast(buf, max_frames);
  if (n <= 0) n = ::backtrace(buf, max_frames);
  if (n > 0) out.frames.assign(buf, buf + n);
  return out;
}

// capture_call_stack(), shared with every earlier capture of the same stack. A step's entries come
// from a few call sites, often thousands of calls each: one copy of each distinct stack is kept
// (per process) instead of one per entry, about 400 bytes an entry less in an open step. Past
// kMaxInterned distinct stacks (deep recursion, generated code), new ones are no longer kept.
inline std::shared_ptr<const CallStack> capture_shared_call_stack() {
  constexpr std::size_t kMaxInterned = std::size_t{1} << 16;
  static std::mutex mu;
  static auto* table = new std::unordered_map<CallStack, std::shared_ptr<const CallStack>,
                                              CallStackHash>();  // never freed: entries may outlive static destruction
  CallStack s = capture_call_stack();
  std::lock_guard<std::mutex> lock(mu);
  auto it = table->find(s);
  if (it != table->end()) return it->second;
  auto shared = std::make_shared<const CallStack>(s);
  if (table->size() < kMaxInterned) table->emplace(std::move(s), shared);
  return shared;
}

}  // namespace torchprobe::io

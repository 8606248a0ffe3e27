#pragma once
// The probe's own threads carry names ("tp-journal", "tp-step-writer", ...), so that `top -H`,
// perf and the benchmarks' per-thread CPU figures tell them from the training thread and from
// libtorch's pools (an unnamed thread shows the program's name).
#if defined(__linux__)
#include <pthread.h>
#endif

namespace torchprobe {

// Names the calling thread; at most 15 characters are kept (Linux's limit).
inline void name_this_thread(const char* name) noexcept {
#if defined(__linux__)
  (void)pthread_setname_np(pthread_self(), name);
#else
  (void)name;
#endif
}

}  // namespace torchprobe

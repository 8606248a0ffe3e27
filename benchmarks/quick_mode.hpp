#pragma once
// TORCHPROBE_BENCH_QUICK=1: every benchmark runs once, on small sizes, in a few seconds. CI runs
// them so (.ci/run) to keep them building and running; the figures of a quick run mean little.
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tpbench {

inline bool quick_mode() {
  static const bool quick = [] {
    const char* v = std::getenv("TORCHPROBE_BENCH_QUICK");
    const bool on = v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
    if (on) std::printf("(quick mode, TORCHPROBE_BENCH_QUICK: small sizes, 1 round; figures are not representative)\n");
    return on;
  }();
  return quick;
}

}  // namespace tpbench

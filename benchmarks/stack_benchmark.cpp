// Cost of stack.json's call stacks: capture_call_stack with the fastest unwinder (libunwind where
// it loads) against glibc's backtrace(), the baseline, in the same run; then symbolizing a stack
// the first time (dladdr alone, and with addr2line) and once cached. No libtorch needed; linked
// with -rdynamic like a user's program, so that dladdr names the functions.
//
//   cmake -S . -B build-bench -DTORCHPROBE_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release
//   cmake --build build-bench --target torchprobe_stack_benchmark && build-bench/benchmarks/torchprobe_stack_benchmark
#include "quick_mode.hpp"
#include "torchprobe/io/call_stack_capture.hpp"
#include "torchprobe/io/symbolizer.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>

using torchprobe::CallStack;
using torchprobe::io::Unwinder;
using Clock = std::chrono::steady_clock;

// External linkage and noinline: real frames with dynamic symbols, as a user's call chain.
namespace tp_stack_bench {

volatile int depth = 5;  // read at run time, so no per-depth clones

__attribute__((noinline)) CallStack outer(int d, Unwinder how) {
  CallStack s = d > 0 ? outer(d - 1, how) : torchprobe::io::capture_call_stack(48, how);
  asm volatile("");  // keeps the call from becoming a tail call
  return s;
}

}  // namespace tp_stack_bench

namespace {

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

// Best of `rounds` of the mean time of one capture over `calls` captures, in microseconds.
double capture_us(Unwinder how, int calls, int rounds, std::size_t& frames) {
  double best = 1e300;
  for (int r = 0; r < rounds; ++r) {
    std::size_t sink = 0;
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) sink += tp_stack_bench::outer(tp_stack_bench::depth, how).frames.size();
    best = std::min(best, us_since(t0) / calls);
    frames = sink / static_cast<std::size_t>(calls);
  }
  return best;
}

}  // namespace

int main() {
  const bool quick = tpbench::quick_mode();
  const int calls = quick ? 1000 : 100000;
  const int rounds = quick ? 1 : 5;
  std::size_t frames = 0;
  (void)tp_stack_bench::outer(1, Unwinder::Fastest);  // loads the unwinder
  const double glibc = capture_us(Unwinder::Glibc, calls, rounds, frames);
  const double fastest = capture_us(Unwinder::Fastest, calls, rounds, frames);
  std::printf("capture_call_stack, %zu frames, best of %d rounds of %d calls\n", frames, rounds, calls);
  std::printf("  glibc backtrace(), the baseline    %8.3f us/call\n", glibc);
  std::printf("  fastest (%-24s) %8.3f us/call  %6.2fx of glibc\n",
              torchprobe::io::libunwind_available() ? "libunwind unw_backtrace" : "glibc: no libunwind", fastest,
              fastest / glibc);

  auto& sym = torchprobe::io::details::Symbolizer::instance();
  const CallStack s = tp_stack_bench::outer(tp_stack_bench::depth, Unwinder::Fastest);
  const double n = static_cast<double>(s.frames.size());
  double first_us[2] = {0, 0};
  for (bool addr2line : {false, true}) {
    sym.set_use_addr2line(addr2line);
    sym.clear_cache();
    const auto t0 = Clock::now();
    (void)torchprobe::io::symbolize(s);
    first_us[addr2line] = us_since(t0) / n;
  }
  const int repeats = quick ? 10 : 1000;
  const auto t0 = Clock::now();
  for (int i = 0; i < repeats; ++i) (void)torchprobe::io::symbolize(s);
  const double cached = us_since(t0) / repeats;
  std::printf("symbolize, per frame seen for the first time (ratio to one glibc capture)\n");
  std::printf("  dladdr only                        %8.1f us/frame  %8.1fx\n", first_us[0], first_us[0] / glibc);
  std::printf("  dladdr + addr2line                 %8.1f us/frame  %8.1fx\n", first_us[1], first_us[1] / glibc);
  std::printf("symbolize, a whole cached stack      %8.3f us/stack  %8.2fx\n", cached, cached / glibc);
  return 0;
}

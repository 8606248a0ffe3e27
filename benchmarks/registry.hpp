#pragma once
// The libtorch benchmarks share one executable, torchprobe_benchmarks, compiled in a few batches
// (tests/unity_build.cmake): each benchmark alone is a libtorch TU of 60-100 s of CPU that compiles
// the same TorchProbe code again, and CI builds them all. A benchmark file defines its entry point
// with TORCHPROBE_BENCHMARK(name) instead of main(); `torchprobe_benchmarks NAME [ARGS...]` runs it.
#include <map>
#include <string>

namespace tpbench {

using BenchmarkMain = int (*)(int argc, char** argv);

// Name -> entry point, filled by the static registrations of the benchmark files before main().
inline std::map<std::string, BenchmarkMain>& benchmarks() {
  static std::map<std::string, BenchmarkMain> all;
  return all;
}

struct BenchmarkRegistration {
  BenchmarkRegistration(const char* name, BenchmarkMain run) { benchmarks().emplace(name, run); }
};

}  // namespace tpbench

// TORCHPROBE_BENCHMARK(levels) { ... return 0; }: the body sees argc/argv as main would, with
// argv[0] the benchmark's name and the arguments after it.
#define TORCHPROBE_BENCHMARK(name)                                                                             \
  static int tp_benchmark_##name(int argc, char** argv);                                                       \
  static const ::tpbench::BenchmarkRegistration tp_benchmark_registration_##name(#name, &tp_benchmark_##name); \
  static int tp_benchmark_##name([[maybe_unused]] int argc, [[maybe_unused]] char** argv)

// torchprobe_benchmarks: every libtorch benchmark of this folder in one program (registry.hpp).
//   torchprobe_benchmarks            lists them
//   torchprobe_benchmarks NAME ...   runs one, with its own arguments
#include "registry.hpp"

#include <cstdio>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  const auto& all = tpbench::benchmarks();
  if (argc < 2 || std::strcmp(argv[1], "--list") == 0 || std::strcmp(argv[1], "--help") == 0) {
    if (argc < 2)
      std::printf("usage: %s NAME [ARGS...]   (TORCHPROBE_BENCH_QUICK=1: one quick round)\nbenchmarks:\n", argv[0]);
    for (const auto& [name, run] : all) std::printf("%s\n", name.c_str());
    return argc < 2 ? 2 : 0;
  }
  const auto it = all.find(argv[1]);
  if (it == all.end()) {
    std::fprintf(stderr, "%s: no benchmark named '%s' (run it without arguments for the list)\n", argv[0], argv[1]);
    return 2;
  }
  return it->second(argc - 1, argv + 1);
}

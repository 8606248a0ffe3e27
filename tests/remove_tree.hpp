#pragma once
// Removes a folder and everything under it, for the tests' and benchmarks' scratch folders.
//
// Not std::filesystem::remove_all: pip's libtorch.so (torch 2.11) exports its own copies of 64
// std::filesystem functions, built from an older libstdc++, and a program that links libtorch
// before libstdc++ binds its calls to them; that remove_all calls a null pointer (seen on the GPU
// machine, .ci/gpu.sh). POSIX nftw walks the tree bottom-up, without following links.
#include <ftw.h>
#include <stdio.h>

#include <string>

namespace tptest {

inline void remove_tree(const std::string& path) {
  if (path.empty()) return;
  ::nftw(
      path.c_str(),
      [](const char* p, const struct stat*, int, struct FTW*) {
        ::remove(p);  // best effort: what cannot go stays, as with remove_all's error_code
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

}  // namespace tptest

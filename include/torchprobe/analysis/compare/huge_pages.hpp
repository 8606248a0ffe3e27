#pragma once
// A big compare touches some 3 GB of fresh memory; on a machine whose transparent huge pages are
// given only to memory that asks for them ("madvise", Debian's default), that is 750,000 page
// faults of 4 KB, each a trip through the kernel (and, in a virtual machine, through the
// hypervisor): measured, a third of a million-entry compare's wall time (19.0 s against 13.2 s with
// huge pages, RSS the same). glibc asks for huge pages for all its heap when its tunable
// glibc.malloc.hugetlb=1 is set (glibc >= 2.35; older ones ignore it), but tunables are read once,
// when the program starts: so the command-line tool starts itself again with the tunable set.
// Nothing changes but the page size: what the program writes is the same.
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#if defined(__linux__)
#include <unistd.h>
#endif

namespace torchprobe::compare {

// Above this many bytes of dump.json (both sides, some 7,000 entries) a compare gains more from
// huge pages than the second start costs, now a millisecond: the tool no longer loads libtorch at
// start (tools/cli/torch_module.hpp; it was 0.6 s, and the bound 256 MB). Measured on this 2-core
// machine: 10,000 entries a side take 0.15 s instead of 0.23 s, 100,000 0.88 s instead of 1.16 s.
constexpr std::uintmax_t kHugePagesFromBytes = std::uintmax_t(8) << 20;

// The bytes of the dump.json files at or under each path (a file, or a directory searched whole).
inline std::uintmax_t dump_json_bytes(std::initializer_list<std::filesystem::path> paths) {
  namespace fs = std::filesystem;
  std::uintmax_t total = 0;
  std::error_code ec;
  for (const fs::path& p : paths) {
    if (fs::is_regular_file(p, ec)) {
      const std::uintmax_t size = fs::file_size(p, ec);
      if (!ec) total += size;
      continue;
    }
    if (!fs::is_directory(p, ec)) continue;
    for (fs::recursive_directory_iterator it(p, fs::directory_options::skip_permission_denied, ec), end;
         !ec && it != end; it.increment(ec)) {
      if (it->path().filename() != "dump.json" || !it->is_regular_file(ec)) continue;
      const std::uintmax_t size = it->file_size(ec);
      if (!ec) total += size;
      ec.clear();
    }
  }
  return total;
}

// Re-executes this program (/proc/self/exe, the same argv) with the environment `envp` and
// glibc.malloc.hugetlb=1 added to its GLIBC_TUNABLES, unless that names the tunable already (a
// user's own choice, which wins) or TORCHPROBE_NO_HUGE_PAGES is set. The environment is passed
// explicitly: this runs from the preinit array, where libc's `environ` is not set yet (getenv sees
// nothing there, and a restart decided by it restarts for ever). Returns only when the program was
// not started again (not Linux, one of the above, or exec failed): the caller goes on with normal pages.
// (`program`: what is executed, for the tests.)
inline void rerun_with_huge_pages(char** argv, char** envp, const char* program = "/proc/self/exe") {
#if defined(__linux__)
  constexpr std::string_view kName = "GLIBC_TUNABLES=", kTunable = "glibc.malloc.hugetlb";
  std::vector<std::string> env;
  std::string tunables;
  for (char** e = envp; e != nullptr && *e != nullptr; ++e) {
    const std::string_view v(*e);
    if (v.rfind("TORCHPROBE_NO_HUGE_PAGES=", 0) == 0) return;
    if (v.rfind(kName, 0) == 0) {
      tunables = std::string(v.substr(kName.size()));
      if (tunables.find(kTunable) != std::string::npos) return;  // set already: this is the second start
      continue;
    }
    env.emplace_back(v);
  }
  env.push_back(std::string(kName) + tunables + (tunables.empty() ? "" : ":") + std::string(kTunable) + "=1");
  std::vector<char*> pointers;
  for (std::string& v : env) pointers.push_back(v.data());
  pointers.push_back(nullptr);
  ::execve(program, argv, pointers.data());
#else
  static_cast<void>(argv);
  static_cast<void>(envp);
  static_cast<void>(program);
#endif
}

}  // namespace torchprobe::compare

#pragma once
// C++ call sites for stack.json.
//
// msprobe records, for every forward call, the Python stack that led to it. Our equivalent is the
// native stack. Capturing must be cheap because it happens on every recorded op, so the hot path
// only stores return addresses (libunwind's or glibc's backtrace); turning them into names and
// lines happens once per distinct address when stack.json is written, and is cached.
//
// Function names of an executable come from its dynamic symbol table, which only lists them when it
// is linked with -rdynamic (the torchprobe CMake target adds it). Without it, frames of the main
// program show as "??" unless addr2line finds them in the debug/symbol tables (see symbolize()).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "torchprobe/core/call_stack.hpp"

extern char** environ;

namespace torchprobe::io {

namespace detail {

using BacktraceFunction = int (*)(void**, int);

// libunwind's unw_backtrace, when the process can load libunwind.so.8 (Debian 12 installs it with
// libtorch, through glog; Debian 13 does not). It walks a cached description of each frame
// (10-20 ns a frame here), where glibc's backtrace() interprets the DWARF unwind tables every time
// (about 200 ns a frame, most of a call stack's cost). It is opened RTLD_LOCAL, so it stays out of
// the global symbol scope: linked normally, its _Unwind_* functions and its weak backtrace() would
// replace libgcc's and glibc's for the whole process, C++ exceptions included. Where DWARF information is missing it
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

}  // namespace detail

// Which unwinder capture_call_stack uses: the fastest one available (libunwind when it loads,
// else glibc), or glibc's backtrace() always.
enum class Unwinder { Fastest, Glibc };

// Whether Unwinder::Fastest is libunwind in this process.
inline bool libunwind_available() { return detail::libunwind_backtrace() != nullptr; }

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
    if (const detail::BacktraceFunction fast = detail::libunwind_backtrace()) n = fast(buf, max_frames);
  if (n <= 0) n = ::backtrace(buf, max_frames);
  if (n > 0) out.frames.assign(buf, buf + n);
  return out;
}

namespace detail {

// Compiler-made copies of a function (constant propagation, partial inlining, cold parts) are
// named "f(int) [clone .constprop.0]"; the user knows them as f(int).
inline std::string strip_clone_suffix(std::string name) {
  const std::size_t clone = name.find(" [clone ");
  if (clone != std::string::npos) name.resize(clone);
  return name;
}

inline std::string demangle(const char* sym) {
  int status = 0;
  char* d = abi::__cxa_demangle(sym, nullptr, nullptr, &status);
  std::string out = (status == 0 && d != nullptr) ? d : sym;
  std::free(d);
  return strip_clone_suffix(std::move(out));
}

inline std::string_view base_name(std::string_view path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

inline bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// Objects whose frames are never the user's: the torch runtime, the OpenMP runtime, the C and C++
// runtimes, the dynamic loader, the unwinder and sanitizer runtimes (which intercept backtrace()).
inline bool is_runtime_module(std::string_view path) {
  const std::string_view b = base_name(path);
  for (std::string_view p : {"libtorch", "libc10", "libgomp", "libc.so", "libc-", "ld-linux", "ld64.so",
                             "libstdc++", "libgcc_s", "libunwind", "libpthread", "libdl.", "libasan", "libubsan",
                             "libtsan", "liblsan", "libhwasan", "libclang_rt"}) {
    if (starts_with(b, p)) return true;
  }
  return false;
}

// The qualified function name without the return type that demangled template functions carry
// ("void torchprobe::f<int>(int)" -> "torchprobe::f<int>(int)"): the last top-level space before
// the parameter list ends the return type.
inline std::string_view qualified_name(std::string_view s) {
  std::size_t start = 0;
  int angle = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') {
      ++angle;
    } else if (c == '>') {
      if (angle > 0) --angle;
    } else if (c == '(' && angle == 0) {
      constexpr std::string_view kAnon = "(anonymous namespace)";
      if (s.substr(i, kAnon.size()) == kAnon) {
        i += kAnon.size() - 1;
        continue;
      }
      break;  // the parameter list (or a lambda's) starts here
    } else if (c == ' ' && angle == 0) {
      start = i + 1;
    }
  }
  return s.substr(start);
}

// Frames of torchprobe itself, of the dispatcher and of process start-up.
inline bool is_internal_function(std::string_view demangled) {
  for (std::string_view exact : {"backtrace", "_start", "__libc_start_main", "__libc_start_call_main"}) {
    if (demangled == exact) return true;
  }
  const std::string_view q = qualified_name(demangled);
  for (std::string_view p : {"torchprobe::", "c10::", "at::_ops::", "at::RecordFunction"}) {
    if (starts_with(q, p)) return true;
  }
  // std::function glue instantiated for torchprobe's callbacks (compiled into the user's binary,
  // so the module rule does not catch it), e.g. std::_Function_handler<..., torchprobe::...>.
  return starts_with(q, "std::") && q.find("torchprobe::") != std::string_view::npos;
}

inline std::string hex(std::uintptr_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

inline std::string frame_text(const std::string& path, long line, const std::string& func,
                              const std::string& text) {
  return "File " + path + ", line " + std::to_string(line) + ", in " + func + ", \n " + text;
}

// Resolves addresses to stack.json frame strings; one process-wide instance, guarded by a mutex
// (symbolizing happens when files are written, never per op).
class Symbolizer {
 public:
  static Symbolizer& instance() {
    static Symbolizer* s = new Symbolizer();  // leaked: stays usable from static destructors
    return *s;
  }

  // For tests and for programs that want to control the cost: addr2line on/off, and forgetting
  // everything resolved so far (e.g. after dlclose of a library whose addresses may be reused).
  void set_use_addr2line(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    use_addr2line_ = on;
  }
  void clear_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.clear();
    sources_.clear();
  }

  std::vector<std::string> symbolize(const CallStack& stack) {
    return symbolize_many({&stack}).front();
  }

  // All addresses that are new are resolved together, so addr2line runs once per module.
  std::vector<std::vector<std::string>> symbolize_many(const std::vector<const CallStack*>& stacks) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<void*> fresh;
    for (const CallStack* s : stacks)
      for (void* a : s->frames)
        if (cache_.find(a) == cache_.end()) {
          cache_.emplace(a, std::vector<std::string>{});  // placeholder, also dedups `fresh`
          fresh.push_back(a);
        }
    try {
      resolve(fresh);
    } catch (...) {  // (out of memory) do not leave placeholders that would read as "dropped"
      for (void* a : fresh) cache_.erase(a);
      throw;
    }

    std::vector<std::vector<std::string>> out;
    out.reserve(stacks.size());
    for (const CallStack* s : stacks) {
      std::vector<std::string> frames;
      for (void* a : s->frames) {
        const auto& f = cache_[a];
        frames.insert(frames.end(), f.begin(), f.end());
      }
      if (frames.empty()) frames.push_back("The call stack retrieval failed.");  // msprobe's text
      out.push_back(std::move(frames));
    }
    return out;
  }

 private:
  struct Location {  // one (possibly inlined) function at an address, as addr2line -i reports it
    std::string func;
    std::string file;  // empty when unknown
    long line = 0;
  };
  struct Pending {
    void* addr;
    std::string module;      // object file path
    std::uintptr_t offset;   // address relative to the object's load bias (what addr2line wants)
    std::string dl_func;     // demangled dladdr name, empty if none
  };

  Symbolizer() {
    const char* env = std::getenv("TORCHPROBE_ADDR2LINE");  // "0" turns the addr2line step off
    use_addr2line_ = !(env != nullptr && std::string_view(env) == "0");
  }

  static const std::string& self_exe() {
    static const std::string path = [] {
      char buf[4096];
      const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
      return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("??");
    }();
    return path;
  }

  void resolve(const std::vector<void*>& addrs) {
    std::map<std::string, std::vector<Pending>> by_module;  // map: deterministic addr2line order
    for (void* a : addrs) {
      Dl_info info{};
      link_map* lm = nullptr;
      // dladdr1 also gives the link map, whose l_addr is the load bias: address - bias is the
      // address inside the file for executables (PIE or not) and shared objects alike.
      if (::dladdr1(a, &info, reinterpret_cast<void**>(&lm), RTLD_DL_LINKMAP) == 0 || lm == nullptr) {
        cache_[a] = {frame_text("??", 0, "??", hex(reinterpret_cast<std::uintptr_t>(a)))};
        continue;
      }
      std::string module = (lm->l_name != nullptr && lm->l_name[0] != '\0') ? lm->l_name : self_exe();
      if (is_runtime_module(module)) continue;  // stays empty: dropped
      Pending p{a, std::move(module), reinterpret_cast<std::uintptr_t>(a) - lm->l_addr,
                info.dli_sname != nullptr ? demangle(info.dli_sname) : std::string()};
      by_module[p.module].push_back(std::move(p));
    }
    for (auto& [module, pending] : by_module) {
      std::vector<std::vector<Location>> locs;
      if (use_addr2line_) locs = run_addr2line(module, pending);
      for (std::size_t i = 0; i < pending.size(); ++i)
        finish(pending[i], i < locs.size() ? locs[i] : std::vector<Location>{});
    }
  }

  // Builds the cached frame strings of one address from addr2line's inline chain (innermost
  // first), or from dladdr alone when addr2line had nothing.
  void finish(const Pending& p, std::vector<Location> chain) {
    const std::string fallback_text = std::string(base_name(p.module)) + "+" + hex(p.offset);
    if (chain.empty()) chain.push_back(Location{});
    // The outermost entry is the real (non-inlined) function, which dladdr names too.
    if ((chain.back().func.empty() || chain.back().func == "??") && !p.dl_func.empty())
      chain.back().func = p.dl_func;
    std::vector<std::string> frames;
    for (const Location& l : chain) {
      const std::string func = l.func.empty() ? "??" : l.func;
      if (is_internal_function(func)) continue;
      if (l.file.empty() || l.line <= 0) {
        frames.push_back(frame_text(p.module, 0, func, fallback_text));
      } else {
        std::string src = source_line(l.file, l.line);
        frames.push_back(frame_text(l.file, l.line, func, src.empty() ? fallback_text : src));
      }
    }
    cache_[p.addr] = std::move(frames);
  }

  // Runs `addr2line -a -f -C -i -e module addr...` (no shell) and parses its answer per address.
  // Any failure (not installed, no debug info, odd output) gives empty results: dladdr is used.
  std::vector<std::vector<Location>> run_addr2line(const std::string& module,
                                                   const std::vector<Pending>& pending) {
    std::vector<std::vector<Location>> result(pending.size());
    constexpr std::size_t kBatch = 2000;  // keeps the argument list far below ARG_MAX
    for (std::size_t first = 0; first < pending.size(); first += kBatch) {
      const std::size_t last = std::min(pending.size(), first + kBatch);
      std::vector<std::string> args = {"addr2line", "-a", "-f", "-C", "-i", "-e", module};
      std::vector<std::uintptr_t> queried;
      for (std::size_t i = first; i < last; ++i) {
        // Return addresses point after the call; one byte back lies inside the call instruction,
        // so the reported line is the call's, not the next statement's.
        queried.push_back(pending[i].offset > 0 ? pending[i].offset - 1 : 0);
        args.push_back(hex(queried.back()));
      }
      std::string text;
      const Spawn r = spawn_and_read(args, text);
      if (r == Spawn::kUnavailable) use_addr2line_ = false;  // not installed: stop trying
      if (r != Spawn::kOk) return result;
      parse_addr2line(text, queried, result, first);
    }
    return result;
  }

  static void parse_addr2line(const std::string& text, const std::vector<std::uintptr_t>& queried,
                              std::vector<std::vector<Location>>& result, std::size_t first) {
    std::vector<std::string> lines;
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      lines.emplace_back(text, pos, nl - pos);
      pos = nl + 1;
    }
    std::size_t next = 0;  // index into `queried` of the next expected address line
    std::vector<Location>* cur = nullptr;
    for (std::size_t i = 0; i < lines.size();) {
      // With -a every group starts with the queried address; matching it against what we asked
      // for keeps the parse in step even if a function name looked like an address.
      if (next < queried.size() && starts_with(lines[i], "0x") &&
          std::strtoull(lines[i].c_str(), nullptr, 16) == queried[next]) {
        cur = &result[first + next];
        ++next;
        ++i;
        continue;
      }
      if (cur == nullptr || i + 1 >= lines.size()) break;
      Location l;
      l.func = strip_clone_suffix(lines[i]);
      std::string loc = lines[i + 1];
      const std::size_t disc = loc.find(" (discriminator");
      if (disc != std::string::npos) loc.resize(disc);
      const std::size_t colon = loc.rfind(':');
      if (colon != std::string::npos) {
        const std::string file = loc.substr(0, colon);
        const long line = std::strtol(loc.c_str() + colon + 1, nullptr, 10);
        if (file != "??" && line > 0) {
          l.file = file;
          l.line = line;
        }
      }
      cur->push_back(std::move(l));
      i += 2;
    }
  }

  enum class Spawn { kOk, kFailed, kUnavailable };

  static Spawn spawn_and_read(const std::vector<std::string>& args, std::string& out) {
    int pipefd[2];
    if (::pipe2(pipefd, O_CLOEXEC) != 0) return Spawn::kFailed;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int rc = ::posix_spawnp(&pid, "addr2line", &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(pipefd[1]);
    if (rc != 0) {
      ::close(pipefd[0]);
      return rc == ENOENT ? Spawn::kUnavailable : Spawn::kFailed;
    }
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(pipefd[0], buf, sizeof buf);
      if (n > 0) {
        out.append(buf, static_cast<std::size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        break;
      }
    }
    ::close(pipefd[0]);
    int status = 0;
    pid_t w;
    do w = ::waitpid(pid, &status, 0);
    while (w < 0 && errno == EINTR);
    // 127: the spawned child could not exec addr2line. A program that reaps every child itself
    // (SIGCHLD handler) leaves us ECHILD; the output read so far is still good then.
    if (w == pid && WIFEXITED(status) && WEXITSTATUS(status) == 127) return Spawn::kUnavailable;
    return out.empty() ? Spawn::kFailed : Spawn::kOk;
  }

  // The stripped text of a source line, as msprobe shows it; "" when the file is not readable.
  std::string source_line(const std::string& file, long line) {
    auto it = sources_.find(file);
    if (it == sources_.end()) {
      std::vector<std::string> lines;
      std::ifstream in(file);
      std::string s;
      std::size_t bytes = 0;
      while (in && bytes < (std::size_t{16} << 20) && std::getline(in, s)) {
        bytes += s.size();
        lines.push_back(std::move(s));
      }
      it = sources_.emplace(file, std::move(lines)).first;
    }
    if (line < 1 || static_cast<std::size_t>(line) > it->second.size()) return {};
    const std::string& s = it->second[static_cast<std::size_t>(line) - 1];
    const char* ws = " \t\r\n\f\v";
    const std::size_t b = s.find_first_not_of(ws);
    if (b == std::string::npos) return {};
    return s.substr(b, s.find_last_not_of(ws) - b + 1);
  }

  std::mutex mu_;
  std::unordered_map<void*, std::vector<std::string>> cache_;  // kept frames per address
  std::unordered_map<std::string, std::vector<std::string>> sources_;
  bool use_addr2line_ = true;
};

}  // namespace detail

// The frames of `stack` as stack.json strings, innermost first:
//   "File {path}, line {line}, in {function}, \n {source text}"
// With addr2line on PATH and debug info in the object, one return address can give several frames
// (its inlined calls), with the source file, line and stripped source text. Otherwise path is the
// object file (executable or .so), line 0 and the text "{object}+0x{offset}". Frames of torchprobe,
// the dispatcher (c10::, at::_ops::, at::RecordFunction), libtorch/libc10, OpenMP, the C/C++
// runtimes and process start-up are dropped. Set TORCHPROBE_ADDR2LINE=0 to skip addr2line.
// If nothing remains the result is {"The call stack retrieval failed."}, as msprobe writes.
inline std::vector<std::string> symbolize(const CallStack& stack) {
  return detail::Symbolizer::instance().symbolize(stack);
}

// stack.json: {"0": [[names...], [frames...]], "1": ...}. Names whose symbolized stacks are equal
// share one group (msprobe compares the final frame lists too, so calls from one source line through
// different internal paths still group); groups and names keep first-appearance order.
inline nlohmann::ordered_json build_stack_json(
    const std::vector<std::pair<std::string, CallStack>>& forward_entries) {
  // Symbolize each distinct raw stack once, all in one batch.
  std::unordered_map<CallStack, std::size_t, CallStackHash> raw_index;
  std::vector<const CallStack*> unique;
  std::vector<std::size_t> entry_raw;
  entry_raw.reserve(forward_entries.size());
  for (const auto& e : forward_entries) {
    auto [it, added] = raw_index.emplace(e.second, unique.size());
    if (added) unique.push_back(&e.second);
    entry_raw.push_back(it->second);
  }
  const auto frames = detail::Symbolizer::instance().symbolize_many(unique);

  std::map<std::vector<std::string>, std::size_t> group_of;  // symbolized frames -> group index
  std::vector<std::pair<std::vector<std::string>, std::size_t>> groups;  // names, frames index
  for (std::size_t i = 0; i < forward_entries.size(); ++i) {
    const std::size_t r = entry_raw[i];
    auto [it, added] = group_of.emplace(frames[r], groups.size());
    if (added) groups.push_back({{}, r});
    groups[it->second].first.push_back(forward_entries[i].first);
  }

  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  // ordered_map's own insert searches the keys linearly; these keys are unique by construction, so
  // append to the underlying vector directly and keep the build linear.
  auto& obj = out.get_ref<nlohmann::ordered_json::object_t&>();
  using Base = nlohmann::ordered_json::object_t::Container;
  for (std::size_t g = 0; g < groups.size(); ++g)
    static_cast<Base&>(obj).emplace_back(
        std::to_string(g), nlohmann::ordered_json::array({groups[g].first, frames[groups[g].second]}));
  return out;
}

}  // namespace torchprobe::io

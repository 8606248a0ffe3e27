#pragma once
// Turning captured return addresses into stack.json frame strings: dladdr for the object and the
// exported name, addr2line (when on PATH) for inlined calls, source files and lines. It runs when
// stack.json is written, never per op, and caches every address it resolved.
//
// Function names of an executable come from its dynamic symbol table, which only lists them when it
// is linked with -rdynamic (the torchprobe CMake target adds it). Without it, frames of the main
// program show as "??" unless addr2line finds them in the debug/symbol tables (see symbolize()).
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "torchprobe/core/call_stack.hpp"
#include "torchprobe/io/symbol_names.hpp"

extern char** environ;

namespace torchprobe::io {

namespace details {

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

  std::vector<std::string> symbolize(const CallStack& stack) { return symbolize_many({&stack}).front(); }

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
    std::string module;     // object file path
    std::uintptr_t offset;  // address relative to the object's load bias (what addr2line wants)
    std::string dl_func;    // demangled dladdr name, empty if none
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
    if ((chain.back().func.empty() || chain.back().func == "??") && !p.dl_func.empty()) chain.back().func = p.dl_func;
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
  std::vector<std::vector<Location>> run_addr2line(const std::string& module, const std::vector<Pending>& pending) {
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

}  // namespace details

// The frames of `stack` as stack.json strings, innermost first:
//   "File {path}, line {line}, in {function}, \n {source text}"
// With addr2line on PATH and debug info in the object, one return address can give several frames
// (its inlined calls), with the source file, line and stripped source text. Otherwise path is the
// object file (executable or .so), line 0 and the text "{object}+0x{offset}". Frames of torchprobe,
// the dispatcher (c10::, at::_ops::, at::RecordFunction), libtorch/libc10, OpenMP, the C/C++
// runtimes and process start-up are dropped. Set TORCHPROBE_ADDR2LINE=0 to skip addr2line.
// If nothing remains the result is {"The call stack retrieval failed."}, as msprobe writes.
inline std::vector<std::string> symbolize(const CallStack& stack) {
  return details::Symbolizer::instance().symbolize(stack);
}

}  // namespace torchprobe::io

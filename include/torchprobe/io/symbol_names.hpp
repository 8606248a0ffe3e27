#pragma once
// How a symbolized frame reads, and which frames are dropped from stack.json: those of the torch
// and C/C++ runtimes (by object file) and of torchprobe and the dispatcher (by function name).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include <cxxabi.h>

namespace torchprobe::io::details {

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

inline bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// Objects whose frames are never the user's: the torch runtime, the OpenMP runtime, the C and C++
// runtimes, the dynamic loader, the unwinder and sanitizer runtimes (which intercept backtrace()).
inline bool is_runtime_module(std::string_view path) {
  const std::string_view b = base_name(path);
  for (std::string_view p :
       {"libtorch", "libc10", "libgomp", "libc.so", "libc-", "ld-linux", "ld64.so", "libstdc++", "libgcc_s",
        "libunwind", "libpthread", "libdl.", "libasan", "libubsan", "libtsan", "liblsan", "libhwasan", "libclang_rt"}) {
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

inline std::string frame_text(const std::string& path, long line, const std::string& func, const std::string& text) {
  return "File " + path + ", line " + std::to_string(line) + ", in " + func + ", \n " + text;
}

}  // namespace torchprobe::io::details

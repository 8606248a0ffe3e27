#pragma once
// Where a call came from, as raw return addresses (innermost first). Cheap to copy, compare and
// hash, so identical call sites are grouped before anything is symbolized (io/call_stack_capture.hpp
// captures them, io/symbolizer.hpp and io/stack_json.hpp turn them into stack.json).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace torchprobe {

struct CallStack {
  std::vector<void*> frames;

  friend bool operator==(const CallStack& a, const CallStack& b) { return a.frames == b.frames; }
  friend bool operator!=(const CallStack& a, const CallStack& b) { return !(a == b); }
};

struct CallStackHash {
  std::size_t operator()(const CallStack& s) const noexcept {
    std::uint64_t h = 14695981039346656037ull;  // FNV-1a over the addresses
    for (void* f : s.frames) {
      h ^= static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(f));
      h *= 1099511628211ull;
    }
    return static_cast<std::size_t>(h ^ (h >> 32));
  }
};

}  // namespace torchprobe

namespace std {
template <>
struct hash<torchprobe::CallStack> : torchprobe::CallStackHash {};
}  // namespace std

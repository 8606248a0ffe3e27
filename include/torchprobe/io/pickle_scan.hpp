#pragma once
// A .pt file's pickle (its "data.pkl" record) walked before libtorch's Unpickler runs it. The
// Unpickler trusts two kinds of number in the stream: a string's or bytes' length, for which it
// reserves memory before it checks that the bytes are there (Unpickler::readBytes), and a memo
// index, up to which it grows its memo table (LONG_BINPUT: an index of 4e9 is 64 GB of IValues).
// And it pops its stack without looking (BUILD on a stack of one frees what was never allocated).
// Each is checked here: lengths against the pickle's own size, memo indices against the entries
// made, and every opcode's values against the stack as Python's unpickler keeps it (values above
// the last MARK). The walk stops at STOP or at an opcode it does not know (libtorch refuses it).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torchprobe::io {

namespace details {

// The unsigned number of `bytes` bytes at `at`, least significant first (zip's and pickle's order).
inline std::uint64_t le(std::string_view b, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<std::size_t>(i)]);
  return v;
}

}  // namespace details

inline std::optional<std::string> pickle_problem(std::string_view p) {
  const auto at = [](std::size_t offset, const std::string& what) {
    return "data.pkl byte " + std::to_string(offset) + ": " + what;
  };
  const auto le = [&](std::size_t from, int bytes) { return details::le(p, from, bytes); };
  std::uint64_t memo = 0;            // memo entries made so far: a writer numbers them 0, 1, 2, ...
  std::uint64_t depth = 0;           // values on the stack
  std::vector<std::uint64_t> marks;  // the stack's depth at each MARK still open
  for (std::size_t i = 0; i < p.size();) {
    const std::size_t op = i++;
    const unsigned char c = static_cast<unsigned char>(p[op]);
    std::size_t fixed = 0;  // bytes of argument
    int length_bytes = 0;   // a length of this many bytes, then that many bytes
    int lines = 0;          // arguments ended by a newline
    bool memo_index = false;
    // The stack: values taken (above the last mark, as Python's unpickler has it), values put back;
    // to_mark: takes everything down to the last mark (and the mark), and `pops` more below it.
    int pops = 0, pushes = 0;
    bool to_mark = false;
    // One opcode family a line, read as a table.
    // clang-format off
    switch (c) {
      case '.': return depth >= 1 ? std::nullopt : std::optional<std::string>(at(op, "STOP with an empty stack"));
      case '(': marks.push_back(depth); break;  // MARK
      case '0': pops = 1; break;                                       // POP
      case '1': to_mark = true; break;                                 // POP_MARK
      case '2': pops = 1; pushes = 2; break;                           // DUP
      case 'N': case 0x88: case 0x89: case '}': case ']': case ')': case 0x8f: case 0x97: pushes = 1; break;
      case 'Q': case 0x85: case 0x98: pops = 1; pushes = 1; break;     // BINPERSID, TUPLE1, READONLY_BUFFER
      case 'R': case 'b': case 'a': case 0x81: case 0x86: case 0x93: pops = 2; pushes = 1; break;
      case 's': case 0x87: case 0x92: pops = 3; pushes = 1; break;     // SETITEM, TUPLE3, NEWOBJ_EX
      case 'd': case 'l': case 't': case 'o': case 0x91: to_mark = true; pushes = 1; break;
      case 'e': case 'u': case 0x90: to_mark = true; pops = 1; pushes = 1; break;  // APPENDS, SETITEMS, ADDITEMS
      case 0x94: pops = 1; pushes = 1; ++memo; break;                  // MEMOIZE
      case 'K': case 0x82: fixed = 1; pushes = 1; break;
      case 'h': fixed = 1; pushes = 1; break;                          // BINGET
      case 0x80: fixed = 1; break;                                     // PROTO
      case 'q': fixed = 1; memo_index = true; pops = 1; pushes = 1; break;  // BINPUT
      case 'M': case 0x83: fixed = 2; pushes = 1; break;
      case 'J': case 'j': case 0x84: fixed = 4; pushes = 1; break;
      case 'r': fixed = 4; memo_index = true; pops = 1; pushes = 1; break;  // LONG_BINPUT
      case 'G': fixed = 8; pushes = 1; break;
      case 0x95: fixed = 8; break;                                     // FRAME
      case 'U': case 'C': case 0x8c: case 0x8a: length_bytes = 1; pushes = 1; break;
      case 'T': case 'B': case 'X': case 0x8b: length_bytes = 4; pushes = 1; break;
      case 0x8d: case 0x8e: case 0x96: length_bytes = 8; pushes = 1; break;
      case 'I': case 'L': case 'S': case 'V': case 'F': case 'P': case 'g': lines = 1; pushes = 1; break;
      case 'p': lines = 1; pops = 1; pushes = 1; ++memo; break;       // PUT
      case 'c': lines = 2; pushes = 1; break;                          // GLOBAL
      case 'i': lines = 2; to_mark = true; pushes = 1; break;          // INST
      default: return std::nullopt;  // an opcode libtorch does not take either: it refuses it there
    }
    // clang-format on
    if (to_mark) {
      if (marks.empty()) return at(op, "an opcode that takes values down to a MARK, with no MARK open");
      depth = marks.back();
      marks.pop_back();
    }
    const std::uint64_t floor = marks.empty() ? 0 : marks.back();
    if (depth - floor < static_cast<std::uint64_t>(pops))
      return at(op, "an opcode takes " + std::to_string(pops) + " values where the stack holds " +
                        std::to_string(depth - floor));
    depth = depth - static_cast<std::uint64_t>(pops) + static_cast<std::uint64_t>(pushes);
    if (fixed > 0) {
      if (p.size() - i < fixed) return at(op, "the pickle ends inside an opcode's argument");
      if (memo_index) {
        const std::uint64_t index = le(i, static_cast<int>(fixed));
        if (index > memo)
          return at(op, "memo index " + std::to_string(index) + " skips ahead of the " + std::to_string(memo) +
                            " entries made so far");
        ++memo;
      }
      i += fixed;
    } else if (length_bytes > 0) {
      if (p.size() - i < static_cast<std::size_t>(length_bytes)) return at(op, "the pickle ends inside a length");
      const std::uint64_t n = le(i, length_bytes);
      i += static_cast<std::size_t>(length_bytes);
      if (n > p.size() - i)
        return at(op, "a value claims " + std::to_string(n) + " bytes, " + std::to_string(p.size() - i) + " follow");
      i += static_cast<std::size_t>(n);
    }
    for (int l = 0; l < lines; ++l) {
      const std::size_t nl = p.find('\n', i);
      if (nl == std::string_view::npos) return at(op, "a text argument without its newline");
      i = nl + 1;
    }
  }
  return at(p.size(), "the pickle has no STOP opcode");
}

}  // namespace torchprobe::io

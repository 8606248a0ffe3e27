#pragma once
// JSON text exactly as Python's json module writes it, appended piece by piece to one buffer.
//
// msprobe writes its files with `json.dump(obj, f, indent=1)`; tools that read our dumps (msprobe's
// compare, diff scripts, people running `diff` on two dump.json files) see the same bytes only if we
// reproduce that writer: float repr (shortest round trip, Python's fixed/scientific switch), bare
// NaN/Infinity tokens (allow_nan=True), ensure_ascii escaping and Python's separators.
//
// JsonText is the one place that knows those rules. The step files are written with it straight
// from the records (sink/step_text.hpp), with no JSON tree in between; io/python_json.hpp walks a
// nlohmann tree with it for everything else. When the buffer passes a threshold its owner's
// TextDrain takes it (to a file, a stream), so writing a file of any size holds one chunk at a time.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace torchprobe::io {

// Python's float.__repr__ as json.dumps uses it, written at `out` (at least 32 chars); returns the
// end. NaN and the infinities are spelled the way json writes them.
inline char* write_python_float(char* out, double v) {
  if (std::isnan(v)) {  // json checks `o != o`, so a negative NaN is "NaN" as well
    static constexpr std::string_view kNaN = "NaN";
    return std::copy(kNaN.begin(), kNaN.end(), out);
  }
  if (std::isinf(v)) {
    const std::string_view s = v > 0 ? "Infinity" : "-Infinity";
    return std::copy(s.begin(), s.end(), out);
  }
  // to_chars without a precision gives the shortest digit string that round-trips, which is what
  // Python's repr uses (David Gay's mode 0). Scientific form makes digits and exponent easy to split.
  char sci[40];
  const char* end = std::to_chars(sci, sci + sizeof sci, v, std::chars_format::scientific).ptr;
  const char* p = sci;
  if (*p == '-') {  // keeps the sign of -0.0, as Python does
    *out++ = '-';
    ++p;
  }
  char digits[24];
  int n = 0;
  for (; p != end && *p != 'e'; ++p)
    if (*p != '.') digits[n++] = *p;
  int exp10 = 0;
  if (p != end) std::from_chars(p + 1 + (p[1] == '+' ? 1 : 0), end, exp10);

  // Python (float_repr_style 'short'): scientific when the decimal exponent is < -4 or >= 16.
  if (exp10 < -4 || exp10 >= 16) {
    *out++ = digits[0];
    if (n > 1) {
      *out++ = '.';
      out = std::copy(digits + 1, digits + n, out);
    }
    *out++ = 'e';
    *out++ = exp10 < 0 ? '-' : '+';
    const int mag = exp10 < 0 ? -exp10 : exp10;
    if (mag < 10) *out++ = '0';  // at least two exponent digits: 1e-05, 1e+16
    return std::to_chars(out, out + 4, mag).ptr;
  }
  if (exp10 >= 0) {
    const int int_len = exp10 + 1;
    if (n <= int_len) {
      out = std::copy(digits, digits + n, out);
      for (int k = n; k < int_len; ++k) *out++ = '0';
      *out++ = '.';  // Python always marks an integral float
      *out++ = '0';
    } else {
      out = std::copy(digits, digits + int_len, out);
      *out++ = '.';
      out = std::copy(digits + int_len, digits + n, out);
    }
    return out;
  }
  *out++ = '0';
  *out++ = '.';
  for (int k = 0; k < -exp10 - 1; ++k) *out++ = '0';
  return std::copy(digits, digits + n, out);
}

inline std::string python_float_repr(double v) {
  char buf[40];
  return std::string(buf, write_python_float(buf, v));
}

namespace details {
// What JsonText::relayout() does at each byte: 0 copies it, 1 a string's quote, 2 a container
// opens, 3 one closes, 4 a separator.
struct RelayoutStops {
  unsigned char at[256];
};
constexpr RelayoutStops make_relayout_stops() {
  RelayoutStops t{};
  t.at[static_cast<unsigned char>('"')] = 1;
  t.at[static_cast<unsigned char>('{')] = t.at[static_cast<unsigned char>('[')] = 2;
  t.at[static_cast<unsigned char>('}')] = t.at[static_cast<unsigned char>(']')] = 3;
  t.at[static_cast<unsigned char>(',')] = 4;
  return t;
}
inline constexpr RelayoutStops kRelayoutStops = make_relayout_stops();
}  // namespace details

// Takes each chunk of the text written so far: a file, a stream.
class TextDrain {
 public:
  virtual ~TextDrain() = default;
  virtual void take(std::string_view text) = 0;
};

class JsonText {
 public:
  // indent >= 0 is Python's integer indent (0 = newlines without indentation); a negative indent
  // stands for indent=None: one line with ", " and ": " separators, as plain json.dumps(obj).
  // Text is appended to `buf`; it holds exactly the text once finish() is called (or this object
  // is gone): in between it has room to spare, so that each piece is a copy, not a string append.
  explicit JsonText(std::string& buf, int indent = 1, TextDrain* drain = nullptr)
      : buf_(buf), len_(buf.size()), indent_(indent), drain_(drain) {}
  JsonText(const JsonText&) = delete;
  JsonText& operator=(const JsonText&) = delete;
  ~JsonText() { finish(); }

  void finish() { buf_.resize(len_); }
  int indent() const { return indent_; }
  // The text so far, when no drain takes it: its length, a view, and going back to an earlier
  // length (what came after is dropped) or to none; the buffer keeps its room.
  std::size_t size() const { return len_; }
  std::string_view view() const { return std::string_view(buf_.data(), len_); }
  void truncate(std::size_t length) { len_ = std::min(len_, length); }
  void clear() { len_ = 0; }

  void null() { put("null", 4); }
  void boolean(bool b) { b ? put("true", 4) : put("false", 5); }
  template <class Int>
  void integer(Int v) {
    char* p = room(24);
    len_ = static_cast<std::size_t>(std::to_chars(p, p + 24, v).ptr - buf_.data());
  }
  void real(double v) {
    char* p = room(40);
    len_ = static_cast<std::size_t>(write_python_float(p, v) - buf_.data());
  }
  void raw(std::string_view s) { put(s.data(), s.size()); }

  // A value that a JsonText wrote on one line (indent None: ", " and ": " separators), laid out as
  // this writer lays out a value at `depth`: the text json.dumps(json.loads(line), indent) gives,
  // without parsing it (numbers and strings keep their spelling), in one pass. The step's
  // dump.json is made this way from its journal's lines (io/journal_dump.hpp). `line` must be such
  // text: only strings, braces, brackets and ", " separators are looked at.
  void relayout(std::string_view line, int depth) {
    if (indent_ < 0) return raw(line);
    const char* p = line.data();
    const char* const end = p + line.size();
    const std::size_t step = static_cast<std::size_t>(indent_);
    int open = depth - 1;  // the depth of the innermost container open
    // The text goes straight into the buffer: `o` writes, `limit` ends the room made. Before each
    // line break there is room for the rest of the line and the break with its indentation, so the
    // bytes between two breaks need no check.
    char* o = room(line.size() + 1 + step * static_cast<std::size_t>(depth + 1));
    char* limit = buf_.data() + buf_.size();
    auto line_break = [&](int at) {
      // The break, its indentation, the closer written after it ('}' or ']', already read) and
      // the rest of the line.
      const std::size_t spaces = step * static_cast<std::size_t>(at < 0 ? 0 : at);
      const std::size_t need = spaces + 2 + static_cast<std::size_t>(end - p);
      if (static_cast<std::size_t>(limit - o) < need) {
        len_ = static_cast<std::size_t>(o - buf_.data());
        o = room(need);
        limit = buf_.data() + buf_.size();
      }
      *o++ = '\n';
      std::memset(o, ' ', spaces);
      o += spaces;
    };
    while (p != end) {
      const char c = *p++;
      switch (details::kRelayoutStops.at[static_cast<unsigned char>(c)]) {
        case 0: *o++ = c; break;
        case 1:  // a string, through its closing quote; an escaped character is copied whole
          *o++ = c;
          while (p != end && *p != '"') {
            if (*p == '\\' && p + 1 != end) *o++ = *p++;
            *o++ = *p++;
          }
          if (p != end) *o++ = *p++;
          break;
        case 2:                                        // '{' or '['
          if (p != end && (*p == '}' || *p == ']')) {  // {} and [] stay as they are
            *o++ = c;
            *o++ = *p++;
          } else {
            *o++ = c;
            line_break(++open + 1);
          }
          break;
        case 3:  // '}' or ']'
          line_break(open--);
          *o++ = c;
          break;
        default:  // ',' and the space after it
          *o++ = c;
          if (p != end && *p == ' ') ++p;
          line_break(open + 1);
      }
    }
    len_ = static_cast<std::size_t>(o - buf_.data());
  }

  // A container is written as open(), then item() or key() before each element, then close().
  // `depth` is the container's own depth; `count` how many elements it got.
  void open_object() { put('{'); }
  void open_array() { put('['); }
  void item(std::size_t index, int depth) {
    if (indent_ >= 0) {
      const std::size_t spaces = static_cast<std::size_t>(indent_) * static_cast<std::size_t>(depth + 1);
      char* p = room(spaces + 2);
      if (index != 0) *p++ = ',';
      *p++ = '\n';
      std::memset(p, ' ', spaces);
      len_ = static_cast<std::size_t>(p + spaces - buf_.data());
    } else if (index != 0) {
      put(", ", 2);
    }
  }
  void key(std::size_t index, int depth, std::string_view name) {
    item(index, depth);
    string(name);
    put(": ", 2);
  }
  // key() for a name that needs no escaping, given with its quotes and separator: "\"type\": ".
  void plain_key(std::size_t index, int depth, std::string_view quoted) {
    item(index, depth);
    put(quoted.data(), quoted.size());
  }
  // string() for text that needs no escaping (printable ASCII without '"' or '\\').
  void plain_string(std::string_view s) {
    char* p = room(s.size() + 2);
    *p = '"';
    std::memcpy(p + 1, s.data(), s.size());
    p[s.size() + 1] = '"';
    len_ += s.size() + 2;
  }
  void close_object(std::size_t count, int depth) { close(count, depth, '}'); }
  void close_array(std::size_t count, int depth) { close(count, depth, ']'); }

  // Hands the text to the drain once it holds a chunk's worth: call between elements.
  void maybe_drain() {
    if (drain_ != nullptr && len_ >= kChunk) drain();
  }
  // The buffer keeps its size: the next chunk reuses its room, which is not filled with zeros again.
  void drain() {
    if (drain_ == nullptr || len_ == 0) return;
    drain_->take(std::string_view(buf_.data(), len_));
    len_ = 0;
  }

  // ensure_ascii=True: printable ASCII stays, everything else is escaped; code points above the BMP
  // become surrogate pairs. Bytes that are not valid UTF-8 (Python strings never contain them)
  // become U+FFFD rather than aborting a dump.
  void string(std::string_view s) {
    put('"');
    const auto* b = reinterpret_cast<const unsigned char*>(s.data());
    const std::size_t n = s.size();
    std::size_t i = 0;
    while (i < n) {
      std::size_t run = i;  // fast path: copy runs of characters that need no escape in one go
      while (run < n && b[run] >= 0x20 && b[run] < 0x7F && b[run] != '"' && b[run] != '\\') ++run;
      if (run != i) {
        put(s.data() + i, run - i);
        i = run;
        if (i == n) break;
      }
      const unsigned c = b[i];
      if (c < 0x80) {
        escape_ascii(c);
        ++i;
        continue;
      }
      unsigned cp = 0;
      const std::size_t len = utf8_decode(b + i, n - i, cp);
      if (len == 0) {
        hex4(0xFFFD);
        ++i;
        continue;
      }
      i += len;
      if (cp >= 0x10000) {
        cp -= 0x10000;
        hex4(0xD800 + (cp >> 10));
        hex4(0xDC00 + (cp & 0x3FF));
      } else {
        hex4(cp);
      }
    }
    put('"');
  }

 private:
  static constexpr std::size_t kChunk = std::size_t{1} << 20;

  // Room for n more bytes at the end of the text; the buffer grows geometrically.
  char* room(std::size_t n) {
    if (buf_.size() - len_ < n) buf_.resize(std::max(len_ + n, 2 * buf_.size() + 4096));
    return buf_.data() + len_;
  }
  void put(const char* s, std::size_t n) {
    std::memcpy(room(n), s, n);
    len_ += n;
  }
  void put(char c) {
    *room(1) = c;
    ++len_;
  }

  void close(std::size_t count, int depth, char closer) {
    if (count != 0 && indent_ >= 0) {  // Python writes empty containers as [] and {} whatever the indent
      const std::size_t spaces = static_cast<std::size_t>(indent_) * static_cast<std::size_t>(depth);
      char* p = room(spaces + 1);
      *p++ = '\n';
      std::memset(p, ' ', spaces);
      len_ += spaces + 1;
    }
    put(closer);
  }

  void escape_ascii(unsigned c) {
    switch (c) {
      case '"': put("\\\"", 2); break;
      case '\\': put("\\\\", 2); break;
      case '\n': put("\\n", 2); break;
      case '\r': put("\\r", 2); break;
      case '\t': put("\\t", 2); break;
      case '\b': put("\\b", 2); break;
      case '\f': put("\\f", 2); break;
      default: hex4(c);  // other controls and DEL (0x7F is outside Python's ' '..'~' range)
    }
  }

  void hex4(unsigned cp) {
    static constexpr char kHex[] = "0123456789abcdef";  // Python writes lowercase \uXXXX
    const char esc[6] = {'\\',          'u', kHex[(cp >> 12) & 0xF], kHex[(cp >> 8) & 0xF], kHex[(cp >> 4) & 0xF],
                         kHex[cp & 0xF]};
    put(esc, 6);
  }

  // Returns the sequence length, 0 when malformed (overlong, truncated, > U+10FFFF). Encoded
  // surrogates are accepted: Python would print a lone surrogate as \udXXX too.
  static std::size_t utf8_decode(const unsigned char* p, std::size_t avail, unsigned& cp) {
    std::size_t len;
    unsigned min;
    if ((p[0] & 0xE0) == 0xC0) {
      len = 2, cp = p[0] & 0x1F, min = 0x80;
    } else if ((p[0] & 0xF0) == 0xE0) {
      len = 3, cp = p[0] & 0x0F, min = 0x800;
    } else if ((p[0] & 0xF8) == 0xF0) {
      len = 4, cp = p[0] & 0x07, min = 0x10000;
    } else {
      return 0;
    }
    if (avail < len) return 0;
    for (std::size_t k = 1; k < len; ++k) {
      if ((p[k] & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (p[k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF) return 0;
    return len;
  }

  std::string& buf_;
  std::size_t len_;  // the text's length; buf_ may be longer (room to spare)
  int indent_;
  TextDrain* drain_;
};

}  // namespace torchprobe::io

#pragma once
// JSON text exactly as Python's json module writes it.
//
// msprobe writes dump.json with `json.dump(obj, f, indent=1)`; tools that read our dumps (msprobe's
// compare, diff scripts, people running `diff` on two dump.json files) see the same bytes only if we
// reproduce that writer: float repr (shortest round trip, Python's fixed/scientific switch), bare
// NaN/Infinity tokens (allow_nan=True), ensure_ascii escaping and Python's separators. nlohmann's own
// dump() differs (NaN becomes null, its own float layout and indentation), so we walk the tree.
#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace torchprobe::io {

// Python's float.__repr__ as used by json.dumps (NaN/Infinity spelled the way json writes them).
inline std::string python_float_repr(double v) {
  if (std::isnan(v)) return "NaN";  // json checks `o != o`, so a negative NaN is "NaN" as well
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";

  // to_chars without a precision gives the shortest digit string that round-trips, which is what
  // Python's repr uses (David Gay's mode 0). Scientific form makes digits and exponent easy to split.
  char sci[64];
  auto res = std::to_chars(sci, sci + sizeof sci, v, std::chars_format::scientific);
  const char* p = sci;
  const char* end = res.ptr;
  std::string out;
  out.reserve(32);
  if (*p == '-') {  // keeps the sign of -0.0, as Python does
    out.push_back('-');
    ++p;
  }
  std::string digits;
  while (p != end && *p != 'e') {
    if (*p != '.') digits.push_back(*p);
    ++p;
  }
  int exp10 = 0;
  if (p != end) std::from_chars(p + 1 + (p[1] == '+' ? 1 : 0), end, exp10);

  // Python (float_repr_style 'short'): scientific when the decimal exponent is < -4 or >= 16.
  if (exp10 < -4 || exp10 >= 16) {
    out.push_back(digits[0]);
    if (digits.size() > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    out.push_back('e');
    out.push_back(exp10 < 0 ? '-' : '+');
    int mag = exp10 < 0 ? -exp10 : exp10;
    if (mag < 10) out.push_back('0');  // at least two exponent digits: 1e-05, 1e+16
    out += std::to_string(mag);
  } else if (exp10 >= 0) {
    const std::size_t int_len = static_cast<std::size_t>(exp10) + 1;
    if (digits.size() <= int_len) {
      out += digits;
      out.append(int_len - digits.size(), '0');
      out += ".0";  // Python always marks an integral float
    } else {
      out.append(digits, 0, int_len);
      out.push_back('.');
      out.append(digits, int_len, std::string::npos);
    }
  } else {
    out += "0.";
    out.append(static_cast<std::size_t>(-exp10 - 1), '0');
    out += digits;
  }
  return out;
}

namespace detail {

// Streams one JSON tree. Output goes into a string buffer that is handed to the ostream in large
// chunks (or kept whole for to_python_json), so a 100k-entry dump costs no per-node allocations.
template <class Json>
class PythonJsonWriter {
 public:
  PythonJsonWriter(std::string& buf, std::ostream* os, int indent) : buf_(buf), os_(os), indent_(indent) {}

  void write(const Json& j) {
    value(j, 0);
    flush();
  }

 private:
  static constexpr std::size_t kFlushAt = 1 << 16;

  void flush() {
    if (os_ != nullptr && !buf_.empty()) {
      os_->write(buf_.data(), static_cast<std::streamsize>(buf_.size()));
      buf_.clear();
    }
  }
  void maybe_flush() {
    if (os_ != nullptr && buf_.size() >= kFlushAt) flush();
  }

  // Python: with an indent, items are separated by ",\n" + indentation; without, by ", ".
  void open_item(std::size_t index, int depth) {
    if (indent_ >= 0) {
      buf_.append(index == 0 ? "\n" : ",\n");
      buf_.append(static_cast<std::size_t>(indent_) * static_cast<std::size_t>(depth), ' ');
    } else if (index != 0) {
      buf_.append(", ");
    }
  }
  void close_container(int depth, char closer) {
    if (indent_ >= 0) {
      buf_.push_back('\n');
      buf_.append(static_cast<std::size_t>(indent_) * static_cast<std::size_t>(depth), ' ');
    }
    buf_.push_back(closer);
  }

  template <class Int>
  void integer(Int v) {
    char tmp[24];
    auto r = std::to_chars(tmp, tmp + sizeof tmp, v);
    buf_.append(tmp, r.ptr);
  }

  void value(const Json& j, int depth) {
    using T = nlohmann::detail::value_t;
    switch (j.type()) {
      case T::null: buf_.append("null"); break;
      case T::boolean: buf_.append(j.template get<bool>() ? "true" : "false"); break;
      case T::number_integer: integer(j.template get<std::int64_t>()); break;
      case T::number_unsigned: integer(j.template get<std::uint64_t>()); break;
      case T::number_float: buf_.append(python_float_repr(j.template get<double>())); break;
      case T::string: string(j.template get_ref<const std::string&>()); break;
      case T::array: {
        if (j.empty()) {
          buf_.append("[]");
          break;
        }
        buf_.push_back('[');
        std::size_t i = 0;
        for (const auto& item : j) {
          open_item(i++, depth + 1);
          value(item, depth + 1);
          maybe_flush();
        }
        close_container(depth, ']');
        break;
      }
      case T::object: {
        if (j.empty()) {
          buf_.append("{}");
          break;
        }
        buf_.push_back('{');
        std::size_t i = 0;
        for (auto it = j.begin(); it != j.end(); ++it) {
          open_item(i++, depth + 1);
          string(it.key());
          buf_.append(": ");
          value(it.value(), depth + 1);
          maybe_flush();
        }
        close_container(depth, '}');
        break;
      }
      case T::binary:
        // Python has no such value; silently inventing a layout would make files no reader expects.
        throw std::invalid_argument("torchprobe: binary JSON values cannot be written as Python JSON");
      case T::discarded: throw std::invalid_argument("torchprobe: a discarded JSON value cannot be written");
    }
  }

  void hex4(unsigned cp) {
    static constexpr char kHex[] = "0123456789abcdef";  // Python writes lowercase \uXXXX
    const char esc[6] = {'\\',          'u', kHex[(cp >> 12) & 0xF], kHex[(cp >> 8) & 0xF], kHex[(cp >> 4) & 0xF],
                         kHex[cp & 0xF]};
    buf_.append(esc, 6);
  }

  // ensure_ascii=True: printable ASCII stays, everything else is escaped; code points above the BMP
  // become surrogate pairs. Bytes that are not valid UTF-8 (Python strings never contain them)
  // become U+FFFD rather than aborting a dump.
  void string(const std::string& s) {
    buf_.push_back('"');
    const auto* b = reinterpret_cast<const unsigned char*>(s.data());
    const std::size_t n = s.size();
    std::size_t i = 0;
    while (i < n) {
      std::size_t run = i;  // fast path: copy runs of characters that need no escape in one go
      while (run < n && b[run] >= 0x20 && b[run] < 0x7F && b[run] != '"' && b[run] != '\\') ++run;
      if (run != i) {
        buf_.append(s, i, run - i);
        i = run;
        if (i == n) break;
      }
      const unsigned c = b[i];
      if (c < 0x80) {
        switch (c) {
          case '"': buf_.append("\\\""); break;
          case '\\': buf_.append("\\\\"); break;
          case '\n': buf_.append("\\n"); break;
          case '\r': buf_.append("\\r"); break;
          case '\t': buf_.append("\\t"); break;
          case '\b': buf_.append("\\b"); break;
          case '\f': buf_.append("\\f"); break;
          default: hex4(c);  // other controls and DEL (0x7F is outside Python's ' '..'~' range)
        }
        ++i;
        continue;
      }
      unsigned cp = 0;
      std::size_t len = utf8_decode(b + i, n - i, cp);
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
    buf_.push_back('"');
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
  std::ostream* os_;
  int indent_;
};

template <class Json>
void write_python_json_impl(std::ostream& os, const Json& j, int indent) {
  std::string buf;
  buf.reserve(1 << 16);
  PythonJsonWriter<Json>(buf, &os, indent).write(j);
}

template <class Json>
std::string to_python_json_impl(const Json& j, int indent) {
  std::string buf;
  PythonJsonWriter<Json>(buf, nullptr, indent).write(j);
  return buf;
}

}  // namespace detail

// Same bytes as Python's json.dump(obj, f, indent=indent) (no trailing newline, like Python).
// indent >= 0 is Python's integer indent (0 = newlines without indentation); a negative indent
// stands for indent=None: one line with ", " and ": " separators, as plain json.dumps(obj).
inline void write_python_json(std::ostream& os, const nlohmann::ordered_json& j, int indent = 1) {
  detail::write_python_json_impl(os, j, indent);
}
// Other nlohmann::basic_json flavours (e.g. nlohmann::json); exact types only, so that values that
// merely convert to JSON pick the ordered_json overload above instead of being ambiguous.
template <class Json, std::enable_if_t<nlohmann::detail::is_basic_json<Json>::value, int> = 0>
void write_python_json(std::ostream& os, const Json& j, int indent = 1) {
  detail::write_python_json_impl(os, j, indent);
}

inline std::string to_python_json(const nlohmann::ordered_json& j, int indent = 1) {
  return detail::to_python_json_impl(j, indent);
}
template <class Json, std::enable_if_t<nlohmann::detail::is_basic_json<Json>::value, int> = 0>
std::string to_python_json(const Json& j, int indent = 1) {
  return detail::to_python_json_impl(j, indent);
}

}  // namespace torchprobe::io

#pragma once
// JSON text read as spans of itself, for the recovery of journals (io/recovery.hpp): a value keeps
// the exact spelling its writer gave numbers and strings, so that a step rebuilt from its journal
// lines is byte for byte what TorchProbe wrote (a parse into doubles and a new dump would respell
// them). Also json.dump(v, f, indent=1)'s layout of such a value, and Python's repr() of bytes.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchprobe/io/json_text.hpp"

namespace torchprobe::io::recovery::details {

// A JSON value as spans of the line's text: objects and arrays keep their members, the rest is raw.
struct Value {
  enum Kind { kObject, kArray, kString, kNumber, kLiteral } kind = kLiteral;
  std::string_view raw;                                     // the value's whole text
  std::vector<std::pair<std::string_view, Value>> members;  // objects: (key's raw text, value); arrays: ("", item)

  const Value* find(std::string_view key) const {  // the last member of that name, as Python's json keeps
    const Value* found = nullptr;
    const std::string quoted = "\"" + std::string(key) + "\"";
    for (const auto& [k, v] : members)
      if (k == quoted) found = &v;
    return found;
  }
  bool is_string() const { return kind == kString; }
  bool is_int() const {
    if (kind != kNumber) return false;
    return raw.find_first_of(".eE") == std::string_view::npos;
  }
  std::string text() const {  // a string's value
    try {
      return nlohmann::json::parse(raw).get<std::string>();
    } catch (const std::exception&) {
      return std::string(raw);
    }
  }
};

// A validating reader of one JSON text (Python's json.loads: also NaN, Infinity, -Infinity).
class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  bool read(Value& v) {
    skip();
    if (!value(v, 0)) return false;
    skip();
    return p_ == s_.size();
  }

 private:
  void skip() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\t' || s_[p_] == '\n' || s_[p_] == '\r')) ++p_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(p_, word.size()) != word) return false;
    p_ += word.size();
    return true;
  }
  bool string_token() {
    if (p_ >= s_.size() || s_[p_] != '"') return false;
    for (++p_; p_ < s_.size(); ++p_) {
      const char c = s_[p_];
      if (c == '"') {
        ++p_;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c == '\\') {
        if (++p_ >= s_.size()) return false;
        const char e = s_[p_];
        if (e == 'u') {
          for (int i = 0; i < 4; ++i)
            if (++p_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[p_]))) return false;
        } else if (std::strchr("\"\\/bfnrt", e) == nullptr || e == '\0') {
          return false;
        }
      }
    }
    return false;
  }
  bool number() {
    const std::size_t start = p_;
    if (p_ < s_.size() && s_[p_] == '-') ++p_;
    if (literal("Infinity")) return true;
    const std::size_t digits = p_;
    if (p_ < s_.size() && s_[p_] == '0')
      ++p_;
    else
      while (p_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p_]))) ++p_;
    if (p_ == digits) return false;
    if (p_ < s_.size() && s_[p_] == '.') {
      const std::size_t f = ++p_;
      while (p_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p_]))) ++p_;
      if (p_ == f) return false;
    }
    if (p_ < s_.size() && (s_[p_] == 'e' || s_[p_] == 'E')) {
      ++p_;
      if (p_ < s_.size() && (s_[p_] == '+' || s_[p_] == '-')) ++p_;
      const std::size_t e = p_;
      while (p_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p_]))) ++p_;
      if (p_ == e) return false;
    }
    return p_ > start;
  }
  bool value(Value& v, int depth) {
    if (depth > 512 || p_ >= s_.size()) return false;
    const std::size_t start = p_;
    const char c = s_[p_];
    bool ok = false;
    if (c == '{' || c == '[') {
      v.kind = c == '{' ? Value::kObject : Value::kArray;
      const char close = c == '{' ? '}' : ']';
      ++p_;
      skip();
      if (p_ < s_.size() && s_[p_] == close) {
        ++p_;
        ok = true;
      } else {
        for (;;) {
          skip();
          std::string_view key;
          if (v.kind == Value::kObject) {
            const std::size_t k = p_;
            if (!string_token()) return false;
            key = s_.substr(k, p_ - k);
            skip();
            if (p_ >= s_.size() || s_[p_] != ':') return false;
            ++p_;
            skip();
          }
          Value item;
          if (!value(item, depth + 1)) return false;
          v.members.emplace_back(key, std::move(item));
          skip();
          if (p_ < s_.size() && s_[p_] == ',') {
            ++p_;
            continue;
          }
          if (p_ < s_.size() && s_[p_] == close) {
            ++p_;
            ok = true;
          }
          break;
        }
      }
    } else if (c == '"') {
      v.kind = Value::kString;
      ok = string_token();
    } else if (c == 't' || c == 'f' || c == 'n' || c == 'N') {
      v.kind = Value::kLiteral;
      ok = literal("true") || literal("false") || literal("null") || literal("NaN");
    } else {
      v.kind = Value::kNumber;
      ok = number();
    }
    if (ok) v.raw = s_.substr(start, p_ - start);
    return ok;
  }

  std::string_view s_;
  std::size_t p_ = 0;
};

// `v` as json.dump(v, f, indent=1) writes it at nesting `depth`.
inline void write_indented(std::string& out, const Value& v, int depth) {
  if ((v.kind != Value::kObject && v.kind != Value::kArray) || v.members.empty()) {
    out.append(v.raw);
    return;
  }
  const bool object = v.kind == Value::kObject;
  out += object ? '{' : '[';
  for (std::size_t i = 0; i < v.members.size(); ++i) {
    out += i == 0 ? "\n" : ",\n";
    out.append(static_cast<std::size_t>(depth + 1), ' ');
    if (object) out.append(v.members[i].first).append(": ");
    write_indented(out, v.members[i].second, depth + 1);
  }
  out += '\n';
  out.append(static_cast<std::size_t>(depth), ' ');
  out += object ? '}' : ']';
}

inline std::string python_string(std::string_view s) {  // a JSON string as Python's json.dump writes it
  std::string out;
  JsonText t(out, 1);
  t.string(s);
  t.finish();
  return out;
}

// Python's repr() of a bytes object, as the tool's messages show a bad first line.
inline std::string bytes_repr(std::string_view b) {
  const bool dq = b.find('\'') != std::string_view::npos && b.find('"') == std::string_view::npos;
  const char q = dq ? '"' : '\'';
  std::string out = "b";
  out += q;
  for (const char ch : b) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\' || c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += ch;
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += q;
  return out;
}

}  // namespace torchprobe::io::recovery::details

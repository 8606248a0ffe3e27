#pragma once
// The JSON reader of `torchprobe compare`: text to nlohmann::ordered_json, as nlohmann's own parser
// makes it (same numbers: unsigned, integer or float as nlohmann types them; same strings; a
// repeated key keeps its first place and its last value), plus Python's bare NaN, Infinity and
// -Infinity, which json.dump writes and nlohmann rejects. Why not nlohmann's parser: ordered_json
// inserts each key with a search of the keys before it, so a dump.json whose "data" holds N entries
// took N^2/2 comparisons (63 of the 75 s of a 100k-entry compare); here a large object indexes its
// keys in a hash table while it is read. It also reads the text once, where marking Python's floats
// for nlohmann copied it first.
#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchprobe::compare {

// Invalid JSON: what() names the byte offset and what was expected there.
struct JsonSyntaxError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {

class JsonReader {
 public:
  using Json = nlohmann::ordered_json;
  explicit JsonReader(std::string_view text) : begin_(text.data()), p_(text.data()), end_(text.data() + text.size()) {}

  Json document() {
    Json v = value(0);
    space();
    if (p_ != end_) fail("end of input");
    return v;
  }

 private:
  // Objects with more keys than this find a repeated key through a hash table, not a scan.
  static constexpr std::size_t kIndexedKeys = 16;
  static constexpr int kMaxDepth = 1000;  // deeper nesting is no dump; recursion must stop somewhere

  [[noreturn]] void fail(const char* expected) const {
    std::string near;
    for (const char* q = p_; q < end_ && q < p_ + 20; ++q) near += *q;
    throw JsonSyntaxError("parse error at byte " + std::to_string(p_ - begin_) + ": expected " + expected +
                          (p_ == end_ ? " (the text ends there)" : ", found '" + near + "'"));
  }
  void space() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool literal(const char* word) {
    const std::size_t n = std::strlen(word);
    if (static_cast<std::size_t>(end_ - p_) < n || std::memcmp(p_, word, n) != 0) return false;
    p_ += n;
    return true;
  }

  Json value(int depth) {
    if (depth > kMaxDepth) fail("no deeper nesting");
    space();
    if (p_ == end_) fail("a value");
    switch (*p_) {
      case '{': return object(depth);
      case '[': return array(depth);
      case '"': return Json(string());
      case 't':
        if (literal("true")) return Json(true);
        break;
      case 'f':
        if (literal("false")) return Json(false);
        break;
      case 'n':
        if (literal("null")) return Json(nullptr);
        break;
      case 'N':
        if (literal("NaN")) return Json(std::numeric_limits<double>::quiet_NaN());
        break;
      case 'I':
        if (literal("Infinity")) return Json(std::numeric_limits<double>::infinity());
        break;
      default:
        if (*p_ == '-' && literal("-Infinity")) return Json(-std::numeric_limits<double>::infinity());
        if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9')) return number();
    }
    fail("a value");
  }

  Json object(int depth) {
    ++p_;  // '{'
    // Members gather in this depth's scratch vector, kept between objects (one allocation per
    // object, the object's own, instead of a vector grown and dropped for each).
    if (object_scratch_.size() <= static_cast<std::size_t>(depth)) object_scratch_.resize(depth + 1);
    auto& members = object_scratch_[depth];
    members.clear();
    std::unordered_map<std::string_view, std::size_t> index;  // filled once the object is large
    space();
    if (p_ != end_ && *p_ == '}') {
      ++p_;
      return Json::object();
    }
    for (;;) {
      space();
      if (p_ == end_ || *p_ != '"') fail("a key string");
      std::string key = string();
      space();
      if (p_ == end_ || *p_ != ':') fail("':'");
      ++p_;
      Json v = value(depth + 1);
      constexpr std::size_t kNone = static_cast<std::size_t>(-1);
      std::size_t at = kNone;
      if (members.size() <= kIndexedKeys) {
        for (std::size_t i = 0; i < members.size() && at == kNone; ++i) at = members[i].first == key ? i : kNone;
      } else {
        if (index.size() != members.size()) {  // first use, or cleared by a reallocation: built once
          index.clear();
          index.reserve(members.size() * 2);
          for (std::size_t i = 0; i < members.size(); ++i) index.emplace(members[i].first, i);
        }
        const auto it = index.find(key);
        if (it != index.end()) at = it->second;
      }
      if (at != kNone) {
        members[at].second = std::move(v);  // nlohmann: the first place, the last value
      } else {
        // The index holds views of the keys, which a reallocation moves (short strings live inside
        // the member): then it is rebuilt, at each doubling only.
        const bool moves = members.size() == members.capacity();
        members.emplace_back(std::move(key), std::move(v));
        if (moves)
          index.clear();
        else if (!index.empty())
          index.emplace(members.back().first, members.size() - 1);
      }
      space();
      if (p_ != end_ && *p_ == ',') {
        ++p_;
        continue;
      }
      if (p_ != end_ && *p_ == '}') {
        ++p_;
        break;
      }
      fail("',' or '}'");
    }
    Json out = Json::object();
    auto& obj = out.get_ref<Json::object_t&>();
    obj.reserve(members.size());
    for (auto& m : members) obj.emplace_back(std::move(m.first), std::move(m.second));
    members.clear();
    return out;
  }

  Json array(int depth) {
    ++p_;  // '['
    Json out = Json::array();
    space();
    if (p_ != end_ && *p_ == ']') {
      ++p_;
      return out;
    }
    if (array_scratch_.size() <= static_cast<std::size_t>(depth)) array_scratch_.resize(depth + 1);
    auto& items = array_scratch_[depth];  // as object()'s members
    items.clear();
    for (;;) {
      items.push_back(value(depth + 1));
      space();
      if (p_ != end_ && *p_ == ',') {
        ++p_;
        continue;
      }
      if (p_ != end_ && *p_ == ']') {
        ++p_;
        break;
      }
      fail("',' or ']'");
    }
    auto& arr = out.get_ref<Json::array_t&>();
    arr.reserve(items.size());
    for (auto& v : items) arr.push_back(std::move(v));
    items.clear();
    return out;
  }

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, typed as nlohmann types it: without fraction or
  // exponent an unsigned (no sign) or integer (sign), unless out of range; else a double.
  Json number() {
    const char* start = p_;
    const auto digits = [&] {
      const char* d = p_;
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      return p_ != d;
    };
    const bool negative = *p_ == '-';
    if (negative) ++p_;
    if (p_ != end_ && *p_ == '0') {
      ++p_;
    } else if (!digits()) {
      fail("a digit");
    }
    bool is_float = false;
    if (p_ != end_ && *p_ == '.') {
      ++p_;
      if (!digits()) fail("a digit after '.'");
      is_float = true;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (!digits()) fail("a digit in the exponent");
      is_float = true;
    }
    if (!is_float) {
      if (negative) {
        std::int64_t i = 0;
        const auto r = std::from_chars(start, p_, i);
        if (r.ec == std::errc() && r.ptr == p_) return Json(i);
      } else {
        std::uint64_t u = 0;
        const auto r = std::from_chars(start, p_, u);
        if (r.ec == std::errc() && r.ptr == p_) return Json(u);
      }
    }
    double d = 0;
    const auto r = std::from_chars(start, p_, d);
    if (r.ec == std::errc::result_out_of_range) {  // from_chars leaves d alone: strtod's value, as nlohmann's
      d = std::strtod(std::string(start, p_).c_str(), nullptr);
      if (!std::isfinite(d)) {  // nlohmann rejects an overflow too (its out_of_range 406)
        p_ = start;
        fail("a number within the range of a double");
      }
    } else if (r.ec != std::errc() || r.ptr != p_) {
      p_ = start;
      fail("a number");
    }
    return Json(d);
  }

  static void put_utf8(std::string& out, std::uint32_t c) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  std::uint32_t hex4() {
    if (end_ - p_ < 4) fail("four hex digits");
    std::uint32_t c = 0;
    for (int i = 0; i < 4; ++i, ++p_) {
      const char h = *p_;
      c <<= 4;
      if (h >= '0' && h <= '9')
        c |= static_cast<std::uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f')
        c |= static_cast<std::uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        c |= static_cast<std::uint32_t>(h - 'A' + 10);
      else
        fail("a hex digit");
    }
    return c;
  }
  // One UTF-8 sequence as RFC 3629 allows it (nlohmann rejects the others too).
  void utf8(std::string& out) {
    const auto u = [&](std::ptrdiff_t k) { return static_cast<unsigned char>(p_[k]); };
    const unsigned char c = u(0);
    int n = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      fail("valid UTF-8");
    }
    if (end_ - p_ <= n) fail("valid UTF-8");
    for (int k = 1; k <= n; ++k) {
      const unsigned char b = u(k);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) fail("valid UTF-8");
    }
    out.append(p_, static_cast<std::size_t>(n) + 1);
    p_ += n + 1;
  }

  std::string string() {
    ++p_;  // '"'
    std::string out;
    for (;;) {
      const char* run = p_;  // plain characters are copied in one piece
      while (p_ != end_ && *p_ != '"' && *p_ != '\\' && static_cast<unsigned char>(*p_) >= 0x20 &&
             static_cast<unsigned char>(*p_) < 0x80)
        ++p_;
      out.append(run, static_cast<std::size_t>(p_ - run));
      if (p_ == end_) fail("a closing '\"'");
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        ++p_;
        return out;
      }
      if (c < 0x20) fail("no control character in a string");
      if (c >= 0x80) {
        utf8(out);
        continue;
      }
      ++p_;  // '\\'
      if (p_ == end_) fail("an escape");
      const char e = *p_++;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // a high surrogate needs its low one
            if (!(end_ - p_ >= 2 && p_[0] == '\\' && p_[1] == 'u')) fail("a low surrogate");
            p_ += 2;
            const std::uint32_t low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("no lone low surrogate");
          }
          put_utf8(out, cp);
          break;
        }
        default: --p_; fail("an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u)");
      }
    }
  }

  const char* begin_;
  const char* p_;
  const char* end_;
  // By depth. Deques: growing one keeps the references that the levels above hold into it.
  std::deque<std::vector<std::pair<std::string, Json>>> object_scratch_;
  std::deque<std::vector<Json>> array_scratch_;
};

}  // namespace detail

// Parses JSON text (with Python's NaN / Infinity / -Infinity); throws JsonSyntaxError.
inline nlohmann::ordered_json parse_json_text(std::string_view text) { return detail::JsonReader(text).document(); }

}  // namespace torchprobe::compare

#pragma once
// The JSON reader of `torchprobe compare`: text to nlohmann::ordered_json with nlohmann's own SAX
// parser, plus Python's bare NaN, Infinity and -Infinity, which json.dump writes and nlohmann
// rejects. Why not ordered_json::parse: ordered_json inserts each key with a search of the keys
// before it, so a dump.json whose "data" holds N entries took N^2/2 comparisons (63 of the 75 s of a
// 100k-entry compare). The SAX handler below appends each member at the end of its object and
// finds a repeated key through a hash table once an object is large; values and numbers are
// nlohmann's (a repeated key keeps its first place and its last value, as parse() does).
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchprobe::compare {

// Invalid JSON: what() names the byte offset and what nlohmann expected there.
struct JsonSyntaxError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The deepest nesting the readers take (msprobe's files nest a few levels; simdjson's limit is 1024).
inline constexpr std::size_t kMostJsonDepth = 512;

namespace details {

// Python's non-finite floats become strings nlohmann can read, marked so that no dump string can
// be mistaken for one; the handler turns them back into numbers.
constexpr const char* kPyFloatMark = "\\u0001tp:";  // JSON's escape of \x01

inline std::string mark_python_floats(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    const auto at = [&](const char* token) { return text.compare(i, std::strlen(token), token) == 0; };
    const char* token = at("NaN") ? "NaN" : at("Infinity") ? "Infinity" : at("-Infinity") ? "-Infinity" : nullptr;
    if (token) {
      out += std::string("\"") + kPyFloatMark + token + "\"";
      i += std::strlen(token) - 1;
    } else {
      out += c;
    }
  }
  return out;
}

class OrderedJsonBuilder : public nlohmann::json_sax<nlohmann::ordered_json> {
 public:
  using Json = nlohmann::ordered_json;
  Json result;

  bool null() override { return put(Json(nullptr)); }
  bool boolean(bool v) override { return put(Json(v)); }
  bool number_integer(number_integer_t v) override { return put(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return put(Json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return put(Json(v)); }
  bool string(string_t& v) override {
    static const std::string mark = "\x01tp:";
    if (v.size() > mark.size() && v.compare(0, mark.size(), mark) == 0) {
      const std::string t = v.substr(mark.size());
      return put(Json(t == "NaN" ? std::nan("") : t == "Infinity" ? HUGE_VAL : -HUGE_VAL));
    }
    return put(Json(std::move(v)));
  }
  bool binary(binary_t&) override { throw JsonSyntaxError("binary value in JSON text"); }
  bool start_object(std::size_t) override {
    check_depth();
    Json* j = put_container(Json::object());
    open_.push_back({j, {}});
    return true;
  }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    check_depth();
    Json* j = put_container(Json::array());
    open_.push_back({j, {}});
    return true;
  }
  bool end_array() override {
    open_.pop_back();
    return true;
  }
  // Deeper values are refused, not built: what reads them next (comparisons, Python reprs, dump())
  // recurses once a level, and a file of a million '[' would exhaust the stack.
  void check_depth() const {
    if (open_.size() >= kMostJsonDepth)
      throw JsonSyntaxError("values nested deeper than " + std::to_string(kMostJsonDepth) +
                            " levels (a dump nests a few)");
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    throw JsonSyntaxError("parse error at byte " + std::to_string(position) + ": " + e.what());
  }

 private:
  // An object larger than this finds a repeated key through its index, not a scan.
  static constexpr std::size_t kIndexedKeys = 16;
  struct Open {
    Json* value;
    std::unordered_map<std::string, std::size_t> index;  // keys -> position, once the object is large
  };

  Json* put_container(Json&& v) {
    put(std::move(v));
    return last_;
  }
  bool put(Json&& v) {
    if (open_.empty()) {
      result = std::move(v);
      last_ = &result;
      return true;
    }
    Open& o = open_.back();
    if (o.value->is_array()) {
      auto& a = o.value->get_ref<Json::array_t&>();
      a.push_back(std::move(v));
      last_ = &a.back();
      return true;
    }
    // ordered_map is a vector of pairs: append at the end, after looking for the key once.
    // (ordered_map's operator[] takes a key: index its vector of pairs.)
    auto& members = static_cast<Json::object_t::Container&>(o.value->get_ref<Json::object_t&>());
    std::size_t at = members.size();
    if (members.size() <= kIndexedKeys) {
      for (std::size_t i = 0; i < members.size(); ++i)
        if (members[i].first == key_) at = i;
    } else {
      if (o.index.empty())
        for (std::size_t i = 0; i < members.size(); ++i) o.index.emplace(members[i].first, i);
      const auto it = o.index.find(key_);
      if (it != o.index.end()) at = it->second;
    }
    if (at < members.size()) {  // a repeated key: first place, last value
      members[at].second = std::move(v);
      last_ = &members[at].second;
      return true;
    }
    if (!o.index.empty()) o.index.emplace(key_, members.size());
    members.emplace_back(std::move(key_), std::move(v));
    last_ = &members.back().second;
    return true;
  }

  std::vector<Open> open_;
  std::string key_;
  Json* last_ = nullptr;
};

// Python's bare NaN / Infinity may be in the text: a text holding neither word at all has none.
inline bool has_python_floats(std::string_view text) {
  return text.find("NaN") != std::string_view::npos || text.find("Infinity") != std::string_view::npos;
}

// A double for the JSON TorchProbe writes (first_divergence.json, blame): NaN and infinities as the
// strings "nan", "inf", "-inf", which every JSON reader takes (Python's NaN tokens are not JSON).
inline nlohmann::ordered_json num(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

}  // namespace details

// Parses JSON text (with Python's NaN / Infinity / -Infinity); throws JsonSyntaxError.
inline nlohmann::ordered_json parse_json_text(std::string_view text) {
  details::OrderedJsonBuilder builder;
  // Most dumps have no non-finite float: then the text is parsed where it is, without a marked copy.
  if (!details::has_python_floats(text))
    nlohmann::ordered_json::sax_parse(text.begin(), text.end(), &builder);
  else
    nlohmann::ordered_json::sax_parse(details::mark_python_floats(text), &builder);
  return std::move(builder.result);
}

}  // namespace torchprobe::compare

#pragma once
// A step's ranks_digest.bin (io/rank_digest.hpp) made again by `torchprobe recover` from the
// entries it rebuilt out of the step journal (io/journal_reader.hpp), so that a rank that crashed
// has its digest beside its recovered dump.json, with the recovery's note of what it lacks.
// SpanNodes shows the journal's parsed text (json_spans.hpp) to rank_items' walkers.
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>

#include "torchprobe/io/journal_reader.hpp"
#include "torchprobe/io/json_spans.hpp"
#include "torchprobe/io/rank_digest.hpp"

namespace torchprobe::io::recovery::details {

struct SpanNodes {
  using Node = const Value*;
  static bool is_object(Node n) { return n->kind == Value::kObject; }
  static bool is_array(Node n) { return n->kind == Value::kArray; }
  static bool is_string(Node n) { return n->kind == Value::kString; }
  static bool find(Node n, const char* key, Node& out) {
    if (!is_object(n)) return false;
    const Value* v = n->find(key);
    if (!v) return false;
    out = v;
    return true;
  }
  template <class F>
  static void members(Node n, F&& f) {
    for (const auto& [k, v] : n->members) f(unquoted(k), &v);
  }
  template <class F>
  static void elements(Node n, F&& f) {
    for (const auto& m : n->members) f(&m.second);
  }
  // Python's NaN (a literal to json_spans), Infinity and -Infinity too (strtod reads them).
  static bool number(Node n, double& v) {
    if (n->kind == Value::kLiteral && n->raw == "NaN") {
      v = std::numeric_limits<double>::quiet_NaN();
      return true;
    }
    if (n->kind != Value::kNumber) return false;
    const std::string text(n->raw);
    v = std::strtod(text.c_str(), nullptr);
    return true;
  }
  static std::string_view string(Node n) { return unquoted(n->raw); }
  static const char* literal(Node n) { return n->raw == "true" ? "true" : n->raw == "false" ? "false" : "null"; }
  // A key's or a string's text between its quotes (the names and sites of a dump need no unescaping).
  static std::string_view unquoted(std::string_view raw) {
    return raw.size() >= 2 && raw.front() == '"' ? raw.substr(1, raw.size() - 2) : raw;
  }
};

// The digest of recovered entries ({name: body} in dump order), with the note of what is missing.
inline std::string digest_of_recovered(const Assembled& dump, const std::string& missing) {
  io::RankDigestBuilder digest;
  for (const auto& [name, body] : dump.data) {
    const std::string text = name.find('\\') == std::string_view::npos ? std::string(SpanNodes::unquoted(name))
                                                                       : Value{Value::kString, name, {}}.text();
    digest.add<SpanNodes>(text, body);
  }
  digest.set_missing(missing);
  return io::encode_rank_digest(digest.digest());
}

}  // namespace torchprobe::io::recovery::details

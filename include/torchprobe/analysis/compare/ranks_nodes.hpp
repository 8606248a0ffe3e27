#pragma once
// The two readers of a rank's dump.json for `torchprobe ranks`, behind one small interface
// (Nodes::is_object, members, find, ...) so that ranks_table.hpp walks either the same way:
//  - NlohmannNodes: the document as compare's reader gives it (json_reader.hpp: Python's NaN and
//    Infinity, repeated keys, its error messages);
//  - SimdjsonNodes (with TORCHPROBE_HAVE_SIMDJSON): simdjson's DOM (the ranks benchmark at 256
//    ranks: 8.5 s against 57 s through nlohmann documents, one run each); a file it
//    cannot take as it is (NaN, a repeated entry name, invalid JSON) goes to the first.
// Both spell a value the same canonical way (io/rank_items.hpp's canonical()), so that ranks read by
// either compare, and compare with the digests the probe writes (io/rank_digest.hpp).
#include <charconv>
#include <cmath>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "torchprobe/io/rank_items.hpp"

#if defined(TORCHPROBE_HAVE_SIMDJSON)
#include <simdjson.h>
#endif

namespace torchprobe::compare::ranks::details {

using io::rank_items::canonical;
using io::rank_items::NlohmannNodes;

#if defined(TORCHPROBE_HAVE_SIMDJSON)
struct SimdjsonNodes {
  using Node = simdjson::dom::element;
  static bool is_object(Node n) { return n.type() == simdjson::dom::element_type::OBJECT; }
  static bool is_array(Node n) { return n.type() == simdjson::dom::element_type::ARRAY; }
  static bool is_string(Node n) { return n.type() == simdjson::dom::element_type::STRING; }
  static bool find(Node n, const char* key, Node& out) {
    simdjson::dom::object object;
    return n.get(object) == simdjson::SUCCESS && object.at_key(key).get(out) == simdjson::SUCCESS;
  }
  template <class F>
  static void members(Node n, F&& f) {
    simdjson::dom::object object;  // named: GCC 12 warns of a temporary's members in the loop
    if (n.get(object) != simdjson::SUCCESS) return;
    for (const auto field : object) f(field.key, field.value);
  }
  template <class F>
  static void elements(Node n, F&& f) {
    simdjson::dom::array array;
    if (n.get(array) != simdjson::SUCCESS) return;
    for (const auto e : array) f(e);
  }
  static bool number(Node n, double& v) {
    switch (n.type()) {
      case simdjson::dom::element_type::DOUBLE: v = n.get_double().value_unsafe(); return true;
      case simdjson::dom::element_type::INT64: v = static_cast<double>(n.get_int64().value_unsafe()); return true;
      case simdjson::dom::element_type::UINT64: v = static_cast<double>(n.get_uint64().value_unsafe()); return true;
      default: return false;
    }
  }
  static std::string_view string(Node n) { return n.get_string().value_unsafe(); }
  static const char* literal(Node n) { return n.is_null() ? "null" : n.get_bool().value_unsafe() ? "true" : "false"; }
};
#endif

}  // namespace torchprobe::compare::ranks::details

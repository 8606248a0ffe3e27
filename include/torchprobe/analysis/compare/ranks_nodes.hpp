#pragma once
// The two readers of a rank's dump.json for `torchprobe ranks`, behind one small interface
// (Nodes::is_object, members, find, ...) so that ranks_table.hpp walks either the same way:
//  - NlohmannNodes: the document as compare's reader gives it (json_reader.hpp: Python's NaN and
//    Infinity, repeated keys, its error messages);
//  - SimdjsonNodes (with TORCHPROBE_HAVE_SIMDJSON): simdjson's DOM (the ranks benchmark at 256
//    ranks: 8.5 s against 57 s through nlohmann documents, one run each); a file it
//    cannot take as it is (NaN, a repeated entry name, invalid JSON) goes to the first.
// Both spell a value the same canonical way (canonical()), so that ranks read by either compare.
#include <charconv>
#include <cmath>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#if defined(TORCHPROBE_HAVE_SIMDJSON)
#include <simdjson.h>
#endif

namespace torchprobe::compare::ranks::details {

struct NlohmannNodes {
  using Node = const nlohmann::ordered_json*;
  static bool is_object(Node n) { return n->is_object(); }
  static bool is_array(Node n) { return n->is_array(); }
  static bool is_string(Node n) { return n->is_string(); }
  static bool find(Node n, const char* key, Node& out) {
    const auto it = n->find(key);
    if (it == n->end()) return false;
    out = &*it;
    return true;
  }
  template <class F>
  static void members(Node n, F&& f) {
    for (auto it = n->begin(); it != n->end(); ++it) f(std::string_view(it.key()), &it.value());
  }
  template <class F>
  static void elements(Node n, F&& f) {
    for (const auto& e : *n) f(&e);
  }
  static bool number(Node n, double& v) {
    if (!n->is_number()) return false;
    v = n->get<double>();
    return true;
  }
  static std::string_view string(Node n) { return n->get_ref<const std::string&>(); }
  static const char* literal(Node n) { return n->is_null() ? "null" : n->get<bool>() ? "true" : "false"; }
};

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

// A value spelled the same by both readers: numbers as doubles (17 digits, "nan", "inf"), strings
// quoted raw, arrays and objects compact ("[4,8]" for a shape).
template <class Nodes>
void canonical(typename Nodes::Node n, std::string& out) {
  double v = 0;
  if (Nodes::number(n, v)) {
    if (std::isnan(v)) {
      out += "nan";
    } else {
      char buf[32];
      out.append(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
    }
  } else if (Nodes::is_string(n)) {
    out += '"';
    out += Nodes::string(n);
    out += '"';
  } else if (Nodes::is_array(n)) {
    out += '[';
    bool first = true;
    Nodes::elements(n, [&](typename Nodes::Node e) {
      if (!first) out += ',';
      first = false;
      canonical<Nodes>(e, out);
    });
    out += ']';
  } else if (Nodes::is_object(n)) {
    out += '{';
    bool first = true;
    Nodes::members(n, [&](std::string_view k, typename Nodes::Node e) {
      if (!first) out += ',';
      first = false;
      out += '"';
      out += k;
      out += "\":";
      canonical<Nodes>(e, out);
    });
    out += '}';
  } else {
    out += Nodes::literal(n);
  }
}

}  // namespace torchprobe::compare::ranks::details

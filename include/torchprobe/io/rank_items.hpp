#pragma once
// What the cross-rank view (`torchprobe ranks`, analysis/compare/ranks.hpp) reads of a dump.json
// entry, written once for both places that read it: the view, from the dump.json files, and the
// probe, which writes the same facts beside them at dump time (io/rank_digest.hpp). Walkers over
// a small node interface (Nodes::is_object, members, find, ...) so that any JSON reader serves:
// NlohmannNodes here; compare adds simdjson's (analysis/compare/ranks_nodes.hpp).
//  - an entry's tensor items the view compares ("input_args.0", "parameters.weight", "weight.0"),
//    each a 64-bit hash of its statistics spelled canonically (a NaN equals a NaN);
//  - the first tensor of a rank whose Max or Min is not finite, and what it tells of its origin.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace torchprobe::io::rank_items {

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

// A value spelled the same by every reader: numbers as doubles (shortest round trip, "nan", "inf"),
// strings quoted raw, arrays and objects compact ("[4,8]" for a shape).
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

// Strings numbered in the order they are first seen, each stored once (a digest's string table, the
// names, sites and shapes of the ranks of a step).
class Interner {
 public:
  std::uint32_t id(std::string_view s) {
    const auto it = ids_.find(std::string(s));
    if (it != ids_.end()) return it->second;
    strings_.emplace_back(s);
    return ids_.emplace(strings_.back(), static_cast<std::uint32_t>(strings_.size() - 1)).first->second;
  }
  const std::string& text(std::uint32_t id) const { return strings_[id]; }
  std::size_t size() const { return strings_.size(); }
  const std::vector<std::string>& texts() const { return strings_; }

 private:
  std::unordered_map<std::string, std::uint32_t> ids_;
  std::vector<std::string> strings_;
};

// 64-bit FNV-1a: a hash whose value is fixed by its definition, so that files written by one
// process (the digests) compare with what another computes.
inline std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 14695981039346656037ull;
  for (const char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

template <class Nodes>
bool is_tensor_item(typename Nodes::Node v) {
  typename Nodes::Node x;
  return Nodes::is_object(v) && (Nodes::find(v, "Max", x) || Nodes::find(v, "md5", x)) && Nodes::find(v, "shape", x);
}

// The tensor items of a value, as ("input_args.0", item) in dump order.
template <class Nodes>
void tensor_items(typename Nodes::Node v, const std::string& site,
                  std::vector<std::pair<std::string, typename Nodes::Node>>& out) {
  if (is_tensor_item<Nodes>(v)) {
    out.emplace_back(site, v);
  } else if (Nodes::is_array(v)) {
    std::size_t i = 0;
    Nodes::elements(v, [&](typename Nodes::Node e) { tensor_items<Nodes>(e, site + "." + std::to_string(i++), out); });
  } else if (Nodes::is_object(v)) {
    Nodes::members(v, [&](std::string_view k, typename Nodes::Node e) {
      tensor_items<Nodes>(e, site + "." + std::string(k), out);
    });
  }
}

inline bool is_parameters_grad(std::string_view entry) { return entry.find(".parameters_grad.") != std::string::npos; }
inline bool is_collective(std::string_view entry) { return entry.rfind("Distributed.", 0) == 0; }

// Which sections of an entry the view reads.
enum class Sections {
  All,         // inputs, outputs and module parameters (the view over dump.json)
  Replicated,  // what a data-parallel job holds the same on every rank, and collectives (the digest)
};

// The tensor items of one entry the view looks at: inputs, outputs and module parameters; a
// parameters_grad entry's gradients ({"weight": [grad], ...}: "weight.0"). With
// Sections::Replicated, only a module's parameters, a collective's inputs and outputs and the
// gradients (replicated or not, the view decides) are kept.
template <class Nodes>
void entry_items(std::string_view entry, typename Nodes::Node e,
                 std::vector<std::pair<std::string, typename Nodes::Node>>& items, Sections which = Sections::All) {
  if (!Nodes::is_object(e)) return;
  const bool everything = which == Sections::All || is_collective(entry);
  typename Nodes::Node part;
  for (const char* section : {"input_args", "input_kwargs", "output", "parameters"})
    if ((everything || section[0] == 'p') && Nodes::find(e, section, part)) tensor_items<Nodes>(part, section, items);
  if (is_parameters_grad(entry))
    Nodes::members(e,
                   [&](std::string_view k, typename Nodes::Node v) { tensor_items<Nodes>(v, std::string(k), items); });
}

// A hash of an item's statistics (dtype, shape, Max, Min, Mean, Norm, md5) in their canonical
// spelling; `key` is scratch space.
template <class Nodes>
std::uint64_t stats_hash(typename Nodes::Node item, std::string& key) {
  key.clear();
  typename Nodes::Node v;
  for (const char* k : {"dtype", "shape", "Max", "Min", "Mean", "Norm", "md5"}) {
    if (!Nodes::find(item, k, v)) continue;
    key += k;
    key += '=';
    canonical<Nodes>(v, key);
    key += ';';
  }
  return fnv1a(key);
}

// An item's shape spelled canonically ("[8,64]"; "null" without one).
template <class Nodes>
std::string shape_text(typename Nodes::Node item) {
  std::string s;
  typename Nodes::Node shape;
  if (Nodes::find(item, "shape", shape)) canonical<Nodes>(shape, s);
  return s.empty() ? "null" : s;
}

// Whether n holds a tensor item (an item has "type" and "Max") whose Max or Min is not finite;
// `path` ("input_args") gets the first one's place appended (".0.key"). Runs over every entry of a
// rank until one is found, so the path is only extended along the way, never copied.
template <class Nodes>
bool first_nonfinite_item(typename Nodes::Node n, std::string& path) {
  typename Nodes::Node max, min, type;
  if (Nodes::is_object(n) && Nodes::find(n, "Max", max) && Nodes::find(n, "type", type)) {
    double v = 0;
    return (Nodes::number(max, v) && !std::isfinite(v)) ||
           (Nodes::find(n, "Min", min) && Nodes::number(min, v) && !std::isfinite(v));
  }
  bool found = false;
  const std::size_t at = path.size();
  const auto visit = [&](std::string_view key, typename Nodes::Node e) {
    if (found) return;
    path.append(".").append(key);
    found = first_nonfinite_item<Nodes>(e, path);
    if (!found) path.resize(at);
  };
  if (Nodes::is_array(n)) {
    std::size_t i = 0;
    Nodes::elements(n, [&](typename Nodes::Node e) { visit(std::to_string(i++), e); });
  } else if (Nodes::is_object(n)) {
    Nodes::members(n, visit);
  }
  return found;
}

// A rank's first tensor with a non-finite Max or Min, and what the view needs to find its origin.
struct RankFirst {
  std::string entry, item;
  long clock = 0;  // collective entries before it on that rank
  bool received = false, inputs_finite = true;
};

// Is this member of an entry on its input side? (parameters_grad's "weight" is a result.)
inline bool input_side(std::string_view member) {
  return member == "input_args" || member == "input_kwargs" || member == "input" || member == "parameters";
}

// Ends the walk of one entry: `input` and `output` are the first non-finite item on each side ("" none).
inline bool nonfinite_found(std::string_view name, std::string&& input, std::string&& output, RankFirst& f) {
  const bool collective = is_collective(name);
  if (input.empty() && output.empty()) {
    f.clock += collective;
    return false;
  }
  f.entry = std::string(name);
  f.inputs_finite = input.empty();
  f.item = input.empty() ? std::move(output) : std::move(input);
  f.received = collective && f.inputs_finite;
  return true;
}

// The first non-finite tensor of each side of an entry's members ("input_args.0"; left as they are
// where a side has none yet).
template <class Nodes>
void nonfinite_sides(typename Nodes::Node e, std::string& input, std::string& output) {
  if (!Nodes::is_object(e)) return;
  std::string path;
  Nodes::members(e, [&](std::string_view k, typename Nodes::Node part) {
    std::string& side = input_side(k) ? input : output;
    if (!side.empty()) return;
    path.assign(k);
    if (first_nonfinite_item<Nodes>(part, path)) side = path;
  });
}

// The place of one entry in a rank's walk for its first non-finite tensor: call for each entry in
// dump order until it returns true.
template <class Nodes>
bool nonfinite_in_entry(std::string_view name, typename Nodes::Node e, RankFirst& f) {
  std::string input, output;
  nonfinite_sides<Nodes>(e, input, output);
  return nonfinite_found(name, std::move(input), std::move(output), f);
}

}  // namespace torchprobe::io::rank_items

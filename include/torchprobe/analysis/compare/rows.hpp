#pragma once
// A dump's entries flattened into msprobe's compare rows: one row per tensor/scalar leaf, named
// `{entry}.{input|output|parameters}.{index path}` (parameters_grad rows `{entry}.{param}`), in the
// order input, parameters, output, parameters_grad within an entry (msprobe's op_item_parse,
// gen_op_item, reorder_index), with the compare key in which backward call numbers are recounted
// by order of appearance (ProcessDf.update_backward_call).
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <unordered_map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "torchprobe/core/stat_tolerance.hpp"
#include "torchprobe/analysis/compare/dump_reader.hpp"
#include "torchprobe/analysis/compare/python_text.hpp"
#include "torchprobe/analysis/compare/row.hpp"
#include "torchprobe/analysis/compare/text_store.hpp"

namespace torchprobe::compare {

// A dump's rows with the text they refer to.
struct RowSet {
  std::vector<Row> rows;
  TextStore text;
};

// msprobe's float class of dtypes: fp16, bf16 and fp32 compare with each other.
using torchprobe::float_dtype;

namespace details {

inline std::vector<std::string> split_dots(std::string_view s) {
  std::vector<std::string> parts(1);
  for (const char c : s) {
    if (c == '.')
      parts.emplace_back();
    else
      parts.back() += c;
  }
  return parts;
}

inline std::string crc32_hex(const std::string& s) {
  const auto crc = ::crc32(0L, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(s.size()));
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08lx", static_cast<unsigned long>(crc));
  return buf;
}

// msprobe's set_summary: a value whose str() is "nan" in any case becomes the string "Nan".
inline Json summary_cell(const Json& v) {
  if (v.is_null()) return "None";
  if (v.is_number_float()) return std::isnan(v.get<double>()) ? Json("Nan") : v;  // no str() of each number
  if (v.is_number() || v.is_boolean()) return v;
  const std::string s = py_str(v);
  if (s == "nan" || s == "NaN" || s == "Nan" || s == "NAN") return "Nan";
  return v;
}

// The JSON trees rows are made from: nlohmann's (Node = `const Json*`), and simdjson's DOM elements
// (dump_rows_reader.hpp specializes NodeOps for them). A node gives: its type as nlohmann names it,
// a string's text, str() of it as Python prints it, its value as a table cell, its size, its
// members and items in order, and a member by key (a node for which found() is false if none).
using JsonType = nlohmann::detail::value_t;
template <class Node>
struct NodeOps;

template <>
struct NodeOps<const Json*> {
  static JsonType type(const Json* n) { return n->type(); }
  static std::string_view string(const Json* n) { return n->get_ref<const std::string&>(); }
  static std::string py_text(const Json* n) { return py_str(*n); }
  static Json cell(const Json* n) { return *n; }
  static std::size_t size(const Json* n) { return n->size(); }
  template <class F>
  static void members(const Json* n, F&& f) {
    for (auto it = n->begin(); it != n->end(); ++it) f(std::string_view(it.key()), &it.value());
  }
  template <class F>
  static void items(const Json* n, F&& f) {
    for (const Json& item : *n) f(&item);
  }
  static const Json* find(const Json* n, const char* key) {
    const auto it = n->find(key);
    return it == n->end() ? nullptr : &*it;
  }
  static bool found(const Json* n) { return n != nullptr; }
};

// str(type(value)) in Python, for the value's JSON type. (A std::map keyed by nlohmann's value_t
// gave floats "<class 'int'>": value_t's operator< ranks the three number types equal.)
inline const char* python_class_name(JsonType t) {
  switch (t) {
    case JsonType::null: return "<class 'NoneType'>";
    case JsonType::boolean: return "<class 'bool'>";
    case JsonType::number_integer:
    case JsonType::number_unsigned: return "<class 'int'>";
    case JsonType::number_float: return "<class 'float'>";
    case JsonType::string: return "<class 'str'>";
    case JsonType::array: return "<class 'list'>";
    case JsonType::object: return "<class 'dict'>";
    default: return "<class 'object'>";
  }
}

// nlohmann's empty(): null, and arrays and objects without elements.
template <class Node>
bool node_empty(const Node& n) {
  using Ops = NodeOps<Node>;
  const JsonType t = Ops::type(n);
  return t == JsonType::null || ((t == JsonType::array || t == JsonType::object) && Ops::size(n) == 0);
}

template <class Node>
Row leaf_row(const Node& item, const std::string& op_name, Row::Place place, TextStore& store) {
  using Ops = NodeOps<Node>;
  Row r;
  r.place = place;
  // The keys read, found in one pass over the item's members (a find() per key scanned them each).
  enum Key { kMax, kMin, kMean, kNorm, kDataName, kRequiresGrad, kDtype, kType, kValue, kShape, kMd5, kKeys };
  static const char* const kNames[kKeys] = {"Max",   "Min",  "Mean",  "Norm",  "data_name", "requires_grad",
                                            "dtype", "type", "value", "shape", "md5"};
  Node found[kKeys] = {};
  bool has[kKeys] = {};
  Ops::members(item, [&](std::string_view k, const Node& v) {
    for (int i = 0; i < kKeys; ++i) {
      // the first letter rules out nearly every name before a comparison
      if (!k.empty() && k[0] == kNames[i][0] && k == kNames[i]) {
        found[i] = v;
        has[i] = true;
        break;
      }
    }
  });
  const auto type_of = [&](int k) { return has[k] ? Ops::type(found[k]) : JsonType::null; };
  const auto cell = [&](int k) { return has[k] ? Ops::cell(found[k]) : Json(); };
  const auto text = [&](int k) { return has[k] ? Ops::py_text(found[k]) : std::string("None"); };
  const auto string = [&](int k) { return Ops::string(found[k]); };  // when type_of(k) is string
  if (type_of(kDataName) == JsonType::string && !string(kDataName).empty())
    r.set_data_name(store.keep(string(kDataName)), store);
  const std::string_view data_name = r.data_name();
  r.name = data_name != "-1" ? data_name.substr(0, data_name.rfind('.')) : store.keep(op_name);
  if (type_of(kRequiresGrad) != JsonType::null) r.requires_grad = TextRef(store.intern(text(kRequiresGrad)), store);
  std::array<Json, 4> stats;
  for (int i = 0; i < 4; ++i) stats[i] = cell(kMax + i);
  const JsonType dtype = type_of(kDtype);
  const bool has_dtype = !(dtype == JsonType::null || (dtype == JsonType::string && string(kDtype).empty()) ||
                           (dtype == JsonType::boolean && !cell(kDtype).template get<bool>()));
  const std::string type = type_of(kType) == JsonType::string ? std::string(string(kType)) : "";
  const JsonType value = type_of(kValue);
  if (has_dtype) {
    r.dtype = TextRef(store.intern(text(kDtype)), store);
    r.shape = TextRef(store.intern(text(kShape)), store);
  } else if (type == "torch.Size") {
    r.dtype = TextRef(store.intern(type), store);
    r.shape = TextRef(store.intern(text(kValue)), store);
  } else if (type == "slice") {
    r.dtype = TextRef(store.intern(type), store);
    r.shape = TextRef(
        store.intern("(" + std::to_string(value == JsonType::array ? Ops::size(found[kValue]) : 0) + ",)"), store);
  } else if (type == "ellipsis") {
    r.dtype = TextRef(store.intern(type), store);
    r.shape = "[]";
    for (auto& s : stats) s = cell(kValue);
  } else {
    r.dtype = python_class_name(value);
    r.shape = "[]";
    for (auto& s : stats) s = cell(kValue);
  }
  for (auto& s : stats) s = summary_cell(s);
  r.set_stats(stats, store);
  static const std::string kEmptyCrc = crc32_hex("");
  r.md5 = TextRef(type_of(kMd5) == JsonType::string && !string(kMd5).empty() ? store.keep(string(kMd5))
                  : has[kValue]                                              ? store.keep(crc32_hex(text(kValue)))
                                                                             : std::string_view(kEmptyCrc),
                  store);
  return r;
}

// msprobe's op_item_parse.
inline bool names_parameters_grad(std::string_view name) {
  constexpr std::string_view kPart = "parameters_grad";
  for (std::size_t at = name.find(kPart); at != std::string_view::npos; at = name.find(kPart, at + 1)) {
    const std::size_t end = at + kPart.size();
    if ((at == 0 || name[at - 1] == '.') && (end == name.size() || name[end] == '.')) return true;
  }
  return false;
}

// `grads`: op_name has a "parameters_grad" component (list items then keep the name). `op_name` is
// the item's name, grown in place for the items inside and given back as it came (a string made per
// item and level cost an allocation per row).
template <class Node>
void parse_items(const Node& data, std::string& op_name, Row::Place place, int depth, std::vector<Row>& out, bool grads,
                 TextStore& store) {
  using Ops = NodeOps<Node>;
  if (depth > 50) throw InputError("entry " + op_name + " nests deeper than 50 levels");
  if (Ops::type(data) == JsonType::null) {
    Row r;
    r.name = store.keep(op_name);
    r.place = place;
    r.dtype = r.shape = "None";
    static const std::array<Json, 4> kNone = {"None", "None", "None", "None"};
    r.set_stats(kNone, store);
    out.push_back(std::move(r));
    return;
  }
  if (node_empty(data)) return;
  if (Ops::type(data) == JsonType::array) {
    std::size_t i = 0;
    const std::size_t length = op_name.size();
    Ops::items(data, [&](const Node& item) {
      if (!grads) op_name.append(1, '.').append(std::to_string(i));
      parse_items(item, op_name, place, depth + 1, out, grads, store);
      op_name.resize(length);
      ++i;
    });
  } else if (Ops::type(data) == JsonType::object) {
    const Node type = Ops::find(data, "type");
    if (Ops::found(type) && Ops::type(type) == JsonType::string) {
      out.push_back(leaf_row(data, op_name, place, store));
      return;
    }
    const std::size_t length = op_name.size();
    Ops::members(data, [&](std::string_view key, const Node& v) {
      op_name.append(1, '.').append(key);
      parse_items(v, op_name, place, depth + 1, out, grads || names_parameters_grad(key), store);
      op_name.resize(length);
    });
  }
}

}  // namespace details

// Makes the rows of a dump entry by entry, in dump order: msprobe's order within an entry, and the
// compare keys, whose backward call numbers count the entries seen before. The fast reader
// (dump_rows_reader.hpp) feeds it one entry at a time, so that no whole dump is held as JSON nodes.
class RowMaker {
 public:
  // The rows' texts are kept in `store`.
  RowMaker(const Dump& d, TextStore& store) : dump_(d), store_(store) {}

  // Appends the rows of entry `op_name` (the entry's position in dump order is counted here); `op`
  // is the entry's node (rows.hpp's node functions: a `const Json*`, or a simdjson DOM element).
  template <class Node>
  void add(const std::string& op_name, const Node& op, std::vector<Row>& rows) {
    const std::size_t index = index_++;
    // The name's last two dot-separated parts, and what comes before each (msprobe splits on dots).
    const std::size_t last_dot = op_name.rfind('.');
    const std::string_view name(op_name);
    const std::string_view last = last_dot == std::string::npos ? name : name.substr(last_dot + 1);
    const std::size_t second_dot =
        last_dot == std::string::npos || last_dot == 0 ? std::string::npos : op_name.rfind('.', last_dot - 1);
    const std::string_view second = last_dot == std::string::npos ? std::string_view()
                                    : second_dot == std::string::npos
                                        ? name.substr(0, last_dot)
                                        : name.substr(second_dot + 1, last_dot - second_dot - 1);
    const std::size_t parts = static_cast<std::size_t>(std::count(op_name.begin(), op_name.end(), '.')) + 1;
    std::vector<Row>& items = items_;  // kept between entries: its room is reused
    items.clear();
    if (last == "parameters_grad" || second == "parameters_grad") {
      item_name_ = op_name;
      details::parse_items(op, item_name_, Row::kParametersGrad, 0, items, true, store_);
    } else {
      const bool grads_name = details::names_parameters_grad(op_name);
      struct Io {
        const char* key;
        const char* state;
        Row::Place place;
      };
      static const Io kIo[] = {{"input_args", "input", Row::kInput},
                               {"input_kwargs", "input", Row::kInput},
                               {"input", "input", Row::kInput},
                               {"output", "output", Row::kOutput},
                               {"parameters", "parameters", Row::kParameters}};
      for (const Io& io : kIo) {
        const Node item = details::NodeOps<Node>::find(op, io.key);
        if (!details::NodeOps<Node>::found(item)) continue;
        item_name_.assign(op_name).append(1, '.').append(io.state);
        details::parse_items(item, item_name_, io.place, 0, items, grads_name, store_);
      }
    }
    // split_data_name_components: entries named neither ...forward/backward[.N] nor parameters_grad
    // are skipped by msprobe.
    // (Views of the name: these were four strings made per entry.)
    std::string_view stem, call, direction;
    if (last == "parameters_grad" || second == "parameters_grad") {
      stem = last_dot == std::string::npos ? std::string_view() : name.substr(0, last_dot);
      direction = "parameters_grad";
    } else if (last == "forward" || second == "forward" || last == "backward" || second == "backward") {
      direction = (last == "forward" || second == "forward") ? "forward" : "backward";
      if (parts > 2) {
        stem = name.substr(0, second_dot);
        call = name.substr(second_dot + 1);  // second "." last
      }
    }
    if (stem.empty()) return;
    int order = 0;  // counted even for an entry without rows, as msprobe does
    if (direction == "backward") {
      auto counted = backward_count_.find(stem);
      if (counted == backward_count_.end()) counted = backward_count_.emplace(store_.keep(stem), 0).first;
      order = counted->second++;
    }
    if (items.empty()) return;
    const auto is_digits = [](std::string_view s) {
      return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
    };
    std::string new_call(call);
    if (direction == "backward" && (is_digits(second) || is_digits(last))) {
      new_call = (is_digits(second) ? std::to_string(order) : std::string(second)) + "." +
                 (is_digits(last) ? std::to_string(order) : std::string(last));
    }
    // reorder_index: inputs (and anything else), parameters, outputs, parameters_grad.
    const std::string_view entry = store_.keep(op_name);
    const std::string_view entry_key =
        new_call == call ? entry : store_.keep(std::string(stem).append(1, '.').append(new_call));
    const RowEntry* owner = store_.own(RowEntry{entry, entry_key, index});
    bool first = true;
    for (int p = 0; p < 4; ++p) {
      for (std::size_t k = 0; k < items.size(); ++k) {
        if (items[k].place != p) continue;
        Row& r = items[k];
        r.set_entry(owner);
        if (new_call == call) {
          r.key = TextRef(r.name, store_);
        } else {
          std::string suffix(r.name);  // full name with every occurrence of the entry name removed
          for (std::size_t pos; (pos = suffix.find(op_name)) != std::string::npos;) suffix.erase(pos, op_name.size());
          r.key = TextRef(store_.keep(std::string(entry_key) + suffix), store_);
        }
        if (first && dump_.has_stack_file) {
          const auto s = dump_.stacks.find(op_name);
          if (s != dump_.stacks.end() && !s->second.is_null()) r.set_stack(store_.keep(py_str(s->second)), store_);
        }
        first = false;
        rows.push_back(std::move(r));
      }
    }
  }

 private:
  const Dump& dump_;
  TextStore& store_;
  std::unordered_map<std::string_view, int> backward_count_;  // keys kept in store_
  std::vector<Row> items_;
  std::string item_name_;  // the name parse_items grows, kept between entries: its room is reused
  std::size_t index_ = 0;
};

// The rows of one dump, in msprobe's order, with their compare keys.
inline RowSet dump_rows(const Dump& d) {
  RowSet out;
  RowMaker maker(d, out.text);
  for (auto it = d.data.begin(); it != d.data.end(); ++it) maker.add(it.key(), &it.value(), out.rows);
  return out;
}

}  // namespace torchprobe::compare

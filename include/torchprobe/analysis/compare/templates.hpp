#pragma once
// The built-in Python API <-> ATen templates (matching.hpp's pass 4, module_alignment.hpp's items):
// canonical names, Aten.t + Aten.addmm (or t + matmul + add_) grouped as one "linear", the row
// links of a template pair, and the keys the passes compare.
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "torchprobe/analysis/compare/entries.hpp"

namespace torchprobe::compare {

namespace detail {

// "Tensor.__mul__.3.forward" -> {"Tensor", "mul", "forward"}; modules and odd names give {}.
inline std::tuple<std::string, std::string, std::string> api_parts(const Entry& e) {
  const auto p = split_dots(e.name);
  if (e.is_module() || p.size() != 4) return {};
  std::string api = p[1];
  if (api.size() > 4 && api.rfind("__", 0) == 0 && api.compare(api.size() - 2, 2, "__") == 0)
    api = api.substr(2, api.size() - 4);
  if (api == "truediv") api = "div";
  return {p[0], api, p[3]};
}

// The ATen name a Python API lowers to (the same name when not listed).
inline std::string aten_name(const std::string& api) {
  static const std::map<std::string, std::string> kMap = {
      {"conv1d", "convolution"},           {"conv2d", "convolution"}, {"conv3d", "convolution"},
      {"layer_norm", "native_layer_norm"}, {"softmax", "_softmax"},   {"log_softmax", "_log_softmax"},
      {"dropout", "native_dropout"}};
  const auto it = kMap.find(api);
  return it == kMap.end() ? api : it->second;
}

// One item of a side's sequence of unpaired API calls, under its canonical (ATen) name.
struct Item {
  std::string canon, direction;
  std::vector<const Entry*> members;
  bool aten = false;
};

// Groups one side's unpaired entries into canonical items: on the ATen side t+addmm and
// t+matmul+add_ become one "linear"; in backward the last op of such a group (addmm, add_) stands
// for the linear, and the backward entries of the other members join its item.
inline std::vector<Item> canonical_items(const std::vector<const Entry*>& entries) {
  std::vector<Item> items;
  const auto stem = [](const Entry* e) {
    const auto parts = split_dots(e->name);
    return parts[0] + "." + parts[1] + "." + parts[2];
  };
  std::map<std::string, std::size_t> group_of;             // "Aten.t.N" -> forward group number
  std::map<std::size_t, std::string> lead_of;              // group -> its last op, "Aten.addmm.N"
  std::map<std::size_t, std::size_t> backward_item;        // group -> index in items
  std::map<std::size_t, std::vector<const Entry*>> early;  // members' backward before the lead's
  std::size_t groups = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto [prefix, api, dir] = api_parts(*entries[i]);
    if (prefix.empty()) continue;
    Item it{api, dir, {entries[i]}, prefix == "Aten"};
    if (prefix != "Aten") {
      it.canon = aten_name(api);
    } else if (api == "t" && dir == "forward" && i + 1 < entries.size()) {
      std::size_t n = 0;
      const auto [p1, a1, d1] = api_parts(*entries[i + 1]);
      if (p1 == "Aten" && a1 == "addmm" && d1 == "forward") {
        n = 2;
      } else if (p1 == "Aten" && a1 == "matmul" && d1 == "forward" && i + 2 < entries.size()) {
        const auto [p2, a2, d2] = api_parts(*entries[i + 2]);
        if (p2 == "Aten" && a2 == "add_" && d2 == "forward") n = 3;
      }
      if (n) {
        it = Item{"linear", dir, {}, true};
        for (std::size_t k = 0; k < n; ++k) {
          it.members.push_back(entries[i + k]);
          group_of[stem(entries[i + k])] = groups;
        }
        lead_of[groups++] = stem(entries[i + n - 1]);
        i += n - 1;
      }
    } else if (dir == "backward" && group_of.count(stem(entries[i]))) {
      const std::size_t g = group_of[stem(entries[i])];
      if (lead_of[g] != stem(entries[i])) {  // a member other than the lead joins the lead's item
        if (backward_item.count(g))
          items[backward_item[g]].members.push_back(entries[i]);
        else
          early[g].push_back(entries[i]);
        continue;
      }
      it.canon = "linear";
      for (const Entry* e : early[g]) it.members.push_back(e);
      backward_item[g] = items.size();
    }
    items.push_back(std::move(it));
  }
  return items;
}

// What an item's first output looks like: shape and dtype class (bf16 and fp16 count as float).
constexpr std::size_t kLookahead = 8;
inline std::string signature(const Item& it) {
  const Entry* e = it.direction == "forward" ? it.members.back() : it.members.front();
  for (const Row* r : e->rows) {
    if (!r->is_output()) continue;
    return (float_dtype(r->dtype) ? std::string("float") : r->dtype) + r->shape;
  }
  return "";
}

// Row links between a Python item and an ATen item of the same canonical name.
inline std::vector<RowLink> template_links(const Item& py, const Item& at, bool py_is_target) {
  std::vector<RowLink> links;
  const auto link = [&](const std::string& py_suffix, std::size_t member, const std::string& at_suffix, bool tr) {
    const Row* p = py.members[0]->row(py_suffix);
    const Row* a = member < at.members.size() ? at.members[member]->row(at_suffix) : nullptr;
    if (p && a) links.push_back(py_is_target ? RowLink{p, a, tr} : RowLink{a, p, tr});
  };
  if (py.canon == "linear" && py.direction == "forward" && at.members.size() == 2) {  // t, addmm(b, x, W^T)
    link(".input.0", 1, ".input.1", false);
    link(".input.1", 0, ".input.0", false);
    link(".input.2", 1, ".input.0", false);
    link(".output.0", 1, ".output.0", false);
  } else if (py.canon == "linear" && py.direction == "forward" && at.members.size() == 3) {  // t, matmul, add_
    link(".input.0", 1, ".input.0", false);
    link(".input.1", 0, ".input.0", false);
    link(".input.2", 2, ".input.1", false);
    link(".output.0", 2, ".output.0", false);
  } else {  // same argument positions
    for (const Row* r : py.members[0]->rows) link(py.members[0]->suffix(*r), 0, py.members[0]->suffix(*r), false);
  }
  return links;
}

inline std::vector<RowLink> same_suffix_links(const Entry& t, const Entry& b) {
  std::vector<RowLink> links;
  for (const Row* r : t.rows) {
    if (const Row* g = b.row(t.suffix(*r))) links.push_back({r, g, false});
  }
  return links;
}

inline std::string value_key(const Entry& e) {
  for (const Row* r : e.rows) {
    if (r->is_output())
      return e.direction + "|" + r->dtype + "|" + r->shape + "|" + py_str(r->stats[0]) + "|" + py_str(r->stats[1]) +
             "|" + py_str(r->stats[2]) + "|" + py_str(r->stats[3]) + "|" + r->md5;
  }
  return "";
}

}  // namespace detail

}  // namespace torchprobe::compare

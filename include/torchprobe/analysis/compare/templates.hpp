#pragma once
// The built-in Python API <-> ATen templates (matching.hpp's pass 4, module_alignment.hpp's items):
// canonical names, Aten.t + Aten.addmm (or t + matmul + add_) grouped as one "linear", the row
// links of a template pair, and the keys the passes compare.
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "torchprobe/analysis/compare/argument_maps.hpp"
#include "torchprobe/analysis/compare/entries.hpp"

namespace torchprobe::compare {

namespace details {

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
    Item it{canonical_api(api), dir, {entries[i]}, prefix == "Aten"};
    if (prefix != "Aten") {
    } else if (api == "t" && dir == "forward" && i + 1 < entries.size()) {
      std::size_t n = 0;
      const auto [p1, a1, d1] = api_parts(*entries[i + 1]);
      if (p1 == "Aten" && a1 == "addmm" && d1 == "forward") {
        n = 2;
      } else if (p1 == "Aten" && a1 == "matmul" && d1 == "forward") {
        n = 2;  // linear without a bias on a batch: t + matmul
        if (i + 2 < entries.size()) {
          const auto [p2, a2, d2] = api_parts(*entries[i + 2]);
          if (p2 == "Aten" && a2 == "add_" && d2 == "forward") n = 3;
        }
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
  const Row* r = e->first_output();
  return r ? std::string(float_dtype(r->dtype) ? std::string_view("float") : r->dtype.view()) + std::string(r->shape)
           : "";
}

// The number of elements of a shape as the dumps write it ("[4, 3]": 12; not a shape: -1).
inline long long shape_numel(std::string_view shape) {
  if (shape.size() < 2 || shape.front() != '[') return -1;
  long long n = 1, cur = 0;
  bool digits = false;
  for (char c : shape.substr(1)) {
    if (c >= '0' && c <= '9') {
      cur = cur * 10 + (c - '0');
      digits = true;
    } else if (c == ',' || c == ']') {
      if (digits) n *= cur;
      cur = 0;
      digits = false;
    }
  }
  return n;
}

// The same integer elements, flattened to 1-D on one side (indices C++'s embedding_bag flattens):
// compared by their statistics. Never for floats, whose permutations a shape is the only sign of.
inline bool flattened(const Row& a, const Row& b) {
  const auto flat = [](std::string_view s) { return s.find(',') == std::string_view::npos; };
  const bool integer = a.dtype == b.dtype && a.dtype.rfind("torch.int", 0) == 0;
  return integer && !a.is_output() && a.shape != b.shape && flat(a.shape) != flat(b.shape) &&
         shape_numel(a.shape) > 0 && shape_numel(a.shape) == shape_numel(b.shape);
}

// Row links between a Python item and an ATen item of the same canonical name (argument_maps.hpp).
inline std::vector<RowLink> template_links(const Item& py, const Item& at, bool py_is_target) {
  std::vector<RowLink> links;
  const auto link = [&](std::string_view py_suffix, std::size_t member, std::string_view at_suffix, bool tr) {
    const Row* p = py.members[0]->row(py_suffix);
    const Row* a = member < at.members.size() ? at.members[member]->row(at_suffix) : nullptr;
    if (!p || !a) return;
    // A tensor against a non-tensor: an argument one side left None and the other filled with a
    // default (C++'s embedding_bag builds the offsets Python passes as None). Nothing to compare.
    if ((p->dtype.rfind("torch.", 0) == 0) != (a->dtype.rfind("torch.", 0) == 0)) return;
    RowLink l = py_is_target ? RowLink{p, a, tr} : RowLink{a, p, tr};
    l.reshaped = !tr && flattened(*p, *a);
    links.push_back(l);
  };
  const Entry& pe = *py.members[0];
  const bool forward = py.direction == "forward";
  const bool linear_group = py.canon == "linear" && at.members.size() > 1;
  if (linear_group && forward && at.members[1]->name.find(".addmm.") != std::string::npos) {  // t, addmm(b, x, W^T)
    link(".input.0", 1, ".input.1", false);
    link(".input.1", 0, ".input.0", false);
    link(".input.2", 1, ".input.0", false);
    link(".output.0", 1, ".output.0", false);
  } else if (linear_group && forward) {  // t, matmul[, add_]
    link(".input.0", 1, ".input.0", false);
    link(".input.1", 0, ".input.0", false);
    if (at.members.size() == 3) link(".input.2", 2, ".input.1", false);
    link(".output.0", at.members.size() - 1, ".output.0", false);
  } else if (forward) {
    const auto* map = argument_map(py.canon);
    for (const Row* r : pe.rows) {
      const std::string s(pe.suffix(*r));
      if (s.rfind(".input.", 0) != 0 || !map) {  // outputs, keywords, or an API without a map: same position
        link(s, 0, s, false);
        continue;
      }
      // ".input.3" or ".input.3.1" (an item of a list argument): the mapped position, same remainder
      const std::size_t end = s.find('.', 7);
      const std::string pos = s.substr(7, end == std::string::npos ? std::string::npos : end - 7);
      const std::string rest = end == std::string::npos ? "" : s.substr(end);
      for (const auto& [from, to] : *map) {
        if (pos == std::to_string(from)) link(s, 0, ".input." + std::to_string(to) + rest, false);
      }
      if (const auto* keywords = keyword_map(py.canon))  // ".input.weight": a keyword argument
        for (const auto& [name, to] : *keywords)
          if (pos == name) link(s, 0, ".input." + std::to_string(to) + rest, false);
    }
  } else {
    // Backward: the gradients of the outputs link by position. msprobe's outputs are the gradients
    // of the API's last autograd node: compared where they are the arguments' (same shape), never
    // for a composite API.
    for (const Row* r : pe.rows) {
      const std::string_view s = pe.suffix(*r);
      const Row* a = at.members[0]->row(s);
      if (!a) continue;
      if (r->is_output() && (last_node_gradients(py.canon) || a->shape != r->shape)) continue;
      link(s, 0, s, false);
    }
  }
  return links;
}

inline std::vector<RowLink> same_suffix_links(const Entry& t, const Entry& b) {
  std::vector<RowLink> links;
  for (const Row* r : t.rows) {
    const Row* g = b.row(t.suffix(*r));
    if (!g) continue;
    RowLink l{r, g, false};
    // A module's integer input flattened on one side (C++'s EmbeddingBag, seen through its first
    // ATen call, has the 1-D indices the frontend made of the 2-D input): the same elements.
    l.reshaped = t.is_module() && b.is_module() && flattened(*r, *g);
    links.push_back(l);
  }
  return links;
}

inline std::string value_key(const Entry& e) {
  const Row* r = e.first_output();
  if (!r) return "";
  std::string key(e.direction);
  for (const std::string_view part : {r->dtype, r->shape}) key.append("|").append(part);
  for (int s = 0; s < 4; ++s) key.append("|").append(py_str(r->stat(s)));
  return key.append("|").append(r->md5);
}

}  // namespace details

}  // namespace torchprobe::compare

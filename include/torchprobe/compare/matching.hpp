#pragma once
// Pairing the entries of two dumps, pass by pass, each pass taking what the previous ones left:
//   exact     the same name, backward call numbers recounted (msprobe's exact match);
//   map       the user's --map file: entry to entry, row to row (user_map.hpp), or API calls to
//             sequences of calls (group_map.hpp);
//   align     forward calls inside module calls paired by name, aligned as two sequences of
//             canonical items (module_alignment.hpp);
//   template  Python API <-> ATen sequences: Functional.linear <-> Aten.t + Aten.addmm (or
//             t + matmul + add_, or Aten.linear), conv2d <-> convolution, layer_norm <->
//             native_layer_norm, softmax <-> _softmax, dropout <-> native_dropout, and
//             Tensor.x / Torch.x / Functional.x (dunders too: __mul__ -> mul) <-> Aten.x; the k-th
//             unpaired occurrence on one side pairs with the k-th on the other, unless one of the
//             next 8 has the same first-output shape and dtype class where the k-th has not;
//   value     what is left, by a unique (direction, dtype, shape, statistics) key of the first
//             output, kept only while both sides' order is preserved.
// Inside a pair, rows link by their suffix (".input.0") or by the template's argument map.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "torchprobe/compare/group_map.hpp"
#include "torchprobe/compare/module_alignment.hpp"
#include "torchprobe/compare/rows.hpp"
#include "torchprobe/compare/user_map.hpp"

namespace torchprobe::compare {

struct Entry {
  std::string name, key, direction;  // direction: forward | backward | parameters_grad
  std::size_t index = 0;             // position in dump order
  std::vector<const Row*> rows;
  bool is_module() const { return name.rfind("Module.", 0) == 0 || name.rfind("Cell.", 0) == 0; }
  std::string suffix(const Row& r) const { return r.name.rfind(name, 0) == 0 ? r.name.substr(name.size()) : r.name; }
  const Row* row(const std::string& suffix_) const {
    for (const Row* r : rows) {
      if (suffix(*r) == suffix_) return r;
    }
    return nullptr;
  }
};

inline std::vector<Entry> dump_entries(const std::vector<Row>& rows) {
  std::vector<Entry> out;
  for (const Row& r : rows) {
    if (out.empty() || out.back().name != r.entry) {
      Entry e;
      e.name = r.entry;
      e.key = r.entry_key;
      e.index = r.entry_index;
      const auto parts = detail::split_dots(r.entry);
      for (const auto& p : parts) {
        if (p == "forward" || p == "backward" || p == "parameters_grad") e.direction = p;
      }
      out.push_back(std::move(e));
    }
    out.back().rows.push_back(&r);
  }
  return out;
}

struct RowLink {
  const Row* target;
  const Row* bench;
  bool transposed = false;  // W against W^T: equal statistics, reversed shape
};

struct EntryPair {
  const Entry* target = nullptr;           // the target's entry (the first of a template's sequence)
  std::vector<const Entry*> bench;         // one entry, or a template's sequence
  std::vector<const Entry*> target_group;  // a template's sequence on the target side, else empty
  std::string method;                      // exact | template | value
  std::vector<RowLink> links;
};

struct Matching {
  std::vector<EntryPair> pairs;  // in target order
  std::vector<const Entry*> target_only, bench_only;
};

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

// `*_parents`: construct.json of each side (entry -> its module), for the alignment inside modules.
inline Matching match_entries(const std::vector<Entry>& target, const std::vector<Entry>& bench,
                              const UserMap* user_map = nullptr,
                              const std::map<std::string, std::string>* target_parents = nullptr,
                              const std::map<std::string, std::string>* bench_parents = nullptr) {
  Matching m;
  std::map<std::string, const Entry*> bench_by_key;
  for (const Entry& e : bench) bench_by_key.emplace(e.key, &e);
  std::set<const Entry*> used;
  std::map<const Entry*, EntryPair> by_target;
  for (const Entry& t : target) {  // pass 1: exact
    const auto it = bench_by_key.find(t.key);
    if (it == bench_by_key.end() || used.count(it->second)) continue;
    used.insert(it->second);
    by_target[&t] = EntryPair{&t, {it->second}, {}, "exact", detail::same_suffix_links(t, *it->second)};
  }
  if (user_map) {  // pass 2: the user's items, in file order
    std::map<std::string, const Entry*> te, be;
    std::map<std::string, std::pair<const Entry*, const Row*>> tr, br;
    for (const Entry& e : target) {
      te[e.name] = &e;
      for (const Row* r : e.rows) tr[r->name] = {&e, r};
    }
    for (const Entry& e : bench) {
      be[e.name] = &e;
      for (const Row* r : e.rows) br[r->name] = {&e, r};
    }
    for (const auto& [tn, bn] : user_map->items) {
      if (te.count(tn) && be.count(bn)) {
        const Entry* t = te[tn];
        const Entry* b = be[bn];
        if (by_target.count(t) || used.count(b)) continue;
        used.insert(b);
        by_target[t] = EntryPair{t, {b}, {}, "map", detail::same_suffix_links(*t, *b)};
      } else if (tr.count(tn) && br.count(bn)) {
        const auto [t, trow] = tr[tn];
        const auto [b, brow] = br[bn];
        const auto it = by_target.find(t);
        if (it != by_target.end() && it->second.method != "map") continue;
        const bool in_pair = it != by_target.end() &&
                             std::find(it->second.bench.begin(), it->second.bench.end(), b) != it->second.bench.end();
        if (used.count(b) && !in_pair) continue;
        EntryPair& p = by_target[t];
        if (!p.target) p = EntryPair{t, {}, {}, "map", {}};
        if (!in_pair) p.bench.push_back(b);
        used.insert(b);
        p.links.push_back({trow, brow, false});
      }
    }
  }
  if (user_map) match_groups(target, bench, *user_map, by_target, used);  // pass 2, the group form
  const auto left = [&](const std::vector<Entry>& side, bool is_target) {
    std::vector<const Entry*> out;
    for (const Entry& e : side) {
      if (is_target ? !by_target.count(&e) : !used.count(&e)) out.push_back(&e);
    }
    return out;
  };
  if (target_parents && bench_parents) {  // pass 3: forward calls aligned inside modules paired by name
    for (const Entry& tm : target) {
      const auto pm = by_target.find(&tm);
      if (!tm.is_module() || tm.direction != "forward" || pm == by_target.end() || pm->second.method != "exact")
        continue;
      const auto inside = [&](const std::vector<Entry>& side, bool is_target, const std::string& module) {
        const auto& parents = is_target ? *target_parents : *bench_parents;
        std::vector<const Entry*> out;
        for (const Entry& e : side) {
          if (e.direction != "forward" || e.is_module() || (is_target ? by_target.count(&e) : used.count(&e))) continue;
          const auto p = parents.find(e.name);
          if (p != parents.end() && p->second == module) out.push_back(&e);
        }
        return out;
      };
      const auto ti = detail::canonical_items(inside(target, true, tm.name));
      const auto bi = detail::canonical_items(inside(bench, false, pm->second.bench.front()->name));
      const auto score = [](const detail::Item& x, const detail::Item& y) {
        if (x.canon != y.canon || x.direction != y.direction) return 0;
        if (x.aten == y.aten && x.members.size() != y.members.size()) return 0;
        return 1 + (detail::signature(x) == detail::signature(y) ? 2 : 0) +
               (detail::value_key(*x.members.back()) == detail::value_key(*y.members.back()) ? 4 : 0);
      };
      for (const auto& [i, j] : detail::align_items(ti, bi, score)) {
        const detail::Item& t = ti[i];
        const detail::Item& b = bi[j];
        for (const Entry* e : b.members) used.insert(e);
        if (t.aten == b.aten) {  // same naming, other call numbers: member with member
          for (std::size_t k = 0; k < t.members.size(); ++k)
            by_target[t.members[k]] = EntryPair{
                t.members[k], {b.members[k]}, {}, "align", detail::same_suffix_links(*t.members[k], *b.members[k])};
          continue;
        }
        EntryPair p{t.members[0], b.members, {}, "align", {}};
        p.links = t.aten ? detail::template_links(b, t, false) : detail::template_links(t, b, true);
        if (t.members.size() > 1) p.target_group = t.members;
        by_target[t.members[0]] = std::move(p);
        for (std::size_t k = 1; k < t.members.size(); ++k)
          by_target[t.members[k]] = EntryPair{t.members[k], {}, {}, "align", {}};
      }
    }
  }
  {  // pass 4: templates, in order of (canonical name, direction) on each side
    const auto ti = detail::canonical_items(left(target, true));
    const auto bi = detail::canonical_items(left(bench, false));
    std::map<std::pair<std::string, std::string>, std::vector<const detail::Item*>> bench_items;
    for (const auto& it : bi) bench_items[{it.canon, it.direction}].push_back(&it);
    std::map<std::pair<std::string, std::string>, std::size_t> taken;
    for (const auto& t : ti) {
      auto& queue = bench_items[{t.canon, t.direction}];
      std::size_t& k = taken[{t.canon, t.direction}];
      if (k >= queue.size()) continue;
      // The next one, unless one of the next few has t's output shape and the next has not (an
      // extra call on one side must not shift every later pair).
      std::size_t pick = k;
      const std::string sig = detail::signature(t);
      for (std::size_t j = k; j < queue.size() && j < k + detail::kLookahead && detail::signature(*queue[k]) != sig;
           ++j) {
        if (detail::signature(*queue[j]) == sig) {
          pick = j;
          break;
        }
      }
      const detail::Item& b = *queue[pick];
      if (t.aten == b.aten) continue;  // same naming on both sides: exact matching's business
      k = pick + 1;
      EntryPair p{t.members[0], b.members, {}, "template", {}};
      p.links = t.aten ? detail::template_links(b, t, false) : detail::template_links(t, b, true);
      if (t.members.size() > 1) p.target_group = t.members;
      for (const Entry* e : b.members) used.insert(e);
      by_target[t.members[0]] = std::move(p);
      for (std::size_t i = 1; i < t.members.size(); ++i)  // the rest of a target group is covered by the pair
        by_target[t.members[i]] = EntryPair{t.members[i], {}, {}, "template", {}};
    }
  }
  {  // pass 5: unique value keys, order preserved
    std::map<std::string, std::vector<const Entry*>> tk, bk;
    for (const Entry* e : left(target, true)) tk[detail::value_key(*e)].push_back(e);
    for (const Entry* e : left(bench, false)) bk[detail::value_key(*e)].push_back(e);
    std::vector<std::pair<const Entry*, const Entry*>> cand;
    for (const auto& [k, v] : tk) {
      const auto it = bk.find(k);
      if (!k.empty() && v.size() == 1 && it != bk.end() && it->second.size() == 1)
        cand.emplace_back(v[0], it->second[0]);
    }
    std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) { return a.first->index < b.first->index; });
    std::size_t last_bench = 0;
    bool any = false;
    for (const auto& [t, b] : cand) {
      if (any && b->index < last_bench) continue;
      any = true;
      last_bench = b->index;
      used.insert(b);
      by_target[t] = EntryPair{t, {b}, {}, "value", detail::same_suffix_links(*t, *b)};
    }
  }
  for (const Entry& t : target) {
    const auto it = by_target.find(&t);
    if (it == by_target.end())
      m.target_only.push_back(&t);
    else if (!it->second.bench.empty())
      m.pairs.push_back(it->second);
  }
  for (const Entry& b : bench) {
    if (!used.count(&b)) m.bench_only.push_back(&b);
  }
  return m;
}

}  // namespace torchprobe::compare

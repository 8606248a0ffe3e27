#pragma once
// Pairing inside paired modules (matching.hpp's pass 3): for each module call paired by name (mix dumps on both sides),
// the API calls each side made directly inside it (construct.json) that are still unpaired are aligned as two sequences
// (a weighted longest common subsequence over the canonical items of templates.hpp: Functional.linear and Aten.t +
// Aten.addmm are both "linear"). Two items can pair only under the same canonical name; a pair scores more when their
// first outputs have the same shape and dtype class, and more again when their statistics are equal. An extra call on
// one side then stays inside its module: it cannot shift every later call of the same API onto the wrong partner, as
// the global k-th-occurrence rule of the template pass can.
#include <algorithm>
#include <unordered_set>
#include <map>
#include <unordered_map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "torchprobe/analysis/compare/group_map.hpp"
#include "torchprobe/analysis/compare/templates.hpp"

namespace torchprobe::compare::details {

// The best alignment of two item lists: index pairs, in order.
template <class ItemT, class Score>
std::vector<std::pair<std::size_t, std::size_t>> align_items(const std::vector<ItemT>& a, const std::vector<ItemT>& b,
                                                             Score score) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> best(n + 1, std::vector<int>(m + 1, 0));
  for (std::size_t i = n; i-- > 0;) {
    for (std::size_t j = m; j-- > 0;) {
      int v = std::max(best[i + 1][j], best[i][j + 1]);
      const int s = score(a[i], b[j]);
      if (s > 0) v = std::max(v, s + best[i + 1][j + 1]);
      best[i][j] = v;
    }
  }
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t i = 0, j = 0; i < n && j < m;) {
    const int s = score(a[i], b[j]);
    if (s > 0 && best[i][j] == s + best[i + 1][j + 1]) {
      out.emplace_back(i, j);
      ++i;
      ++j;
    } else if (best[i][j] == best[i + 1][j]) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

}  // namespace torchprobe::compare::details

namespace torchprobe::compare {

// The pass: pairs what it aligns in `by_target` / `used` (method "align"). `*_parents`: each side's
// construct.json, entry -> its module.
inline void align_inside_modules(const std::vector<Entry>& target, const std::vector<Entry>& bench,
                                 const Parents* target_parents, const Parents* bench_parents, PairsByTarget& by_target,
                                 TakenEntries& used) {
  // Only entries not paired yet are ever aligned: the indexes below hold those alone, so that the
  // pass costs a scan where nearly everything paired by name (a million-entry compare spent 1.5 s
  // and 110 MB indexing entries already paired).
  const auto open = [&](const Entry& e, bool is_target) { return is_target ? !by_target.count(&e) : !used.count(&e); };
  // A call's backward entries ("Aten.addmm.0" -> Aten.addmm.0.backward), to pair with its forward.
  // Keys: views of the entries' names, which outlive the pass.
  std::unordered_map<std::string_view, std::vector<const Entry*>> t_backward, b_backward;  // looked up only
  for (const Entry& e : target)
    if (e.direction == "backward" && open(e, true)) t_backward[details::call_of(e.name)].push_back(&e);
  for (const Entry& e : bench)
    if (e.direction == "backward" && open(e, false)) b_backward[details::call_of(e.name)].push_back(&e);
  // An item's backward entries, the one of its last call (addmm: the linear's lead) first.
  const auto backward_of = [&](const details::Item& it, bool is_target) {
    std::vector<const Entry*> out;
    for (std::size_t k = it.members.size(); k-- > 0;) {
      const auto& pool = is_target ? t_backward : b_backward;
      const auto found = pool.find(details::call_of(it.members[k]->name));
      if (found == pool.end()) continue;
      for (const Entry* e : found->second)
        if (is_target ? !by_target.count(e) : !used.count(e)) out.push_back(e);
    }
    return out;
  };
  // Each module's forward non-module calls, in dump order, indexed once (a scan of the whole side per
  // module was quadratic in the dump's size).
  using Children = std::unordered_map<std::string_view, std::vector<const Entry*>>;  // keys: the parents' names
  const auto children_of = [&](const std::vector<Entry>& side, const Parents& parents, bool is_target) {
    Children out;
    for (const Entry& e : side) {
      if (e.direction != "forward" || e.is_module() || !open(e, is_target)) continue;
      const auto p = parents.find(e.name);
      if (p != parents.end()) out[p->second].push_back(&e);
    }
    return out;
  };
  const Children t_children = children_of(target, *target_parents, true),
                 b_children = children_of(bench, *bench_parents, false);
  if (t_children.empty() || b_children.empty()) return;  // nothing left to align inside modules
  for (const Entry& tm : target) {
    const EntryPair* pm = by_target.find(&tm);
    if (!tm.is_module() || tm.direction != "forward" || !pm || pm->method != "exact") continue;
    const auto inside = [&](bool is_target, std::string_view module) {
      const Children& children = is_target ? t_children : b_children;
      std::vector<const Entry*> out;
      const auto c = children.find(module);
      if (c == children.end()) return out;
      for (const Entry* e : c->second)
        if (!(is_target ? by_target.count(e) : used.count(e))) out.push_back(e);
      return out;
    };
    const auto ti = details::canonical_items(inside(true, tm.name));
    const auto bi = details::canonical_items(inside(false, pm->bench.front()->name));
    const auto score = [](const details::Item& x, const details::Item& y) {
      if (x.canon != y.canon || x.direction != y.direction) return 0;
      if (x.aten == y.aten && x.members.size() != y.members.size()) return 0;
      return 1 + (details::signature(x) == details::signature(y) ? 2 : 0) +
             (details::value_key(*x.members.back()) == details::value_key(*y.members.back()) ? 4 : 0);
    };
    for (const auto& [i, j] : details::align_items(ti, bi, score)) {
      const details::Item& t = ti[i];
      const details::Item& b = bi[j];
      for (const Entry* e : b.members) used.insert(e);
      if (t.aten == b.aten) {  // same naming, other call numbers: member with member
        for (std::size_t k = 0; k < t.members.size(); ++k)
          by_target[t.members[k]] = EntryPair{
              t.members[k], {b.members[k]}, {}, "align", details::same_suffix_links(*t.members[k], *b.members[k])};
        continue;
      }
      EntryPair p{t.members[0], b.members, {}, "align", {}};
      p.links = t.aten ? details::template_links(b, t, false) : details::template_links(t, b, true);
      if (t.members.size() > 1) p.target_group = t.members;
      by_target[t.members[0]] = std::move(p);
      for (std::size_t k = 1; k < t.members.size(); ++k)
        by_target[t.members[k]] = EntryPair{t.members[k], {}, {}, "align", {}};
      const auto tb = backward_of(t, true), bb = backward_of(b, false);
      if (tb.empty() || bb.empty()) continue;  // linked by argument position, as the templates do
      const details::Item tbi{t.canon, "backward", tb, t.aten}, bbi{b.canon, "backward", bb, b.aten};
      by_target[tb[0]] =
          EntryPair{tb[0], bb, tb.size() > 1 ? tb : std::vector<const Entry*>{}, "align",
                    t.aten ? details::template_links(bbi, tbi, false) : details::template_links(tbi, bbi, true)};
      for (const Entry* e : bb) used.insert(e);
      for (std::size_t k = 1; k < tb.size(); ++k) by_target[tb[k]] = EntryPair{tb[k], {}, {}, "align", {}};
    }
  }
}

}  // namespace torchprobe::compare

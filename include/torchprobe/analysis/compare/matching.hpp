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
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "torchprobe/analysis/compare/entries.hpp"
#include "torchprobe/analysis/compare/group_map.hpp"
#include "torchprobe/analysis/compare/module_alignment.hpp"
#include "torchprobe/analysis/compare/name_index.hpp"
#include "torchprobe/analysis/compare/expanded_calls.hpp"
#include "torchprobe/analysis/compare/templates.hpp"
#include "torchprobe/analysis/compare/user_map.hpp"

namespace torchprobe::compare {

// Pass 4: templates, in order of (canonical name, direction) on each side. Run again after pass 4b,
// which may take back pairs that crossed an expanded call.
inline void pair_templates(const std::vector<Entry>& target, const std::vector<Entry>& bench, PairsByTarget& by_target,
                           TakenEntries& used) {
  const auto left = [&](const std::vector<Entry>& side, bool is_target) {
    std::vector<const Entry*> out;
    for (const Entry& e : side) {
      if (is_target ? !by_target.count(&e) : !used.count(&e)) out.push_back(&e);
    }
    return out;
  };
  const auto ti = details::canonical_items(left(target, true));
  const auto bi = details::canonical_items(left(bench, false));
  std::map<std::pair<std::string, std::string>, std::vector<const details::Item*>> bench_items;
  for (const auto& it : bi) bench_items[{it.canon, it.direction}].push_back(&it);
  std::map<std::pair<std::string, std::string>, std::vector<const details::Item*>> target_items;
  for (const auto& it : ti) target_items[{it.canon, it.direction}].push_back(&it);
  std::map<std::pair<std::string, std::string>, std::size_t> taken, seen;
  for (const auto& t : ti) {
    auto& queue = bench_items[{t.canon, t.direction}];
    std::size_t& k = taken[{t.canon, t.direction}];
    const std::size_t own = seen[{t.canon, t.direction}]++;  // t's rank among the target's items of its kind
    if (k >= queue.size()) continue;
    // The next one, unless one of the next few has t's output shape and the next has not (an
    // extra call on one side must not shift every later pair).
    std::size_t pick = k;
    const std::string sig = details::signature(t);
    bool found = details::signature(*queue[k]) == sig;
    for (std::size_t j = k; j < queue.size() && j < k + details::kLookahead && !found; ++j) {
      if (details::signature(*queue[j]) == sig) {
        pick = j;
        found = true;
      }
    }
    // The extra call may be the target's: t has no look-alike among the next few of the bench,
    // but one of the target's next few has the bench's next one's (MultiheadAttention's in_proj
    // linear in C++, inside one Python call). Then t stays unpaired.
    // Only when the target has more calls of this kind left than the bench: with as many, t is a
    // call with a wrong output, which pairs (and diverges) rather than shifting every later pair.
    const auto& mine = target_items[{t.canon, t.direction}];
    if (!found && mine.size() - own > queue.size() - k) {
      const std::string want = details::signature(*queue[k]);
      bool later = false;
      for (std::size_t j = own + 1; j < mine.size() && j <= own + details::kLookahead && !later; ++j)
        later = details::signature(*mine[j]) == want;
      if (later) continue;
    }
    const details::Item& b = *queue[pick];
    if (t.aten == b.aten) continue;  // same naming on both sides: exact matching's business
    k = pick + 1;
    EntryPair p{t.members[0], b.members, {}, "template", {}};
    p.links = t.aten ? details::template_links(b, t, false) : details::template_links(t, b, true);
    if (t.members.size() > 1) p.target_group = t.members;
    for (const Entry* e : b.members) used.insert(e);
    by_target[t.members[0]] = std::move(p);
    for (std::size_t i = 1; i < t.members.size(); ++i)  // the rest of a target group is covered by the pair
      by_target[t.members[i]] = EntryPair{t.members[i], {}, {}, "template", {}};
  }
}

// `*_parents`: construct.json of each side (entry -> its module), for the alignment inside modules.
inline Matching match_entries(const std::vector<Entry>& target, const std::vector<Entry>& bench,
                              const UserMap* user_map = nullptr, const Parents* target_parents = nullptr,
                              const Parents* bench_parents = nullptr) {
  Matching m;
  const auto key_of = [&](std::size_t i) { return bench[i].key; };
  details::NameIndex bench_by_key(bench.size());  // the first entry of each key
  for (std::size_t i = 0; i < bench.size(); ++i) bench_by_key.insert(bench[i].key, i, key_of);
  TakenEntries used(bench);
  PairsByTarget by_target(target);
  for (const Entry& t : target) {  // pass 1: exact
    const std::size_t at = bench_by_key.find(t.key, key_of);
    if (at == details::NameIndex::npos || used.count(&bench[at])) continue;
    const Entry* b = &bench[at];
    used.insert(b);
    by_target[&t] = EntryPair{&t, {b}, {}, "exact", details::same_suffix_links(t, *b)};
  }
  if (user_map) {  // pass 2: the user's items, in file order
    std::map<std::string_view, const Entry*> te, be;
    std::map<std::string_view, std::pair<const Entry*, const Row*>> tr, br;
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
        by_target[t] = EntryPair{t, {b}, {}, "map", details::same_suffix_links(*t, *b)};
      } else if (tr.count(tn) && br.count(bn)) {
        const auto [t, trow] = tr[tn];
        const auto [b, brow] = br[bn];
        const EntryPair* it = by_target.find(t);
        if (it && it->method != "map") continue;
        const bool in_pair = it && std::find(it->bench.begin(), it->bench.end(), b) != it->bench.end();
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
  if (target_parents && bench_parents)  // pass 3: forward calls aligned inside modules paired by name
    align_inside_modules(target, bench, target_parents, bench_parents, by_target, used);
  pair_templates(target, bench, by_target, used);           // pass 4
  if (pair_expanded_calls(target, bench, by_target, used))  // pass 4b: one Python call, many ATen calls
    pair_templates(target, bench, by_target, used);
  {  // pass 5: unique value keys, order preserved
    std::map<std::string, std::vector<const Entry*>> tk, bk;
    for (const Entry* e : left(target, true)) tk[details::value_key(*e)].push_back(e);
    for (const Entry* e : left(bench, false)) bk[details::value_key(*e)].push_back(e);
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
      by_target[t] = EntryPair{t, {b}, {}, "value", details::same_suffix_links(*t, *b)};
    }
  }
  m.pairs = by_target.take_pairs(m.target_only);
  for (const Entry& b : bench) {
    if (!used.count(&b)) m.bench_only.push_back(&b);
  }
  return m;
}

}  // namespace torchprobe::compare

#pragma once
// One Python call that is many ATen calls (matching.hpp's pass 4b, issue 41 item 1). Python's
// F.multi_head_attention_forward is one hooked call in msprobe's dump; C++'s is a function of the
// frontend whose ATen calls (the projections, bmm, softmax, ...) TorchProbe records one by one.
// Such a Python call pairs with the ATen calls left unpaired between the partners of its paired
// neighbours: the pair is a group (method "group"), its outputs linked to the last ATen call with
// the same shape and dtype, and its backward with those calls' backward entries.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "torchprobe/analysis/compare/group_map.hpp"
#include "torchprobe/analysis/compare/templates.hpp"

namespace torchprobe::compare {

namespace detail {
inline bool expanded_api(const std::string& canon) {
  static const std::set<std::string> kExpanded = {"multi_head_attention_forward", "scaled_dot_product_attention"};
  return kExpanded.count(canon) > 0;
}

inline const Row* first_output(const Entry& e) {
  for (const Row* r : e.rows)
    if (r->is_output()) return r;
  return nullptr;
}
}  // namespace detail

// Returns whether it took back template pairs that crossed an expanded call (the templates pair the
// k-th call of a kind with the k-th, and C++'s MultiheadAttention has linear calls that Python's does
// inside its one call): the caller then runs the templates again on what is left.
inline bool pair_expanded_calls(const std::vector<Entry>& target, const std::vector<Entry>& bench,
                                std::map<const Entry*, EntryPair>& by_target, std::set<const Entry*>& used) {
  bool took_back = false;
  const auto contains = [](const std::vector<const Entry*>& v, const Entry* e) {
    return std::find(v.begin(), v.end(), e) != v.end();
  };
  // Takes back the pair that holds e (a template or alignment pair; exact pairs are names' business).
  const auto unpair = [&](const Entry* e, bool e_is_target) {
    for (auto it = by_target.begin(); it != by_target.end(); ++it) {
      const EntryPair p = it->second;
      const bool holds = e_is_target ? (p.target == e || contains(p.target_group, e)) : contains(p.bench, e);
      if (!holds || p.bench.empty() || p.method == "exact" || p.method == "map") continue;
      for (const Entry* b : p.bench) used.erase(b);
      for (const Entry* g : p.target_group.empty() ? std::vector<const Entry*>{p.target} : p.target_group)
        by_target.erase(g);
      took_back = true;
      return;
    }
  };
  std::map<const Entry*, const Entry*> partner_of_bench;  // paired bench entry -> its target entry
  for (const auto& [t, p] : by_target)
    for (const Entry* b : p.bench) partner_of_bench[b] = t;
  const auto paired = [&](const Entry& e, bool is_target) {
    return is_target ? by_target.count(&e) > 0 : used.count(&e) > 0;
  };
  const auto partner = [&](const Entry& e, bool is_target) -> const Entry* {
    if (!is_target) return partner_of_bench.count(&e) ? partner_of_bench[&e] : nullptr;
    const auto it = by_target.find(&e);
    return it == by_target.end() || it->second.bench.empty() ? nullptr : it->second.bench.front();
  };
  const auto plain_forward = [](const Entry& e) { return !e.is_module() && e.direction == "forward"; };
  for (const bool python_is_target : {false, true}) {
    const std::vector<Entry>& py_side = python_is_target ? target : bench;
    const std::vector<Entry>& at_side = python_is_target ? bench : target;
    std::map<const Entry*, std::size_t> at_pos;
    for (std::size_t i = 0; i < at_side.size(); ++i) at_pos[&at_side[i]] = i;
    for (std::size_t i = 0; i < py_side.size(); ++i) {
      const Entry& p = py_side[i];
      const auto [prefix, api, dir] = detail::api_parts(p);
      if (prefix.empty() || prefix == "Aten" || dir != "forward" || paired(p, python_is_target) ||
          !detail::expanded_api(detail::canonical_api(api)))
        continue;
      // The ATen-side window: after the partner of the last paired call before p, before the partner
      // of the first paired call after it.
      std::size_t lo = 0, hi = at_side.size(), py_lo = 0, py_hi = py_side.size();
      bool has_lo = false;
      for (std::size_t k = i; k-- > 0;) {
        const Entry* q = plain_forward(py_side[k]) ? partner(py_side[k], python_is_target) : nullptr;
        if (q && at_pos.count(q)) {
          lo = at_pos[q];
          py_lo = k;
          has_lo = true;
          break;
        }
      }
      for (std::size_t k = i + 1; k < py_side.size(); ++k) {
        const Entry* q = plain_forward(py_side[k]) ? partner(py_side[k], python_is_target) : nullptr;
        if (q && at_pos.count(q)) {
          hi = at_pos[q];
          py_hi = k;
          break;
        }
      }
      std::map<const Entry*, std::size_t> py_pos;
      for (std::size_t k = 0; k < py_side.size(); ++k) py_pos[&py_side[k]] = k;
      std::vector<const Entry*> run;
      for (std::size_t k = has_lo ? lo + 1 : 0; k < hi; ++k) {
        const Entry& a = at_side[k];
        if (!plain_forward(a) || a.name.rfind("Aten.", 0) != 0) continue;
        if (paired(a, !python_is_target)) {
          // Paired with a Python call outside the window: a crossing pair, taken back.
          const Entry* q = partner(a, !python_is_target);
          if (!q || !py_pos.count(q) || (py_pos[q] > (has_lo ? py_lo : 0) && py_pos[q] < py_hi)) continue;
          unpair(&a, !python_is_target);
          if (paired(a, !python_is_target)) continue;
        }
        run.push_back(&a);
      }
      if (run.empty()) continue;
      // Rows: each Python output with the last call of the run whose first output looks the same.
      std::vector<RowLink> links;
      std::map<std::size_t, const Entry*> member_of_output;  // Python output k -> run member
      std::size_t out_k = 0;
      for (const Row* r : p.rows) {
        if (!r->is_output()) continue;
        for (std::size_t k = run.size(); k-- > 0;) {
          const Row* o = detail::first_output(*run[k]);
          if (o && o->shape == r->shape && o->dtype == r->dtype) {
            links.push_back(python_is_target ? RowLink{r, o} : RowLink{o, r});
            member_of_output[out_k] = run[k];
            break;
          }
        }
        ++out_k;
      }
      const auto pair_up = [&](const std::vector<const Entry*>& py, const std::vector<const Entry*>& at,
                               std::vector<RowLink> l) {
        for (const Entry* e : python_is_target ? at : py) used.insert(e);
        const std::vector<const Entry*>& tgt = python_is_target ? py : at;
        EntryPair pr{tgt[0], python_is_target ? at : py, tgt.size() > 1 ? tgt : std::vector<const Entry*>{}, "group",
                     std::move(l)};
        by_target[tgt[0]] = std::move(pr);
        for (std::size_t k = 1; k < tgt.size(); ++k) by_target[tgt[k]] = EntryPair{tgt[k], {}, {}, "group", {}};
      };
      pair_up({&p}, run, links);
      // Backward: the Python call's backward entry with the backward entries of the run's calls; the
      // gradient of each output with the gradient of its linked call's output.
      const auto backward_of = [](const std::vector<Entry>& side, const Entry& fwd) -> const Entry* {
        const std::string want = detail::call_of(fwd.name);
        for (const Entry& e : side)
          if (e.direction == "backward" && detail::call_of(e.name) == want) return &e;
        return nullptr;
      };
      const Entry* pb = backward_of(py_side, p);
      for (const Entry* a : run)  // their backward entries go with them
        if (const Entry* b = backward_of(at_side, *a); b && paired(*b, !python_is_target)) unpair(b, !python_is_target);
      std::vector<const Entry*> ab;
      for (const Entry* a : run)
        if (const Entry* b = backward_of(at_side, *a); b && !paired(*b, !python_is_target)) ab.push_back(b);
      if (!pb || ab.empty() || paired(*pb, python_is_target)) continue;
      std::vector<RowLink> blinks;
      for (const auto& [k, member] : member_of_output) {
        const Entry* mb = backward_of(at_side, *member);
        const Row* pr = pb->row(".input." + std::to_string(k));
        const Row* ar = mb ? mb->row(".input.0") : nullptr;
        if (pr && ar) blinks.push_back(python_is_target ? RowLink{pr, ar} : RowLink{ar, pr});
      }
      pair_up({pb}, ab, blinks);
    }
  }
  return took_back;
}

}  // namespace torchprobe::compare

#pragma once
// One Python call that is many ATen calls (matching.hpp's pass 4b, issue 41 item 1). Python's
// F.multi_head_attention_forward is one hooked call in msprobe's dump; C++'s is a function of the
// frontend whose ATen calls (the projections, bmm, softmax, ...) TorchProbe records one by one.
// Such a Python call pairs with the ATen calls left unpaired between the partners of its paired
// neighbours: the pair is a group (method "group"), its outputs linked to the last ATen call with
// the same shape and dtype, and its backward with those calls' backward entries.
#include <algorithm>
#include <unordered_set>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "torchprobe/analysis/compare/group_map.hpp"
#include "torchprobe/analysis/compare/templates.hpp"

namespace torchprobe::compare {

namespace details {
inline bool expanded_api(const std::string& canon) {
  static const std::set<std::string> kExpanded = {"multi_head_attention_forward", "scaled_dot_product_attention"};
  return kExpanded.count(canon) > 0;
}
}  // namespace details

// Returns whether it took back template pairs that crossed an expanded call (the templates pair the
// k-th call of a kind with the k-th, and C++'s MultiheadAttention has linear calls that Python's does
// inside its one call): the caller then runs the templates again on what is left. Costs one scan of
// the names unless a side has an unpaired expanded call; then linear in the entries per such call.
inline bool pair_expanded_calls(const std::vector<Entry>& target, const std::vector<Entry>& bench,
                                PairsByTarget& by_target, TakenEntries& used) {
  const auto is_expanded = [](const Entry& e) {
    if (e.is_module() || e.direction != "forward" || e.name.rfind("Aten.", 0) == 0) return false;
    const auto [prefix, api, dir] = details::api_parts(e);
    return !prefix.empty() && details::expanded_api(details::canonical_api(api));
  };
  bool any = false;
  for (const Entry& e : target) any = any || (!by_target.count(&e) && is_expanded(e));
  for (const Entry& e : bench) any = any || (!used.count(&e) && is_expanded(e));
  if (!any) return false;

  bool took_back = false;
  const auto pos_in = [](const std::vector<Entry>& v, const Entry* e) -> std::ptrdiff_t {
    return e >= v.data() && e < v.data() + v.size() ? e - v.data() : -1;
  };
  // Who pairs with whom, kept current as pairs are taken back and made: a bench entry's target
  // entry, a target entry's pair (the lead of its group).
  std::unordered_map<const Entry*, const Entry*> target_of_bench, lead_of_target;
  by_target.each([&](const Entry* t, const EntryPair& p) {
    for (const Entry* b : p.bench) target_of_bench[b] = t;
    if (!p.bench.empty())
      for (const Entry* g : p.target_group.empty() ? std::vector<const Entry*>{t} : p.target_group)
        lead_of_target[g] = t;
  });
  const auto paired = [&](const Entry& e, bool is_target) {
    return is_target ? by_target.count(&e) > 0 : used.count(&e) > 0;
  };
  const auto pair_of = [&](const Entry& e, bool is_target) -> const EntryPair* {
    const auto& index = is_target ? lead_of_target : target_of_bench;
    const auto lead = index.find(&e);
    if (lead == index.end()) return nullptr;
    const EntryPair* p = by_target.find(lead->second);
    return !p || p->bench.empty() ? nullptr : p;
  };
  // Takes back the template or alignment pair that holds e (exact, map and group pairs stay).
  const auto unpair = [&](const Entry& e, bool e_is_target) {
    const EntryPair* p = pair_of(e, e_is_target);
    if (!p || p->method == "exact" || p->method == "map" || p->method == "group") return;
    const std::vector<const Entry*> bench_side = p->bench;
    const std::vector<const Entry*> group =
        p->target_group.empty() ? std::vector<const Entry*>{p->target} : p->target_group;
    for (const Entry* b : bench_side) {
      used.erase(b);
      target_of_bench.erase(b);
    }
    for (const Entry* g : group) {
      by_target.erase(g);
      lead_of_target.erase(g);
    }
    took_back = true;
  };
  // Each side's backward entry of a call ("Aten.bmm.0"), indexed once.
  const auto backward_index = [](const std::vector<Entry>& side) {
    std::unordered_map<std::string_view, const Entry*> index;  // keys: views of the entries' names
    for (const Entry& e : side)
      if (e.direction == "backward") index.emplace(details::call_of(e.name), &e);
    return index;
  };
  const auto t_backward = backward_index(target), b_backward = backward_index(bench);

  for (const bool python_is_target : {false, true}) {
    const std::vector<Entry>& py_side = python_is_target ? target : bench;
    const std::vector<Entry>& at_side = python_is_target ? bench : target;
    const auto& at_backward = python_is_target ? b_backward : t_backward;
    const auto& py_backward = python_is_target ? t_backward : b_backward;
    const auto backward_of = [](const std::unordered_map<std::string_view, const Entry*>& index, const Entry& fwd) {
      const auto it = index.find(details::call_of(fwd.name));
      return it == index.end() ? nullptr : it->second;
    };
    // The ATen-side positions of a Python call's partners (first, last), or {-1, -1}.
    const auto partner_span = [&](const Entry& py) -> std::pair<std::ptrdiff_t, std::ptrdiff_t> {
      if (py.is_module() || py.direction != "forward") return {-1, -1};
      const EntryPair* p = pair_of(py, python_is_target);
      if (!p) return {-1, -1};
      std::vector<const Entry*> at = python_is_target ? p->bench : p->target_group;
      if (at.empty()) at = {p->target};
      std::ptrdiff_t first = -1, last = -1;
      for (const Entry* a : at) {
        const std::ptrdiff_t k = pos_in(at_side, a);
        if (k < 0) continue;
        first = first < 0 ? k : std::min(first, k);
        last = std::max(last, k);
      }
      return {first, last};
    };
    for (std::size_t i = 0; i < py_side.size(); ++i) {
      const Entry& p = py_side[i];
      if (paired(p, python_is_target) || !is_expanded(p)) continue;
      // The ATen-side window: after the partners of the last paired call before p, before the
      // partners of the first paired call after it.
      std::ptrdiff_t lo = -1, hi = static_cast<std::ptrdiff_t>(at_side.size());
      std::ptrdiff_t py_lo = -1, py_hi = static_cast<std::ptrdiff_t>(py_side.size());
      for (std::size_t k = i; k-- > 0;) {
        if (const auto span = partner_span(py_side[k]); span.second >= 0) {
          lo = span.second;
          py_lo = static_cast<std::ptrdiff_t>(k);
          break;
        }
      }
      for (std::size_t k = i + 1; k < py_side.size(); ++k) {
        if (const auto span = partner_span(py_side[k]); span.first >= 0) {
          hi = span.first;
          py_hi = static_cast<std::ptrdiff_t>(k);
          break;
        }
      }
      std::vector<const Entry*> run;
      for (std::ptrdiff_t k = lo + 1; k < hi; ++k) {
        const Entry& a = at_side[static_cast<std::size_t>(k)];
        if (a.is_module() || a.direction != "forward" || a.name.rfind("Aten.", 0) != 0) continue;
        if (paired(a, !python_is_target)) {
          // Paired with a Python call outside the window: a crossing pair, taken back.
          const EntryPair* q = pair_of(a, !python_is_target);
          const Entry* py = !q                 ? nullptr
                            : python_is_target ? q->target
                                               : (q->bench.empty() ? nullptr : q->bench.front());
          const std::ptrdiff_t at = py ? pos_in(py_side, py) : -1;
          if (at < 0 || (at >= py_lo && at <= py_hi)) continue;
          unpair(a, !python_is_target);
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
          const Row* o = run[k]->first_output();
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
        const std::vector<const Entry*>& tgt = python_is_target ? py : at;
        const std::vector<const Entry*>& bch = python_is_target ? at : py;
        for (const Entry* e : bch) {
          used.insert(e);
          target_of_bench[e] = tgt[0];
        }
        for (const Entry* e : tgt) lead_of_target[e] = tgt[0];
        by_target[tgt[0]] =
            EntryPair{tgt[0], bch, tgt.size() > 1 ? tgt : std::vector<const Entry*>{}, "group", std::move(l)};
        for (std::size_t k = 1; k < tgt.size(); ++k) by_target[tgt[k]] = EntryPair{tgt[k], {}, {}, "group", {}};
      };
      pair_up({&p}, run, links);
      // Backward: the Python call's backward entry with the backward entries of the run's calls; the
      // gradient of each output with the gradient of its linked call's output.
      const Entry* pb = backward_of(py_backward, p);
      if (!pb || paired(*pb, python_is_target)) continue;
      for (const Entry* a : run)  // their backward entries go with them
        if (const Entry* b = backward_of(at_backward, *a); b && paired(*b, !python_is_target))
          unpair(*b, !python_is_target);
      std::vector<const Entry*> ab;
      for (const Entry* a : run)
        if (const Entry* b = backward_of(at_backward, *a); b && !paired(*b, !python_is_target)) ab.push_back(b);
      if (ab.empty()) continue;
      std::vector<RowLink> blinks;
      for (const auto& [k, member] : member_of_output) {
        const Entry* mb = backward_of(at_backward, *member);
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

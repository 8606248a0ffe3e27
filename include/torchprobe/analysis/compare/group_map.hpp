#pragma once
// The group form of the user's mapping file: API names without call numbers, one side a list of
// the calls that stand for one call on the other side, with an optional argument map:
//
//   Functional.linear: [Aten.t, Aten.addmm] {input.0: 1.input.1, input.1: 0.input.0, input.2: 1.input.0,
//   output.0: 1.output.0} Aten.gelu: Aten.my_gelu
//
// Each side's unpaired forward entries are scanned in execution order for runs of consecutive
// calls of the listed APIs; the k-th run of the target pairs with the k-th run of the bench. An
// argument is `[k.]input.N` / `[k.]output.N`, k the position in the list (0 when omitted). Without
// an argument map, a single call's inputs link to the first listed call's inputs of the same
// position, and its outputs to the last listed call's outputs.
//
// Backward: the backward entries that share a run member's call (`Aten.addmm.0.backward` for
// `Aten.addmm.0.forward`) pair with the other side's in the same way, the map turned around (a
// backward entry's inputs are the gradients of the forward outputs, its outputs those of the
// forward inputs: `input.N` <-> `output.N`).
#include <map>
#include <unordered_set>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "torchprobe/analysis/compare/rows.hpp"
#include "torchprobe/analysis/compare/user_map.hpp"

namespace torchprobe::compare {

namespace details {

struct GroupArg {
  std::size_t member = 0;
  std::string suffix;  // ".input.1"
};

// "1.input.0" -> {1, ".input.0"}; the direction word is swapped for backward entries.
inline GroupArg group_arg(const std::string& text, bool backward) {
  GroupArg a;
  std::string rest = text;
  const auto dot = rest.find('.');
  if (dot != std::string::npos && dot > 0 && rest.find_first_not_of("0123456789") == dot) {
    a.member = std::stoul(rest.substr(0, dot));
    rest = rest.substr(dot + 1);
  }
  if (backward) {
    if (rest.rfind("input.", 0) == 0)
      rest = "output." + rest.substr(6);
    else if (rest.rfind("output.", 0) == 0)
      rest = "input." + rest.substr(7);
  }
  a.suffix = "." + rest;
  return a;
}

// The first `parts` dot-separated parts of `name` (all of it when it has no more): a view of `name`.
inline std::string_view leading_parts(std::string_view name, int parts) {
  std::size_t dot = std::string_view::npos;
  for (int k = 0; k < parts; ++k) {
    dot = name.find('.', dot + 1);
    if (dot == std::string_view::npos) return name;
  }
  return name.substr(0, dot);
}
// "Aten.addmm.0.forward" -> "Aten.addmm"; "Aten.addmm.0.forward" -> call "Aten.addmm.0".
inline std::string_view api_of(std::string_view name) { return leading_parts(name, 2); }
inline std::string_view call_of(std::string_view name) { return leading_parts(name, 3); }

// The runs of `apis` among `entries` (unpaired, one direction, execution order).
template <class EntryT>
std::vector<std::vector<const EntryT*>> group_runs(const std::vector<const EntryT*>& entries,
                                                   const std::vector<std::string>& apis) {
  std::vector<std::vector<const EntryT*>> runs;
  for (std::size_t i = 0; i + apis.size() <= entries.size(); ++i) {
    bool all = true;
    for (std::size_t k = 0; k < apis.size() && all; ++k) all = api_of(entries[i + k]->name) == apis[k];
    if (!all) continue;
    runs.emplace_back(entries.begin() + static_cast<std::ptrdiff_t>(i),
                      entries.begin() + static_cast<std::ptrdiff_t>(i + apis.size()));
    i += apis.size() - 1;
  }
  return runs;
}

}  // namespace details

// Pairs what the group items of `map` describe, among the entries not yet in `by_target`/`used`.
// (`by_target`: a PairsByTarget, `used`: a TakenEntries; entries.hpp.)
template <class EntryT, class Pairs, class Taken>
void match_groups(const std::vector<EntryT>& target, const std::vector<EntryT>& bench, const UserMap& map,
                  Pairs& by_target, Taken& used) {
  using PairT = typename Pairs::mapped_type;
  const auto unpaired = [&](const std::vector<EntryT>& side, bool is_target, bool forward) {
    std::vector<const EntryT*> out;
    for (const EntryT& e : side) {
      const bool free_ = is_target ? !by_target.count(&e) : !used.count(&e);
      if (free_ && (e.direction == "forward") == forward && !e.is_module()) out.push_back(&e);
    }
    return out;
  };
  for (const UserMap::Group& g : map.groups) {
    const auto truns = details::group_runs(unpaired(target, true, true), g.target);
    const auto bruns = details::group_runs(unpaired(bench, false, true), g.bench);
    // Each side's unpaired backward entries by call ("Aten.addmm.0"), looked up once per run member.
    const auto by_call = [&](const std::vector<const EntryT*>& entries) {
      std::map<std::string, const EntryT*> out;
      for (const EntryT* e : entries) out[std::string(details::call_of(e->name))] = e;
      return out;
    };
    const auto backward_t = by_call(unpaired(target, true, false)), backward_b = by_call(unpaired(bench, false, false));
    for (std::size_t k = 0; k < truns.size() && k < bruns.size(); ++k) {
      // The backward entries of each run's calls, in the run's order.
      const auto backward_of = [](const std::vector<const EntryT*>& run,
                                  const std::map<std::string, const EntryT*>& pool) {
        std::vector<const EntryT*> out(run.size(), nullptr);
        for (std::size_t m = 0; m < run.size(); ++m) {
          const auto found = pool.find(std::string(details::call_of(run[m]->name)));
          if (found != pool.end()) out[m] = found->second;
        }
        return out;
      };
      const auto make = [&](const std::vector<const EntryT*>& t, const std::vector<const EntryT*>& b, bool backward) {
        std::vector<const EntryT*> tm, bm;  // the members present (backward: some calls have none)
        for (const EntryT* e : t)
          if (e) tm.push_back(e);
        for (const EntryT* e : b)
          if (e) bm.push_back(e);
        if (tm.empty() || bm.empty()) return;
        PairT p{tm.front(), bm, tm.size() > 1 ? tm : std::vector<const EntryT*>{}, "map", {}};
        const auto add = [&](const details::GroupArg& ta, const details::GroupArg& ba) {
          const EntryT* te = ta.member < t.size() ? t[ta.member] : nullptr;
          const EntryT* be = ba.member < b.size() ? b[ba.member] : nullptr;
          const Row* tr = te ? te->row(ta.suffix) : nullptr;
          const Row* br = be ? be->row(ba.suffix) : nullptr;
          if (tr && br) p.links.push_back({tr, br, false});
        };
        if (!g.args.empty()) {
          for (const auto& [ta, ba] : g.args) add(details::group_arg(ta, backward), details::group_arg(ba, backward));
        } else {  // inputs to the first call, outputs to the last
          const bool t_single = t.size() == 1;
          const EntryT* single = t_single ? t[0] : b[0];
          if (single) {
            for (const Row* r : single->rows) {
              const std::string_view suffix = single->suffix(*r);
              // forward outputs (backward inputs) belong to the last call, the rest to the first
              const bool to_last = r->is_output() != backward;
              const std::size_t other = to_last ? (t_single ? b.size() : t.size()) - 1 : 0;
              const details::GroupArg mine{0, std::string(suffix)}, theirs{other, std::string(suffix)};
              t_single ? add(mine, theirs) : add(theirs, mine);
            }
          }
        }
        for (const EntryT* e : bm) used.insert(e);
        for (std::size_t i = 1; i < tm.size(); ++i) by_target[tm[i]] = PairT{tm[i], {}, {}, "map", {}};
        by_target[tm.front()] = std::move(p);
      };
      make(truns[k], bruns[k], false);
      make(backward_of(truns[k], backward_t), backward_of(bruns[k], backward_b), true);
    }
  }
}

}  // namespace torchprobe::compare

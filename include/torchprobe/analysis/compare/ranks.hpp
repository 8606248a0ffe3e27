#pragma once
// `torchprobe ranks DUMP`: the rank{R} directories of a step side by side (a data-parallel job's
// ranks should hold the same parameters, and the same result of each all_reduce, broadcast and
// all_gather).
//  - per collective call (Distributed.*.forward): which ranks entered it, whether their inputs'
//    statistics agreed (gradients before an all_reduce usually do not: each rank has its own data)
//    and whether the outputs did;
//  - the first disagreement in dump order of data that should be replicated: a collective's
//    output that is not the same on every rank, or a tensor that every rank but one has with the
//    same statistics (with 3 ranks or more: a parameter or a gradient after all_reduce that one
//    rank holds differently; data of each rank's own differs on all of them and is not named);
//    or a collective that some ranks never entered.
//  - replicated by construction (issue 48), checked whatever the number of ranks: every module's
//    `parameters` (L0 and mix) and the outputs of all_reduce, broadcast and all_gather; a module's
//    `parameters_grad` only where the dump shows it reduced before it was captured (on a rank, an
//    all_reduce entry before it has an output with the gradient's very statistics) or the user says
//    so (--grads-reduced: the gradients are reduced inside backward). Never inferred from agreement:
//    a gradient without that evidence is each rank's own and is not checked. Each step says what it
//    treated as replicated.
// DUMP is a step directory or a dump root (its steps in order; the first step that disagrees).
// Statistics are compared exactly: replicated data computed the same way is bit-equal (a 64-bit
// hash of their canonical spelling, ranks_nodes.hpp, in which a NaN equals a NaN). The ranks are
// read in parallel into compact tables (ranks_table.hpp); the first NaN/inf is ranks_nonfinite.hpp's.
// A rank whose step was recovered incomplete after a crash (`torchprobe recover`) is named as such,
// and an entry it lacks is "not recovered" there, never a collective it did not enter.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "torchprobe/analysis/compare/dump_reader.hpp"
#include "torchprobe/analysis/compare/ranks_nonfinite.hpp"
#include "torchprobe/analysis/compare/ranks_table.hpp"

namespace torchprobe::compare::ranks {

struct CollectiveCall {
  std::string name;                   // "Distributed.all_reduce.0.forward"
  std::vector<long> entered, absent;  // ranks with and without the entry
  bool inputs_agree = true, outputs_agree = true;
  std::vector<long> unrecovered;  // ranks without it whose step was recovered incomplete (not in `absent`)
};

struct Disagreement {
  long step = -1;
  long rank = -1;              // the rank that holds the data differently (or never entered)
  std::string entry;           // "Aten.t.0.forward"
  std::string item;            // "input_args.0"; empty: the rank has no such entry
  std::string shape;           // the tensor's shape, as in dump.json
  std::vector<long> agreeing;  // the ranks that agree with one another
};

// What a step's view treated as replicated, counted once per tensor (not per rank).
struct Replicated {
  long parameters = 0;          // module parameters ("parameters.weight" of a module's forward entry)
  long collective_outputs = 0;  // outputs of all_reduce, broadcast, all_gather
  long gradients = 0;           // parameters_grad tensors shown reduced before capture (or said so)
  long own_gradients = 0;       // parameters_grad tensors without that evidence: each rank's own, not checked
};

struct ViewOptions {
  bool grads_reduced = false;  // the user says the gradients are reduced inside backward
};

struct StepView {
  long step = -1;
  std::vector<long> ranks;
  std::vector<CollectiveCall> collectives;
  std::optional<Disagreement> first;
  std::optional<Disagreement> first_parameter;  // the first module parameter that differs (may follow `first`)
  std::optional<NonFinite> nonfinite;           // the step's first NaN/inf, at its origin (ranks_nonfinite.hpp)
  Replicated replicated;
  std::map<long, std::string> incomplete;  // ranks whose step was recovered incomplete: what is missing
};

namespace details {

inline bool replicated_collective(const std::string& entry) {
  for (const char* api : {"Distributed.all_reduce.", "Distributed.broadcast.", "Distributed.all_gather."})
    if (entry.rfind(api, 0) == 0) return true;
  return false;
}

}  // namespace details

// One step directory's ranks.
inline StepView view_step(const std::filesystem::path& step_dir, long step = -1, const ViewOptions& options = {}) {
  StepView view;
  view.step = step;
  details::Interner strings;
  const std::vector<details::RankTable> tables = details::read_ranks(step_dir, strings);
  std::vector<std::pair<long, const details::RankFirst*>> firsts;
  for (const details::RankTable& t : tables) {
    view.ranks.push_back(t.rank);
    if (!t.missing.empty()) view.incomplete[t.rank] = t.missing;
    firsts.emplace_back(t.rank, t.nonfinite ? &*t.nonfinite : nullptr);
  }
  // Every entry name, in the dump order of the first rank that has it; each rank's row of it.
  std::vector<std::uint32_t> order;
  std::vector<bool> seen(strings.size(), false);
  std::vector<std::vector<std::int32_t>> row_of(tables.size(), std::vector<std::int32_t>(strings.size(), -1));
  for (std::size_t r = 0; r < tables.size(); ++r)
    for (std::size_t i = 0; i < tables[r].entries.size(); ++i) {
      const std::uint32_t name = tables[r].entries[i].name;
      if (row_of[r][name] < 0) row_of[r][name] = static_cast<std::int32_t>(i);
      if (!seen[name]) {
        seen[name] = true;
        order.push_back(name);
      }
    }
  const auto note = [&](Disagreement d) {
    if (!view.first) view.first = std::move(d);
  };
  struct Site {
    std::uint32_t site;
    std::vector<std::pair<long, const details::ItemRow*>> values;  // (rank, item)
    bool shown_reduced = false;  // a gradient: shown reduced before capture on some rank
  };
  std::vector<Site> sites;
  std::unordered_map<std::uint32_t, std::size_t> site_at;   // site id -> its place in `sites`
  std::unordered_map<std::uint64_t, std::size_t> group_at;  // statistics -> its group
  for (const std::uint32_t name : order) {
    const std::string& entry = strings.text(name);
    const bool collective = entry.rfind("Distributed.", 0) == 0;
    CollectiveCall call{entry, {}, {}, true, true, {}};
    const bool gradients = details::is_parameters_grad(entry);
    sites.clear();
    site_at.clear();
    for (std::size_t r = 0; r < tables.size(); ++r) {
      const details::RankTable& t = tables[r];
      const std::int32_t row = row_of[r][name];
      if (row < 0) {  // an incomplete step may just not have it recovered
        (view.incomplete.count(t.rank) ? call.unrecovered : call.absent).push_back(t.rank);
        continue;
      }
      call.entered.push_back(t.rank);
      const details::EntryRow& e = t.entries[static_cast<std::size_t>(row)];
      for (std::uint32_t k = e.first_item; k < e.first_item + e.items; ++k) {
        const details::ItemRow& item = t.items[k];
        // Looked up by hash, not by a scan: an entry of many items, or many ranks, stays linear.
        const auto [at, added] = site_at.emplace(item.site, sites.size());
        if (added) sites.push_back(Site{item.site, {}, false});
        Site* s = &sites[at->second];
        s->values.emplace_back(t.rank, &item);
        if (gradients) {
          const auto reduced = t.reduced_at.find(item.stats);
          if (reduced != t.reduced_at.end() && reduced->second < static_cast<std::uint32_t>(row))
            s->shown_reduced = true;
        }
      }
    }
    if (collective && !call.absent.empty() && !call.entered.empty())
      note({step, call.absent.front(), entry, "", "", call.entered});
    for (const Site& s : sites) {
      const std::string& site = strings.text(s.site);
      const bool parameter = site.rfind("parameters.", 0) == 0;
      const bool reduced_gradient = gradients && (options.grads_reduced || s.shown_reduced);
      const bool replicated_output =
          collective && site.rfind("output", 0) == 0 && details::replicated_collective(entry);
      view.replicated.parameters += parameter;
      view.replicated.collective_outputs += replicated_output;
      view.replicated.gradients += reduced_gradient;
      view.replicated.own_gradients += gradients && !reduced_gradient;
      if (gradients && !reduced_gradient) continue;  // each rank's own gradient: not compared
      // Groups of ranks with equal statistics; the largest first.
      std::vector<std::pair<std::uint64_t, std::vector<long>>> groups;
      group_at.clear();
      for (const auto& [rank, item] : s.values) {
        const auto [g, added] = group_at.emplace(item->stats, groups.size());
        if (added) groups.push_back({item->stats, {}});
        groups[g->second].second.push_back(rank);
      }
      std::stable_sort(groups.begin(), groups.end(),
                       [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
      const bool agree = groups.size() <= 1;
      const bool output = site.rfind("output", 0) == 0;
      if (collective) (output ? call.outputs_agree : call.inputs_agree) &= agree;
      if (agree) continue;
      const std::string& shape = strings.text(s.values.front().second->shape);
      if (parameter || reduced_gradient || replicated_output) {
        Disagreement d{step, groups[1].second.front(), entry, site, shape, groups[0].second};
        if (parameter && !view.first_parameter) view.first_parameter = d;
        note(std::move(d));
      } else if (s.values.size() >= 3 && groups.size() == 2 && groups[1].second.size() == 1) {
        note({step, groups[1].second.front(), entry, site, shape, groups[0].second});
      }
    }
    if (collective) view.collectives.push_back(std::move(call));
  }
  view.nonfinite = first_nonfinite(firsts, step);
  return view;
}

// A step directory, or a dump root: its steps in order, up to the first that disagrees.
inline std::vector<StepView> view_dump(const std::filesystem::path& path, const ViewOptions& options = {}) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) throw InputError(path.string() + ": not a directory");
  const auto steps = compare::details::numbered_dirs(path, "step([0-9]+)");
  std::vector<StepView> views;
  if (steps.empty()) {
    views.push_back(view_step(path, -1, options));
    return views;
  }
  for (const auto& [n, dir] : steps) {
    views.push_back(view_step(dir, n, options));
    if (views.back().first) break;
  }
  return views;
}

inline std::string join(const std::vector<long>& v) {
  std::string s;
  for (long x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s.empty() ? "-" : s;
}

// The text `torchprobe ranks` prints; returns the exit status (0 all agree, 1 a disagreement). A
// non-finite value is said (the dump's first, at its origin) but is no disagreement: the status stays.
inline int print_views(const std::vector<StepView>& views, std::ostream& out) {
  int status = 0;
  bool nonfinite_said = false;
  for (const StepView& v : views) {
    out << "step " << (v.step < 0 ? std::string("?") : std::to_string(v.step)) << ": ranks " << join(v.ranks) << "\n";
    for (const auto& [rank, missing] : v.incomplete)
      out << "  rank " << rank << ": incomplete, recovered after a crash (missing: " << missing
          << "); what it lacks is not counted against it\n";
    for (const CollectiveCall& c : v.collectives) {
      out << "  " << c.name << "  entered by " << join(c.entered);
      if (!c.absent.empty()) out << ", NOT by " << join(c.absent);
      if (!c.unrecovered.empty()) out << ", not recovered on " << join(c.unrecovered) << " (incomplete)";
      out << "; inputs " << (c.inputs_agree ? "agree" : "differ") << ", outputs "
          << (c.outputs_agree ? "agree" : "differ") << "\n";
    }
    const Replicated& r = v.replicated;
    out << "  treated as replicated: " << r.parameters << " module parameters, " << r.collective_outputs
        << " outputs of all_reduce/broadcast/all_gather";
    if (r.gradients + r.own_gradients > 0)
      out << ", " << r.gradients << " parameter gradients reduced before capture (" << r.own_gradients
          << " not: each rank's own)";
    out << "\n";
    const auto say = [&](const char* what, const Disagreement& d) {
      out << what << ": step " << d.step << ", rank " << d.rank << ", " << d.entry;
      if (d.item.empty())
        out << ": never entered (ranks " << join(d.agreeing) << " did)\n";
      else
        out << " " << d.item << " (shape " << d.shape << ") differs from ranks " << join(d.agreeing) << "\n";
    };
    if (v.first) {
      status = 1;
      say("first disagreement", *v.first);
    }
    // At mix level an API entry that reads the parameter (Aten.t) comes before the module's own
    // entry: the module and the parameter's name are then said too.
    if (v.first_parameter && v.first_parameter->entry != v.first->entry)
      say("first module parameter that differs", *v.first_parameter);
    if (const auto& n = v.nonfinite; n && !nonfinite_said) {  // the dump's first; not a disagreement
      nonfinite_said = true;
      out << "first non-finite value: step " << n->step << ", rank " << n->rank << ", " << n->entry << " " << n->item
          << (!n->origin_known   ? " (received through a collective on every rank: the rank that made it is not here)"
              : n->inputs_finite ? " (made there: its inputs are finite)"
                                 : " (already in its inputs: made by code the dump does not show)");
      if (!n->reached.empty()) out << "; reached ranks " << join(n->reached) << " through " << n->through;
      out << "\n";
    }
  }
  if (status == 0) out << "the ranks agree on every replicated value\n";
  return status;
}

}  // namespace torchprobe::compare::ranks

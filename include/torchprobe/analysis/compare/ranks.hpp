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
// Where every rank of a step has the ranks_digest.bin the probe wrote (io/rank_digest.hpp), the
// tables come from the digests, which keep collectives, module parameters and parameter gradients
// (a few bytes a tensor), not each rank's own data: the lone-outlier rule then sees only those, and
// the step says it was read so; --no-digest reads dump.json.
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
#include <unordered_set>
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
  bool digests = true;         // read the ranks' ranks_digest.bin where every rank has one (--no-digest: false)
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
  details::StepSource source;              // the ranks' digests or their dump.json
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
  const std::vector<details::RankTable> tables = details::read_ranks(step_dir, strings, options.digests, &view.source);
  std::vector<std::pair<long, const details::RankFirst*>> firsts;
  for (const details::RankTable& t : tables) {
    view.ranks.push_back(t.rank);
    if (!t.missing.empty()) view.incomplete[t.rank] = t.missing;
    firsts.emplace_back(t.rank, t.nonfinite ? &*t.nonfinite : nullptr);
  }
  // Every entry name, in the dump order of the first rank that has it; each layout's row of it
  // (ranks with the same layout share it, details::Layout).
  std::vector<std::uint32_t> order;
  std::vector<bool> seen(strings.size(), false);
  std::unordered_map<const details::Layout*, std::vector<std::int32_t>> rows;
  std::vector<const std::vector<std::int32_t>*> row_of(tables.size());
  for (std::size_t r = 0; r < tables.size(); ++r) {
    const details::Layout& layout = *tables[r].layout;
    const auto [it, fresh] = rows.try_emplace(&layout);
    row_of[r] = &it->second;
    if (!fresh) continue;
    it->second.assign(strings.size(), -1);
    for (std::size_t i = 0; i < layout.entries.size(); ++i) {
      const std::uint32_t name = layout.entries[i].name;
      if (it->second[name] < 0) it->second[name] = static_cast<std::int32_t>(i);
      if (!seen[name]) {
        seen[name] = true;
        order.push_back(name);
      }
    }
  }
  // Every all_reduce output's statistics of the step, whichever rank: a gradient's are looked up in
  // its own rank's (sorted, of the size of the step) only when some rank has them at all. Mostly a
  // few values, held in cache, where the ranks' own lists together are not.
  std::unordered_set<std::uint64_t> any_reduced;
  for (const details::RankTable& t : tables)
    for (const auto& reduced : t.reduced_at) any_reduced.insert(reduced.first);
  const auto note = [&](Disagreement d) {
    if (!view.first) view.first = std::move(d);
  };
  struct Value {
    long rank;
    std::uint64_t stats;
    std::uint32_t shape;
  };
  struct Site {
    std::uint32_t site;
    std::vector<Value> values;
    bool shown_reduced = false;  // a gradient: shown reduced before capture on some rank
  };
  struct Group {
    std::uint64_t stats;
    std::size_t count;
    long first;  // its first rank
  };
  // Kept from entry to entry with their capacity: an entry of thousands of ranks allocates once.
  std::vector<Site> sites;
  std::size_t used = 0;                                    // sites[0, used) are this entry's
  std::unordered_map<std::uint32_t, std::size_t> site_at;  // site id -> its place in `sites`
  std::vector<std::size_t> slot_of;                        // an entry's items -> their places in `sites`
  std::vector<Group> groups;
  std::unordered_map<std::uint64_t, std::size_t> group_at;  // statistics -> its group
  for (const std::uint32_t name : order) {
    const std::string& entry = strings.text(name);
    const bool collective = entry.rfind("Distributed.", 0) == 0;
    CollectiveCall call{entry, {}, {}, true, true, {}};
    const bool gradients = details::is_parameters_grad(entry);
    used = 0;
    site_at.clear();
    // Ranks of one layout (mostly all of them) place an entry's items in the same sites: looked up
    // once per layout, by hash, not once per rank.
    const details::Layout* placed_layout = nullptr;
    std::int32_t placed_row = -1;
    for (std::size_t r = 0; r < tables.size(); ++r) {
      const details::RankTable& t = tables[r];
      const std::int32_t row = (*row_of[r])[name];
      if (row < 0) {  // an incomplete step may just not have it recovered
        (view.incomplete.count(t.rank) ? call.unrecovered : call.absent).push_back(t.rank);
        continue;
      }
      call.entered.push_back(t.rank);
      const details::EntryRow& e = t.layout->entries[static_cast<std::size_t>(row)];
      if (t.layout.get() != placed_layout || row != placed_row) {
        placed_layout = t.layout.get();
        placed_row = row;
        slot_of.clear();
        for (std::uint32_t k = e.first_item; k < e.first_item + e.items; ++k) {
          const std::uint32_t site = t.layout->items[k].first;
          const auto [at, added] = site_at.emplace(site, used);
          if (added) {
            if (used == sites.size()) sites.emplace_back();
            sites[used].site = site;
            sites[used].values.clear();
            sites[used].shown_reduced = false;
            ++used;
          }
          slot_of.push_back(at->second);
        }
      }
      for (std::uint32_t j = 0; j < e.items; ++j) {
        const std::uint32_t k = e.first_item + j;
        Site& s = sites[slot_of[j]];
        s.values.push_back({t.rank, t.stats[k], t.layout->items[k].second});
        if (gradients && !s.shown_reduced && any_reduced.count(t.stats[k])) {
          const auto reduced = t.reduced(t.stats[k]);
          if (reduced && *reduced < static_cast<std::uint32_t>(row)) s.shown_reduced = true;
        }
      }
    }
    if (collective && !call.absent.empty() && !call.entered.empty())
      note({step, call.absent.front(), entry, "", "", call.entered});
    for (std::size_t i = 0; i < used; ++i) {
      const Site& s = sites[i];
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
      // Groups of ranks with equal statistics, counted; the largest first (the earlier on a tie).
      // Each rank's own data is named only as a lone outlier (two groups, one of a single rank):
      // its counting stops at a third group (a collective's inputs differ on every rank).
      const bool replicated = parameter || reduced_gradient || replicated_output;
      groups.clear();
      group_at.clear();
      for (const Value& value : s.values) {
        const auto [g, added] = group_at.emplace(value.stats, groups.size());
        if (added) groups.push_back({value.stats, 0, value.rank});
        ++groups[g->second].count;
        if (!replicated && groups.size() > 2) break;
      }
      const bool agree = groups.size() <= 1;
      const bool output = site.rfind("output", 0) == 0;
      if (collective) (output ? call.outputs_agree : call.inputs_agree) &= agree;
      if (agree || (!replicated && (groups.size() != 2 || s.values.size() < 3))) continue;
      std::stable_sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) { return a.count > b.count; });
      if (!replicated && groups[1].count != 1) continue;
      if (view.first && !(parameter && !view.first_parameter)) continue;  // already said
      std::vector<long> agreeing;                                         // the largest group's ranks, listed only now
      for (const Value& value : s.values)
        if (value.stats == groups[0].stats) agreeing.push_back(value.rank);
      Disagreement d{step, groups[1].first, entry, site, strings.text(s.values.front().shape), std::move(agreeing)};
      if (parameter && !view.first_parameter) view.first_parameter = d;
      note(std::move(d));
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

// "0,1,3"; a list of more than 16 ranks (a job too big to list) with its runs as ranges: "0-1023,1025-4095".
inline std::string join(const std::vector<long>& v) {
  std::string s;
  const bool ranges = v.size() > 16;
  for (std::size_t i = 0; i < v.size();) {
    std::size_t j = i;
    while (ranges && j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(v[i]);
    if (j >= i + 2) {
      s += "-" + std::to_string(v[j]);
      i = j + 1;
    } else {
      i = i + 1;
    }
  }
  return s.empty() ? "-" : s;
}

// The text `torchprobe ranks` prints; returns the exit status (0 all agree, 1 a disagreement). A
// non-finite value is said (the dump's first, at its origin) but is no disagreement: the status stays.
inline int print_views(const std::vector<StepView>& views, std::ostream& out) {
  int status = 0;
  bool nonfinite_said = false;
  for (const StepView& v : views) {
    out << "step " << (v.step < 0 ? std::string("?") : std::to_string(v.step)) << ": ranks " << join(v.ranks) << "\n";
    if (v.source.digests)
      out << "  read from the ranks' " << io::kRankDigestFile << " ("
          << (v.source.digest_bytes / std::max<std::size_t>(1, v.ranks.size()) + 512) / 1024
          << " KB a rank): collectives, module parameters and parameter gradients; each rank's own data is "
             "only in dump.json (--no-digest reads it)\n";
    if (!v.source.note.empty()) out << "  " << v.source.note << "\n";
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

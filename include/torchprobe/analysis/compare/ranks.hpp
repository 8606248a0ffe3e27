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
// DUMP is a step directory or a dump root (its steps in order; the first step that disagrees).
// Statistics are compared exactly: replicated data computed the same way is bit-equal.
// A rank whose step was recovered incomplete after a crash (`torchprobe recover`) is named as such,
// and an entry it lacks is "not recovered" there, never a collective it did not enter.
#include <algorithm>
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

struct StepView {
  long step = -1;
  std::vector<long> ranks;
  std::vector<CollectiveCall> collectives;
  std::optional<Disagreement> first;
  std::map<long, std::string> incomplete;  // ranks whose step was recovered incomplete: what is missing
};

namespace details {

using Json = nlohmann::ordered_json;

// The tensor items of an entry, as ("input_args.0", item) in dump order.
inline void tensor_items(const Json& v, const std::string& site,
                         std::vector<std::pair<std::string, const Json*>>& out) {
  if (v.is_object() && (v.contains("Max") || v.contains("md5")) && v.contains("shape")) {
    out.emplace_back(site, &v);
  } else if (v.is_array()) {
    for (std::size_t i = 0; i < v.size(); ++i) tensor_items(v[i], site + "." + std::to_string(i), out);
  } else if (v.is_object()) {
    for (const auto& kv : v.items()) tensor_items(kv.value(), site + "." + kv.key(), out);
  }
}

inline Json stats_of(const Json& item) {
  Json s = Json::object();
  for (const char* k : {"dtype", "shape", "Max", "Min", "Mean", "Norm", "md5"})
    if (item.contains(k)) s[k] = item[k];
  return s;
}

inline bool replicated_collective(const std::string& entry) {
  for (const char* api : {"Distributed.all_reduce.", "Distributed.broadcast.", "Distributed.all_gather."})
    if (entry.rfind(api, 0) == 0) return true;
  return false;
}

}  // namespace details

// One step directory's ranks.
inline StepView view_step(const std::filesystem::path& step_dir, long step = -1) {
  using details::Json;
  StepView view;
  view.step = step;
  std::map<long, Json> data;
  for (const auto& [rank, dir] : compare::details::rank_dirs(step_dir)) {
    if (!std::filesystem::exists(dir / "dump.json")) continue;
    const Json doc = read_json_file(dir / "dump.json");
    if (!doc.contains("data") || !doc["data"].is_object())
      throw InputError((dir / "dump.json").string() + ": no \"data\"");
    data[rank] = doc["data"];
    view.ranks.push_back(rank);
    if (std::string missing = recovery_missing(doc); !missing.empty()) view.incomplete[rank] = std::move(missing);
  }
  // Every entry name, in the dump order of the first rank that has it.
  std::vector<std::string> order;
  std::map<std::string, bool> seen;
  for (const auto& [rank, d] : data)
    for (const auto& kv : d.items())
      if (!seen[kv.key()]) {
        seen[kv.key()] = true;
        order.push_back(kv.key());
      }
  // Each rank's entries by name. ordered_json finds a key by walking its members, and every rank
  // is asked for every entry: quadratic in the entries (12 s for a dump.json of 1 MB).
  std::map<long, std::unordered_map<std::string, const Json*>> by_name;
  for (const auto& [rank, d] : data) {
    auto& names = by_name[rank];
    names.reserve(d.size());
    for (const auto& kv : d.items()) names.emplace(kv.key(), &kv.value());
  }
  const auto note = [&](Disagreement d) {
    if (!view.first) view.first = std::move(d);
  };
  for (const std::string& entry : order) {
    const bool collective = entry.rfind("Distributed.", 0) == 0;
    CollectiveCall call{entry, {}, {}, true, true, {}};
    std::map<std::string, std::vector<std::pair<long, Json>>> by_site;  // site -> (rank, stats)
    std::vector<std::string> sites;
    for (const auto& [rank, names] : by_name) {
      const auto found = names.find(entry);
      if (found == names.end()) {  // an incomplete step may just not have it recovered
        (view.incomplete.count(rank) ? call.unrecovered : call.absent).push_back(rank);
        continue;
      }
      call.entered.push_back(rank);
      const Json& e = *found->second;
      std::vector<std::pair<std::string, const Json*>> items;
      for (const char* section : {"input_args", "input_kwargs", "output"})
        if (e.contains(section)) details::tensor_items(e[section], section, items);
      for (const auto& [site, item] : items) {
        if (!by_site.count(site)) sites.push_back(site);
        by_site[site].emplace_back(rank, details::stats_of(*item));
      }
    }
    if (collective && !call.absent.empty() && !call.entered.empty())
      note({step, call.absent.front(), entry, "", "", call.entered});
    for (const std::string& site : sites) {
      const auto& values = by_site[site];
      // Groups of ranks with equal statistics; the largest first.
      std::vector<std::pair<Json, std::vector<long>>> groups;
      for (const auto& [rank, s] : values) {
        const Json& stats = s;  // clang before 16 cannot capture a structured binding
        auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == stats; });
        if (g == groups.end())
          groups.push_back({s, {rank}});
        else
          g->second.push_back(rank);
      }
      std::stable_sort(groups.begin(), groups.end(),
                       [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
      const bool agree = groups.size() <= 1;
      const bool output = site.rfind("output", 0) == 0;
      if (collective) (output ? call.outputs_agree : call.inputs_agree) &= agree;
      if (agree) continue;
      const std::string shape = values.front().second.value("shape", Json()).dump();
      if (collective && output && details::replicated_collective(entry)) {
        note({step, groups[1].second.front(), entry, site, shape, groups[0].second});
      } else if (values.size() >= 3 && groups.size() == 2 && groups[1].second.size() == 1) {
        note({step, groups[1].second.front(), entry, site, shape, groups[0].second});
      }
    }
    if (collective) view.collectives.push_back(std::move(call));
  }
  return view;
}

// A step directory, or a dump root: its steps in order, up to the first that disagrees.
inline std::vector<StepView> view_dump(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) throw InputError(path.string() + ": not a directory");
  const auto steps = compare::details::numbered_dirs(path, "step([0-9]+)");
  std::vector<StepView> views;
  if (steps.empty()) {
    views.push_back(view_step(path));
    return views;
  }
  for (const auto& [n, dir] : steps) {
    views.push_back(view_step(dir, n));
    if (views.back().first) break;
  }
  return views;
}

inline std::string join(const std::vector<long>& v) {
  std::string s;
  for (long x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s.empty() ? "-" : s;
}

// The text `torchprobe ranks` prints; returns the exit status (0 all agree, 1 a disagreement).
inline int print_views(const std::vector<StepView>& views, std::ostream& out) {
  int status = 0;
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
    if (const auto& d = v.first) {
      status = 1;
      out << "first disagreement: step " << d->step << ", rank " << d->rank << ", " << d->entry;
      if (d->item.empty())
        out << ": never entered (ranks " << join(d->agreeing) << " did)\n";
      else
        out << " " << d->item << " (shape " << d->shape << ") differs from ranks " << join(d->agreeing) << "\n";
    }
  }
  if (status == 0) out << "the ranks agree on every replicated value\n";
  return status;
}

}  // namespace torchprobe::compare::ranks

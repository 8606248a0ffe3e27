#pragma once
// What compare asks of blame by replay (blame_replay.hpp, which needs libtorch) and what it does with
// the answers, without libtorch: which entries are blamed (the source and the next diverging ones,
// module entries through the API calls inside them), which of their inputs come from no recorded
// call (parameters, the model's input), the "blame" of first_divergence.json, and the CSV's columns
// after msprobe's.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "torchprobe/analysis/compare/first_divergence.hpp"
#include "torchprobe/analysis/compare/msprobe_table.hpp"
#include "torchprobe/analysis/compare/python_text.hpp"

namespace torchprobe::compare {

namespace details {

inline std::string row_fingerprint(const Row& r) {
  std::string f(r.dtype.view());
  f.append("|").append(r.shape.view());
  for (int s = 0; s < 4; ++s) f.append("|").append(r.stat(s).dump());
  return f;
}

// The part of a row's name after its entry's: "input.1", "output.0", "input.weight".
inline std::string row_suffix(const Row& r) {
  const std::string_view e = r.entry();
  std::string_view n = r.name;
  if (n.rfind(e, 0) == 0) n.remove_prefix(e.size());
  if (!n.empty() && n.front() == '.') n.remove_prefix(1);
  return std::string(n);
}

// One call on each side (a template, an alignment or a map may pair one call with several).
inline bool one_to_one(const EntryPair& p) { return p.bench.size() == 1 && p.target_group.empty(); }

// "Aten.addmm.0.forward" and "Aten.addmm.0.backward" -> "Aten.addmm.0": the call both belong to.
inline std::string_view call_name(std::string_view entry) {
  for (const std::string_view d : {std::string_view(".forward"), std::string_view(".backward")})
    if (entry.size() > d.size() && entry.substr(entry.size() - d.size()) == d)
      return entry.substr(0, entry.size() - d.size());
  return entry;
}

// Is the module entry `module` on the chain of modules around `entry` (construct.json)?
inline bool inside_module(const Dump& d, std::string_view entry, std::string_view module) {
  std::string_view cur = entry;
  for (int depth = 0; depth < 256; ++depth) {
    const auto it = d.parents.find(cur);
    if (it == d.parents.end()) return false;
    if (it->second == module) return true;
    cur = it->second;
  }
  return false;
}

}  // namespace details

// The entries blamed: the source (else the first diverging entry) and the diverging entries after it
// in execution order, `most` of them; with, for each module entry among them, the forward API pairs
// inside it (which are what is replayed).
struct BlamePlan {
  std::vector<const EntryVerdict*> entries;                               // what first_divergence.json's "blame" lists
  std::map<const EntryVerdict*, std::vector<const EntryVerdict*>> inner;  // a module's API pairs
  std::vector<const EntryVerdict*> replayed;                              // the API pairs the request holds, in order
  std::map<const EntryVerdict*, const EntryVerdict*> forward_of;          // a backward pair's forward pair
};

inline bool diverging(const EntryVerdict& v) { return v.inputs_diverge || v.outputs_diverge; }

inline BlamePlan blame_plan(const Dump& t, const Judgement& j, std::size_t most) {
  BlamePlan plan;
  const EntryVerdict* from = j.source != nullptr ? j.source : j.first_diverging;
  if (from == nullptr || most == 0) return plan;
  std::set<const EntryVerdict*> queued;
  // A backward entry is replayed through its forward call's pair (the arguments it was called with).
  std::unordered_map<std::string_view, const EntryVerdict*> forward_of;
  for (const EntryVerdict& w : j.verdicts)
    if (w.pair->target->direction == "forward") forward_of.emplace(details::call_name(w.pair->target->name), &w);
  const auto replay = [&](const EntryVerdict* v) {
    if (!details::one_to_one(*v->pair) || queued.count(v)) return;
    if (v->pair->target->direction == "backward") {
      const auto f = forward_of.find(details::call_name(v->pair->target->name));
      if (f == forward_of.end() || !details::one_to_one(*f->second->pair)) return;
      plan.forward_of[v] = f->second;
    } else if (v->pair->target->direction != "forward") {
      return;
    }
    queued.insert(v);
    plan.replayed.push_back(v);
  };
  for (const EntryVerdict* v = from; v != j.verdicts.data() + j.verdicts.size() && plan.entries.size() < most; ++v) {
    if (v != from && !diverging(*v)) continue;
    plan.entries.push_back(v);
    if (!v->pair->target->is_module()) {
      replay(v);
      continue;
    }
    // Its API calls, in execution order; a module's parameters_grad entry through its backward's calls.
    const bool grads = v->pair->target->direction == "parameters_grad";
    std::string module(v->pair->target->name);
    if (grads) module.replace(module.rfind(".parameters_grad"), 16, ".backward");
    const std::string_view direction = grads ? "backward" : v->pair->target->direction;
    for (const EntryVerdict& w : j.verdicts) {
      if (w.pair->target->is_module() || w.pair->target->direction != direction) continue;
      if (!details::inside_module(t, w.pair->target->name, module)) continue;
      plan.inner[v].push_back(&w);
      replay(&w);
    }
  }
  return plan;
}

// The request blame_replay answers: the two dump.json files and, per replayed pair, its entries and
// its linked inputs, each marked "leaf" when no earlier recorded call of the target made a tensor of
// the same dtype, shape and statistics (a parameter, or the model's input).
inline nlohmann::ordered_json blame_request(const Dump& t, const Dump& b, const Judgement& j, const BlamePlan& plan) {
  using OJson = nlohmann::ordered_json;
  std::unordered_map<std::string, std::size_t> made;  // output fingerprint -> first entry making it
  for (const Entry& e : j.target_entries)
    for (const Row* r : e.rows)
      if (r->place == Row::kOutput) made.emplace(details::row_fingerprint(*r), e.index);
  OJson req;
  req["target"] = t.file.string();
  req["bench"] = b.file.string();
  req["pairs"] = OJson::array();
  for (const EntryVerdict* v : plan.replayed) {
    OJson pair;
    pair["entry"] = v->pair->target->name;
    pair["bench_entry"] = v->pair->bench.front()->name;
    const auto fwd = plan.forward_of.find(v);
    if (fwd != plan.forward_of.end()) {
      pair["forward_entry"] = fwd->second->pair->target->name;
      pair["bench_forward_entry"] = fwd->second->pair->bench.front()->name;
    }
    // The call's inputs: a backward entry's are its forward's.
    const EntryPair& p = fwd != plan.forward_of.end() ? *fwd->second->pair : *v->pair;
    pair["inputs"] = OJson::array();
    for (const RowLink& l : p.links) {
      if (l.target->place != Row::kInput || l.bench == nullptr) continue;
      const auto it = made.find(details::row_fingerprint(*l.target));
      const bool leaf = it == made.end() || it->second >= p.target->index;
      pair["inputs"].push_back(
          {{"row", details::row_suffix(*l.target)}, {"bench_row", details::row_suffix(*l.bench)}, {"leaf", leaf}});
    }
    req["pairs"].push_back(pair);
  }
  return req;
}

namespace details {
inline bool blamed_as_cause(const std::string& verdict) {
  return verdict == "introduced here" || verdict == "parameter source" || verdict == "bench less exact than target";
}
}  // namespace details

// first_divergence.json's "blame" (one object per planned entry, execution order) and
// "blame_summary", from blame_replay's answer. A module entry takes the verdict of the first API
// call inside it that is a cause, else "propagated" (or "rounding") when all of them are; "via"
// names the call.
inline void add_blame(nlohmann::ordered_json& report, const BlamePlan& plan, const nlohmann::ordered_json& answer) {
  using OJson = nlohmann::ordered_json;
  std::map<const EntryVerdict*, OJson> by_pair;
  const OJson& got = answer.contains("entries") ? answer["entries"] : OJson::array();
  for (std::size_t i = 0; i < plan.replayed.size() && i < got.size(); ++i) by_pair[plan.replayed[i]] = got[i];
  OJson list = OJson::array();
  std::vector<std::string> causes;
  std::size_t rounding = 0, propagated = 0, unreplayed = 0;
  for (const EntryVerdict* v : plan.entries) {
    OJson o;
    const auto it = by_pair.find(v);
    if (it != by_pair.end()) {
      o = it->second;
    } else if (v->pair->target->is_module()) {
      o["entry"] = v->pair->target->name;
      o["bench_entry"] = v->pair->bench.front()->name;
      const auto inner = plan.inner.find(v);
      std::string verdict = "not replayed", via, why = "no API call inside it was replayed";
      if (inner != plan.inner.end()) {
        bool all_quiet = true, any_propagated = false;
        for (const EntryVerdict* w : inner->second) {
          const auto r = by_pair.find(w);
          const std::string wv = r == by_pair.end() ? "not replayed" : r->second.value("verdict", "not replayed");
          if (details::blamed_as_cause(wv)) {
            verdict = wv;
            via = std::string(w->pair->target->name);
            why = "through " + via;
            all_quiet = false;
            break;
          }
          if (wv == "propagated") any_propagated = true;
          if (wv != "propagated" && wv != "rounding") all_quiet = false;
        }
        if (via.empty() && all_quiet && !inner->second.empty()) {
          verdict = any_propagated ? "propagated" : "rounding";
          why = "every API call inside it is " + verdict;
        }
      }
      o["verdict"] = verdict;
      o["why"] = why;
      if (!via.empty()) o["via"] = via;
    } else {
      o["entry"] = v->pair->target->name;
      o["bench_entry"] = v->pair->bench.front()->name;
      o["verdict"] = "not replayed";
      o["why"] = !details::one_to_one(*v->pair)
                     ? "a pair of several calls on one side (" + v->pair->method + ") is not replayed"
                 : v->pair->target->direction == "backward"
                     ? "its forward call is not paired one to one, so its arguments are not known"
                     : "a " + std::string(v->pair->target->direction) + " entry is not replayed";
    }
    const std::string verdict = o.value("verdict", "");
    if (details::blamed_as_cause(verdict)) {
      // A module's cause is its call's, counted once: by the call where the list holds it.
      const bool call_listed =
          o.contains("via") && std::any_of(plan.entries.begin(), plan.entries.end(), [&](const EntryVerdict* w) {
            return w->pair->target->name == o["via"].get<std::string>();
          });
      if (!call_listed) causes.push_back(verdict + ": " + o.value("entry", ""));
    } else if (verdict == "rounding")
      ++rounding;
    else if (verdict == "propagated")
      ++propagated;
    else
      ++unreplayed;
    list.push_back(o);
  }
  report["blame"] = list;
  std::string s;
  if (!causes.empty()) {
    s = causes.front();
    if (causes.size() > 1) s += " (and " + std::to_string(causes.size() - 1) + " more causes)";
  } else if (list.empty()) {
    s = "nothing to blame";
  } else if (unreplayed == list.size()) {
    s = "no entry could be replayed";
  } else {
    s = "no entry introduces an error beyond the expected rounding: the divergence is rounding (" +
        std::to_string(rounding) + " entries) carried on (" + std::to_string(propagated) + " propagated)";
  }
  if (unreplayed > 0 && !list.empty() && unreplayed < list.size())
    s += "; " + std::to_string(unreplayed) + " not replayed";
  report["blame_summary"] = s;
}

// The CSV's columns after msprobe's, filled on the output rows of the blamed entries.
inline ExtraColumns blame_columns(const nlohmann::ordered_json& report) {
  ExtraColumns x;
  x.header = {"Blame", "Local Err", "Propagated Err", "NPU Err vs Float64", "Bench Err vs Float64"};
  auto by_entry = std::make_shared<std::map<std::string, std::vector<std::string>, std::less<>>>();
  if (report.contains("blame"))
    for (const auto& o : report["blame"]) {
      const auto text = [&](const char* k) {
        if (!o.contains(k)) return std::string();
        return o[k].is_number() ? py_str(o[k]) : o[k].get<std::string>();
      };
      (*by_entry)[o.value("entry", "")] = {o.value("verdict", ""), text("local"), text("propagated"),
                                           text("target_error_vs_float64"), text("bench_error_vs_float64")};
    }
  x.cells = [by_entry](const Row& npu, std::vector<std::string>& out) {
    const auto it = npu.place == Row::kOutput ? by_entry->find(npu.entry()) : by_entry->end();
    if (it == by_entry->end())
      out.assign(5, std::string());
    else
      out = it->second;
  };
  return x;
}

}  // namespace torchprobe::compare

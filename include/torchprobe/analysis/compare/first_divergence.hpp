#pragma once
// The answer of `torchprobe compare`: the first paired entry, in execution order (forward, then
// backward), whose output diverges while its inputs do not (the "source"), its innermost diverging
// op, stack frames (stack.json) and module chain (construct.json); the first overflow of each side
// (finite inputs, non-finite output); what stayed unmatched. Written as first_divergence.json.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "torchprobe/analysis/compare/judge.hpp"
#include "torchprobe/analysis/compare/unmatched_reasons.hpp"

namespace torchprobe::compare {

struct Judgement;
namespace details {
std::vector<std::string> unmatched_before(const Judgement& j, const EntryVerdict& v);
}

struct Judgement {
  JudgeMode mode = JudgeMode::tol;
  double threshold = 0;
  std::vector<Entry> target_entries, bench_entries;
  Matching matching;
  std::vector<EntryVerdict> verdicts;  // in execution order
  const EntryVerdict* source = nullptr;
  const EntryVerdict* first_diverging = nullptr;  // first entry with any diverging row
  const EntryVerdict* first_backward_source = nullptr;
  const Entry* target_overflow = nullptr;
  const Entry* bench_overflow = nullptr;
  StatsOrigin target_origin = StatsOrigin::unknown, bench_origin = StatsOrigin::unknown;
  bool float_sums = false;                // the accumulation allowance applies (statistics_origin.hpp)
  std::size_t rows_within_allowance = 0;  // rows it kept from diverging
  // The side whose Mean and Norm are the more exact, when one is TorchProbe's and the other not.
  const char* more_exact() const {
    if (target_origin == bench_origin) return "neither";
    if (target_origin == StatsOrigin::torchprobe) return "target";
    if (bench_origin == StatsOrigin::torchprobe) return "bench";
    return "neither";
  }

  bool diverged() const {
    return first_diverging != nullptr || (target_overflow != nullptr) != (bench_overflow != nullptr);
  }
  std::string summary_line() const {
    std::string s =
        std::to_string(matching.pairs.size()) + " paired entries, " + std::to_string(matching.target_only.size()) +
        " target-only, " + std::to_string(matching.bench_only.size()) + " bench-only" +
        (matching.explained.empty() ? std::string()
                                    : ", " + std::to_string(matching.explained.size()) + " one side has by nature") +
        "; ";
    std::string sums;
    if (rows_within_allowance > 0)
      sums = "; " + std::to_string(rows_within_allowance) +
             " rows differ in Mean or Norm only as float sums do (the more exact side: " + more_exact() + ")";
    if (source) return s + "first divergence (source): " + std::string(source->pair->target->name) + sums;
    if (first_diverging) {
      // A call one side makes alone since the last clean pair is the cause: name it.
      const auto alone = first_diverging->inputs_diverge ? details::unmatched_before(*this, *first_diverging)
                                                         : std::vector<std::string>{};
      if (!alone.empty())
        return s + "divergence from " + std::string(first_diverging->pair->target->name) +
               ", after a call one side makes alone (" + alone.front() + ")" + sums;
      return s + "divergence from " + std::string(first_diverging->pair->target->name) + " (no clean source)" + sums;
    }
    return s + "no divergence" + sums;
  }
};

namespace details {
// The first entry, in execution order, whose inputs are all finite and some output is not.
inline const Entry* first_overflow(const std::vector<Entry>& entries) {
  // Execution order: forward entries first, each part in dump order (the entries' own order).
  std::vector<const Entry*> order;
  order.reserve(entries.size());
  for (const Entry& e : entries) order.push_back(&e);
  std::stable_partition(order.begin(), order.end(), [](const Entry* e) { return e->direction == "forward"; });
  for (const Entry* e : order) {
    bool finite_in = true, bad_out = false;
    for (const Row* r : e->rows) {
      for (int s = 0; s < 2; ++s) {
        const auto v = number(r->stat(s));
        if (!v || std::isfinite(*v)) continue;
        if (r->is_output())
          bad_out = true;
        else
          finite_in = false;
      }
    }
    if (finite_in && bad_out) return e;
  }
  return nullptr;
}

inline nlohmann::ordered_json module_chain(const Dump& d, std::string_view entry) {
  auto chain = nlohmann::ordered_json::array();
  std::string_view cur = entry;
  for (int depth = 0; depth < 256; ++depth) {
    const auto it = d.parents.find(cur);
    if (it == d.parents.end()) break;
    chain.push_back(std::string(it->second));
    cur = it->second;
  }
  return chain;
}

inline nlohmann::ordered_json stack_of(const Dump& d, std::string_view entry) {
  const auto it = d.stacks.find(std::string(entry));
  return it == d.stacks.end() ? nlohmann::ordered_json::array() : it->second;
}
}  // namespace details

namespace details {
// The unmatched entries (by nature ones too, marked) between the last pair judged before v and v.
inline std::vector<std::string> unmatched_before(const Judgement& j, const EntryVerdict& v) {
  std::size_t t_from = 0, b_from = 0;
  for (const EntryVerdict& w : j.verdicts) {
    if (&w == &v) break;
    t_from = std::max(t_from, w.pair->target->index);
    for (const Entry* e : w.pair->bench) b_from = std::max(b_from, e->index);
  }
  const std::size_t t_to = v.pair->target->index;
  const std::size_t b_to = v.pair->bench.empty() ? 0 : v.pair->bench.front()->index;
  const auto inside = [&](const Entry* e, bool target) {
    return target ? e->index > t_from && e->index < t_to : e->index > b_from && e->index < b_to;
  };
  std::vector<std::string> cause;
  for (const Entry* e : j.matching.target_only)
    if (inside(e, true)) cause.push_back("target: " + std::string(e->name));
  for (const Entry* e : j.matching.bench_only)
    if (inside(e, false)) cause.push_back("bench: " + std::string(e->name));
  for (const auto& x : j.matching.explained)
    if (!x.entry->is_module() && inside(x.entry, x.target_side))
      cause.push_back(std::string(x.target_side ? "target: " : "bench: ") + std::string(x.entry->name) +
                      " (by nature)");
  return cause;
}
}  // namespace details

inline Judgement judge(const Dump& t, const Dump& b, const std::vector<Row>& trows, const std::vector<Row>& brows,
                       CsvMode csv_mode, JudgeMode mode, double threshold, const UserMap* user_map = nullptr) {
  Judgement j;
  j.mode = mode;
  j.threshold = threshold >= 0 ? threshold : mode == JudgeMode::tol ? kDefaultTolEpsilons : 0.5;
  if (mode == JudgeMode::exact) j.threshold = 0;
  j.target_origin = stats_origin(t);
  j.bench_origin = stats_origin(b);
  j.float_sums = mode == JudgeMode::tol &&
                 (j.target_origin != StatsOrigin::torchprobe || j.bench_origin != StatsOrigin::torchprobe);
  j.target_entries = dump_entries(trows);
  j.bench_entries = dump_entries(brows);
  j.matching = match_entries(j.target_entries, j.bench_entries, user_map, &t.parents, &b.parents);
  j.matching.explained =
      explain_unmatched(j.matching, j.target_entries, j.bench_entries, t, b, j.target_origin, j.bench_origin);
  RowSet st;
  std::vector<Row> sb;
  std::map<const Row*, int> levels;
  if (mode == JudgeMode::msprobe) levels = msprobe_levels(j.matching, csv_mode, st, sb);
  // Execution order: forward pairs first, each part in target order (the pairs' own order).
  std::vector<const EntryPair*> order;
  order.reserve(j.matching.pairs.size());
  for (const EntryPair& p : j.matching.pairs) order.push_back(&p);
  std::stable_partition(order.begin(), order.end(),
                        [](const EntryPair* p) { return p->target->direction == "forward"; });
  j.verdicts.reserve(order.size());
  for (const EntryPair* p : order)
    j.verdicts.push_back(judge_pair(*p, mode, j.threshold, csv_mode == CsvMode::md5, levels, j.float_sums));
  for (EntryVerdict& v : j.verdicts) {
    j.rows_within_allowance += v.rows_within_allowance;
    if (!j.first_diverging && (v.inputs_diverge || v.outputs_diverge)) {
      j.first_diverging = &v;
      // Its inputs differ though every pair before it is clean and no call is missing in between:
      // what differs first is what it was given (a weight, or data no recorded call made), so it is
      // the source. Not in msprobe mode, whose verdicts are msprobe's.
      if (mode != JudgeMode::msprobe && v.inputs_diverge && !v.source && v.pair->target->direction == "forward" &&
          details::unmatched_before(j, v).empty())
        v.source = v.inputs_source = true;
    }
    if (!j.source && v.source) j.source = &v;
    if (!j.first_backward_source && v.source && v.pair->target->direction != "forward") j.first_backward_source = &v;
  }
  j.target_overflow = details::first_overflow(j.target_entries);
  j.bench_overflow = details::first_overflow(j.bench_entries);
  return j;
}

inline nlohmann::ordered_json verdict_json(const Dump& t, const Dump& b, const Judgement& j, const EntryVerdict& v) {
  using nlohmann::ordered_json;
  ordered_json o;
  const EntryPair& p = *v.pair;
  o["entry"] = p.target->name;
  auto members = ordered_json::array();
  for (const Entry* e : p.target_group) members.push_back(e->name);
  if (!members.empty()) o["target_group"] = members;
  auto bench = ordered_json::array();
  for (const Entry* e : p.bench) bench.push_back(e->name);
  o["bench_entries"] = bench;
  o["match"] = p.method;
  o["role"] = v.inputs_source     ? "source: its inputs (a weight or data no recorded call made)"
              : v.source          ? "source"
              : v.outputs_diverge ? "propagated"
                                  : "inputs differ";
  o["direction"] = p.target->direction;
  o["input_error"] = details::num(v.input_error);
  o["output_error"] = details::num(v.output_error);
  o["worst_input_row"] = v.worst_input;
  o["worst_output_row"] = v.worst_output;
  // innermost op: the first diverging API entry inside this module (an API is its own innermost op)
  std::string_view innermost = p.target->name;
  if (p.target->is_module()) {
    for (const EntryVerdict& w : j.verdicts) {
      if (w.pair->target->is_module() || !(w.inputs_diverge || w.outputs_diverge)) continue;
      const auto chain = details::module_chain(t, w.pair->target->name);
      if (std::find(chain.begin(), chain.end(), p.target->name) != chain.end()) {
        innermost = w.pair->target->name;
        break;
      }
    }
  }
  o["innermost_op"] = innermost;
  o["stack"] = details::stack_of(t, p.target->name);
  o["module_chain"] = details::module_chain(t, p.target->name);
  if (!p.bench.empty()) {
    o["bench_stack"] = details::stack_of(b, p.bench.front()->name);
    // The bench's modules around it: Python sees every module call, C++ only those it can (a
    // parameter-free torch::nn module without a ModuleGuard is invisible there).
    o["bench_module_chain"] = details::module_chain(b, p.bench.front()->name);
  }
  return o;
}

inline nlohmann::ordered_json first_divergence_json(const Dump& t, const Dump& b, const Judgement& j) {
  using nlohmann::ordered_json;
  ordered_json o;
  o["target"] = t.file.string();
  o["bench"] = b.file.string();
  o["mode"] = judge_mode_name(j.mode);
  o["threshold"] = j.threshold;
  o["unit"] = j.mode == JudgeMode::tol     ? "dtype epsilons, relative to the tensor's range"
              : j.mode == JudgeMode::exact ? "0 equal, inf different"
                                           : "1 where msprobe's Result is error";
  o["diverged"] = j.diverged();
  std::map<std::string, int> methods;
  for (const EntryPair& p : j.matching.pairs) ++methods[p.method];
  ordered_json counts;
  counts["target_entries"] = j.target_entries.size();
  counts["bench_entries"] = j.bench_entries.size();
  counts["paired"] = j.matching.pairs.size();
  for (const auto& [k, n] : methods) counts["paired_" + k] = n;
  counts["target_only"] = j.matching.target_only.size();
  counts["bench_only"] = j.matching.bench_only.size();
  if (!j.matching.explained.empty()) {
    std::size_t on_target = 0;
    for (const auto& x : j.matching.explained) on_target += x.target_side;
    counts["target_only_by_nature"] = on_target;
    counts["bench_only_by_nature"] = j.matching.explained.size() - on_target;
  }
  counts["diverging_entries"] = std::count_if(j.verdicts.begin(), j.verdicts.end(), [](const EntryVerdict& v) {
    return v.inputs_diverge || v.outputs_diverge;
  });
  o["summary"] = counts;
  ordered_json stats;
  stats["target"] = stats_origin_text(j.target_origin);
  stats["bench"] = stats_origin_text(j.bench_origin);
  stats["more_exact"] = j.more_exact();
  stats["float_sum_allowance"] = j.float_sums ? "Mean and Norm of a float32/float16/bfloat16 tensor of n elements may "
                                                "differ by n/1024 dtype epsilons beyond the threshold"
                                              : "none: both sides sum in float64";
  stats["rows_within_allowance"] = j.rows_within_allowance;
  o["statistics"] = stats;
  o["first_divergence"] = j.source ? verdict_json(t, b, j, *j.source) : ordered_json();
  if (j.first_diverging) {
    ordered_json f = verdict_json(t, b, j, *j.first_diverging);
    // Diverging inputs after clean entries: the unmatched entries since the last clean pair are the cause.
    // (Also when its inputs were cast: the casts are then the unmatched calls before it.)
    if (j.first_diverging->inputs_diverge || j.first_diverging->cast_inputs)
      f["unmatched_before"] = details::unmatched_before(j, *j.first_diverging);
    o["first_diverging_entry"] = f;
  } else {
    o["first_diverging_entry"] = ordered_json();
  }
  o["first_backward_source"] =
      j.first_backward_source ? verdict_json(t, b, j, *j.first_backward_source) : ordered_json();
  const auto overflow = [&](const Entry* e, const Dump& d) {
    if (!e) return ordered_json();
    ordered_json x;
    x["entry"] = e->name;
    std::string partner, method = "unmatched";
    for (const EntryPair& p : j.matching.pairs) {
      const bool hit = &d == &t ? p.target == e : std::find(p.bench.begin(), p.bench.end(), e) != p.bench.end();
      if (hit) {
        partner = &d == &t ? (p.bench.empty() ? "" : p.bench.front()->name) : p.target->name;
        method = p.method;
      }
    }
    x["paired_with"] = partner;
    x["match"] = method;
    x["stack"] = details::stack_of(d, e->name);
    x["module_chain"] = details::module_chain(d, e->name);
    return x;
  };
  o["first_overflow"] = {{"target", overflow(j.target_overflow, t)}, {"bench", overflow(j.bench_overflow, b)}};
  ordered_json un;
  un["target_only"] = ordered_json::array();
  un["bench_only"] = ordered_json::array();
  for (const Entry* e : j.matching.target_only) un["target_only"].push_back(e->name);
  for (const Entry* e : j.matching.bench_only) un["bench_only"].push_back(e->name);
  if (!j.matching.explained.empty()) {
    un["by_nature"] = ordered_json::array();
    for (const auto& x : j.matching.explained)
      un["by_nature"].push_back(
          {{"entry", x.entry->name}, {"side", x.target_side ? "target" : "bench"}, {"reason", x.reason}});
  }
  o["unmatched"] = un;
  return o;
}

}  // namespace torchprobe::compare

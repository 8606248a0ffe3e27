#pragma once
// The first NaN or inf of a step across its ranks, traced through the collectives to the rank that
// made it (issue 48): an inf that one rank's gradient carries into an all_reduce reaches every rank
// through the reduction's output, and is reported once, at its origin, with the ranks it reached.
//
// On each rank the first entry (in its dump order) holding a tensor whose Max or Min is not finite
// either received it through a collective (a Distributed entry whose inputs are finite and whose
// output is not) or had it made on that rank (any other case). Of the ranks where it was made, the
// origin is the one that made it before the fewest collectives (ranks run in step with each other
// only at collectives), the lowest rank on a tie. Works on statistics and overflow_check dumps.
#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "torchprobe/analysis/compare/ranks_nodes.hpp"

namespace torchprobe::compare::ranks {

struct NonFinite {
  long step = -1;
  long rank = -1;             // the origin
  std::string entry;          // its first entry with a non-finite tensor: "Aten.fill_.0.forward"
  std::string item;           // "output.0", "input_args.0", "parameters.weight", "weight.0"
  bool inputs_finite = true;  // false: already in the entry's inputs (made by code the dump does not show)
  bool origin_known = true;   // false: every rank received it through a collective (the maker's dump is missing)
  std::vector<long> reached;  // the ranks it reached through a collective
  std::string through;        // the first collective that carried it
};

namespace details {

// Whether n holds a tensor item (an item has "type" and "Max") whose Max or Min is not finite;
// `path` ("input_args") gets the first one's place appended (".0.key"). Runs over every entry of a
// rank until one is found, so the path is only extended along the way, never copied.
template <class Nodes>
bool first_nonfinite_item(typename Nodes::Node n, std::string& path) {
  typename Nodes::Node max, min, type;
  if (Nodes::is_object(n) && Nodes::find(n, "Max", max) && Nodes::find(n, "type", type)) {
    double v = 0;
    return (Nodes::number(max, v) && !std::isfinite(v)) ||
           (Nodes::find(n, "Min", min) && Nodes::number(min, v) && !std::isfinite(v));
  }
  bool found = false;
  const std::size_t at = path.size();
  const auto visit = [&](std::string_view key, typename Nodes::Node e) {
    if (found) return;
    path.append(".").append(key);
    found = first_nonfinite_item<Nodes>(e, path);
    if (!found) path.resize(at);
  };
  if (Nodes::is_array(n)) {
    std::size_t i = 0;
    Nodes::elements(n, [&](typename Nodes::Node e) { visit(std::to_string(i++), e); });
  } else if (Nodes::is_object(n)) {
    Nodes::members(n, visit);
  }
  return found;
}

struct RankFirst {
  std::string entry, item;
  long clock = 0;  // collective entries before it on that rank
  bool received = false, inputs_finite = true;
};

// The place of one entry in a rank's walk for its first non-finite tensor: call for each entry in
// dump order until it returns true.
template <class Nodes>
bool nonfinite_in_entry(std::string_view name, typename Nodes::Node e, RankFirst& f) {
  const bool collective = name.rfind("Distributed.", 0) == 0;
  std::string input, output, path;
  if (Nodes::is_object(e))
    Nodes::members(e, [&](std::string_view k, typename Nodes::Node part) {
      const bool in = k == "input_args" || k == "input_kwargs" || k == "input" || k == "parameters";
      std::string& side = in ? input : output;  // parameters_grad's "weight": a result
      if (!side.empty()) return;
      path.assign(k);
      if (first_nonfinite_item<Nodes>(part, path)) side = path;
    });
  if (input.empty() && output.empty()) {
    f.clock += collective;
    return false;
  }
  f.entry = std::string(name);
  f.item = input.empty() ? output : input;
  f.inputs_finite = input.empty();
  f.received = collective && input.empty();
  return true;
}

}  // namespace details

// The step's first non-finite value, from each rank's first (rank, its first; null: none), ranks in order.
inline std::optional<NonFinite> first_nonfinite(const std::vector<std::pair<long, const details::RankFirst*>>& firsts,
                                                long step) {
  std::optional<NonFinite> out;
  long origin_clock = 0;
  std::vector<std::pair<long, const details::RankFirst*>> received;
  for (const auto& [rank, f] : firsts) {
    if (!f) continue;
    if (f->received) {
      received.emplace_back(rank, f);
    } else if (!out || f->clock < origin_clock) {
      out = NonFinite{step, rank, f->entry, f->item, f->inputs_finite, true, {}, ""};
      origin_clock = f->clock;
    }
  }
  if (!out && !received.empty()) {  // made on no rank in view
    const auto& [rank, f] = received.front();
    out = NonFinite{step, rank, f->entry, f->item, true, false, {}, ""};
  }
  if (out)
    for (const auto& [rank, f] : received) {
      if (rank == out->rank) continue;
      out->reached.push_back(rank);
      if (out->through.empty()) out->through = f->entry;
    }
  return out;
}

}  // namespace torchprobe::compare::ranks

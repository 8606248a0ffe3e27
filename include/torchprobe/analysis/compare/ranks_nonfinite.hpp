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

using io::rank_items::nonfinite_in_entry;
using io::rank_items::RankFirst;

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

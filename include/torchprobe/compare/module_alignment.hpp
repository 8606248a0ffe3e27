#pragma once
// Pairing inside paired modules (matching.hpp's pass 3): for each module call paired by name (mix dumps on both sides),
// the API calls each side made directly inside it (construct.json) that are still unpaired are aligned as two sequences
// (a weighted longest common subsequence over the canonical items of matching.hpp: Functional.linear and Aten.t +
// Aten.addmm are both "linear"). Two items can pair only under the same canonical name; a pair scores more when their
// first outputs have the same shape and dtype class, and more again when their statistics are equal. An extra call on
// one side then stays inside its module: it cannot shift every later call of the same API onto the wrong partner, as
// the global k-th-occurrence rule of the template pass can.
#include <algorithm>
#include <utility>
#include <vector>

namespace torchprobe::compare::detail {

// The best alignment of two item lists: index pairs, in order.
template <class ItemT, class Score>
std::vector<std::pair<std::size_t, std::size_t>> align_items(const std::vector<ItemT>& a, const std::vector<ItemT>& b,
                                                             Score score) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> best(n + 1, std::vector<int>(m + 1, 0));
  for (std::size_t i = n; i-- > 0;) {
    for (std::size_t j = m; j-- > 0;) {
      int v = std::max(best[i + 1][j], best[i][j + 1]);
      const int s = score(a[i], b[j]);
      if (s > 0) v = std::max(v, s + best[i + 1][j + 1]);
      best[i][j] = v;
    }
  }
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t i = 0, j = 0; i < n && j < m;) {
    const int s = score(a[i], b[j]);
    if (s > 0 && best[i][j] == s + best[i + 1][j + 1]) {
      out.emplace_back(i, j);
      ++i;
      ++j;
    } else if (best[i][j] == best[i + 1][j]) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

}  // namespace torchprobe::compare::detail

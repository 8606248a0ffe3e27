#pragma once
// A dump's entries as compare pairs them: each entry with its rows (rows.hpp), a pair of entries
// with its row links, and the result of the matching passes (matching.hpp).
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "torchprobe/analysis/compare/rows.hpp"

namespace torchprobe::compare {

struct Entry {
  std::string_view name, key;  // views of the rows' text (RowSet, DumpRows)
  std::string_view direction;  // forward | backward | parameters_grad
  std::size_t index = 0;       // position in dump order
  std::vector<const Row*> rows;
  bool is_module() const { return name.rfind("Module.", 0) == 0 || name.rfind("Cell.", 0) == 0; }
  std::string_view suffix(const Row& r) const {
    return r.name.rfind(name, 0) == 0 ? r.name.substr(name.size()) : r.name;
  }
  const Row* first_output() const {
    for (const Row* r : rows)
      if (r->is_output()) return r;
    return nullptr;
  }
  const Row* row(std::string_view suffix_) const {
    for (const Row* r : rows) {
      if (suffix(*r) == suffix_) return r;
    }
    return nullptr;
  }
};

inline std::vector<Entry> dump_entries(const std::vector<Row>& rows) {
  std::vector<Entry> out;
  for (const Row& r : rows) {
    if (out.empty() || out.back().name != r.entry) {
      Entry e;
      e.name = r.entry;
      e.key = r.entry_key;
      e.index = r.entry_index;
      for (std::size_t at = 0; at <= r.entry.size();) {  // the last dot-separated part that names one
        const std::size_t dot = std::min(r.entry.find('.', at), r.entry.size());
        const std::string_view part = r.entry.substr(at, dot - at);
        for (const char* d : {"forward", "backward", "parameters_grad"})
          if (part == d) e.direction = d;
        at = dot + 1;
      }
      out.push_back(std::move(e));
    }
    out.back().rows.push_back(&r);
  }
  return out;
}

struct RowLink {
  const Row* target;
  const Row* bench;
  bool transposed = false;  // W against W^T: equal statistics, reversed shape
  bool reshaped = false;    // the same elements in another shape (C++'s embedding_bag flattens its indices)
};

struct EntryPair {
  const Entry* target = nullptr;           // the target's entry (the first of a template's sequence)
  std::vector<const Entry*> bench;         // one entry, or a template's sequence
  std::vector<const Entry*> target_group;  // a template's sequence on the target side, else empty
  std::string method;                      // exact | template | value
  std::vector<RowLink> links;
};

struct ExplainedEntry {
  const Entry* entry = nullptr;
  bool target_side = true;
  std::string reason;
};

struct Matching {
  std::vector<EntryPair> pairs;  // in target order
  std::vector<const Entry*> target_only, bench_only;
  std::vector<ExplainedEntry> explained;  // unpaired by nature (unmatched_reasons.hpp), with the reason
};

}  // namespace torchprobe::compare

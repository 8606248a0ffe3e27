#pragma once
// A dump's entries as compare pairs them: each entry with its rows (rows.hpp), a pair of entries
// with its row links, and the result of the matching passes (matching.hpp).
#include <algorithm>
#include <cassert>
#include <string>
#include <string_view>
#include <vector>

#include "torchprobe/analysis/compare/rows.hpp"

namespace torchprobe::compare {

// The rows of one entry, which stand together in their dump's rows, iterated as pointers to them.
// (A vector of pointers per entry was two million small vectors in a compare of a million entries a
// side: some 200 MB and as many allocations.)
class EntryRows {
 public:
  class iterator {
   public:
    explicit iterator(const Row* at) : at_(at) {}
    const Row* operator*() const { return at_; }
    iterator& operator++() {
      ++at_;
      return *this;
    }
    bool operator==(const iterator& o) const { return at_ == o.at_; }
    bool operator!=(const iterator& o) const { return at_ != o.at_; }

   private:
    const Row* at_;
  };

  EntryRows() = default;
  EntryRows(const Row* first, std::size_t count) : first_(first), count_(count) {}
  iterator begin() const { return iterator(first_); }
  iterator end() const { return iterator(first_ + count_); }
  std::size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  void add_next() { ++count_; }  // the row after the last joins

 private:
  const Row* first_ = nullptr;
  std::size_t count_ = 0;
};

struct Entry {
  std::string_view name, key;  // views of the rows' text (RowSet, DumpRows)
  std::string_view direction;  // forward | backward | parameters_grad
  std::size_t index = 0;       // position in dump order
  EntryRows rows;
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
  out.reserve(rows.empty() ? 0 : rows.back().entry_index() + 1);  // entries counted by the rows' maker: no fewer
  for (const Row& r : rows) {
    if (out.empty() || out.back().name != r.entry()) {
      Entry e;
      e.rows = EntryRows(&r, 0);
      e.name = r.entry();
      e.key = r.entry_key();
      e.index = r.entry_index();
      for (std::size_t at = 0; at <= r.entry().size();) {  // the last dot-separated part that names one
        const std::size_t dot = std::min(r.entry().find('.', at), r.entry().size());
        const std::string_view part = r.entry().substr(at, dot - at);
        for (const char* d : {"forward", "backward", "parameters_grad"})
          if (part == d) e.direction = d;
        at = dot + 1;
      }
      out.push_back(std::move(e));
    }
    out.back().rows.add_next();
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

// The matching passes' state (matching.hpp), a slot or a flag per entry by its position in its side's
// vector: as a std::map and a hashed set of a million pointers they were 250 MB and a tree walk or a
// hash per look.

// The bench entries taken so far.
class TakenEntries {
 public:
  explicit TakenEntries(const std::vector<Entry>& side) : first_(side.data()), taken_(side.size(), false) {}
  std::size_t count(const Entry* e) const { return taken_[at(e)] ? 1 : 0; }
  void insert(const Entry* e) { taken_[at(e)] = true; }
  void erase(const Entry* e) { taken_[at(e)] = false; }

 private:
  std::size_t at(const Entry* e) const {
    const auto i = static_cast<std::size_t>(e - first_);
    assert(e >= first_ && i < taken_.size());  // an entry of this side
    return i;
  }
  const Entry* first_;
  std::vector<bool> taken_;
};

// The pairs made so far, by their target entry. An entry has one when its slot names it (`target`
// set): the lead of a group holds the pair, the group's other members a pair without bench entries.
class PairsByTarget {
 public:
  using mapped_type = EntryPair;
  explicit PairsByTarget(const std::vector<Entry>& target) : first_(target.data()), slots_(target.size()) {}
  std::size_t count(const Entry* t) const { return slots_[at(t)].target ? 1 : 0; }
  EntryPair* find(const Entry* t) { return count(t) ? &slots_[at(t)] : nullptr; }
  const EntryPair* find(const Entry* t) const { return count(t) ? &slots_[at(t)] : nullptr; }
  // The slot of t, to be given t's pair (a slot whose `target` stays null is no pair).
  EntryPair& operator[](const Entry* t) { return slots_[at(t)]; }
  void erase(const Entry* t) { slots_[at(t)] = EntryPair{}; }
  // f(target entry, its pair) for each target entry with one, in target order.
  template <class F>
  void each(F&& f) const {
    for (const EntryPair& p : slots_)
      if (p.target) f(p.target, p);
  }
  // The pairs with bench entries, in target order, and the target entries without a pair; the
  // slots are used up (moved from, compacted in place: no second copy of a million pairs).
  std::vector<EntryPair> take_pairs(std::vector<const Entry*>& target_only) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      EntryPair& p = slots_[i];
      if (!p.target) {
        target_only.push_back(first_ + i);
      } else if (!p.bench.empty()) {
        if (kept != i) slots_[kept] = std::move(p);
        ++kept;
      }
    }
    slots_.resize(kept);
    return std::move(slots_);
  }

 private:
  std::size_t at(const Entry* t) const {
    const auto i = static_cast<std::size_t>(t - first_);
    assert(t >= first_ && i < slots_.size());  // an entry of the target side
    return i;
  }
  const Entry* first_;
  std::vector<EntryPair> slots_;
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

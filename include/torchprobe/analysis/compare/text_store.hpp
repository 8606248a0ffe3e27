#pragma once
// The text of a dump's rows, kept in a few large blocks that the rows refer to by string_view.
// A million entries make some three million rows of ten texts each: as std::strings they were
// tens of millions of allocations and most of a large compare's memory and time (page faults,
// malloc, copies); here a name costs its bytes, and a text that repeats (a dtype, a shape,
// "True") is kept once. Blocks never move, so a TextStore may be moved with the rows that refer
// to it; it must outlive them.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

namespace torchprobe::compare {

class TextStore {
 public:
  TextStore() = default;
  TextStore(const TextStore&) = delete;
  TextStore& operator=(const TextStore&) = delete;
  TextStore(TextStore&& o) noexcept { *this = std::move(o); }
  TextStore& operator=(TextStore&& o) noexcept {
    blocks_ = std::move(o.blocks_);
    interned_ = std::move(o.interned_);
    at_ = std::exchange(o.at_, nullptr);
    left_ = std::exchange(o.left_, 0);
    return *this;
  }

  // A copy of `s` that lives as long as the store.
  std::string_view keep(std::string_view s) {
    if (s.empty()) return {};
    if (s.size() > left_) grow(s.size());
    char* out = at_;
    std::memcpy(out, s.data(), s.size());
    at_ += s.size();
    left_ -= s.size();
    return {out, s.size()};
  }

  // As keep(), but one copy per distinct text (for the few texts that repeat on every row).
  std::string_view intern(std::string_view s) {
    if (const auto it = interned_.find(s); it != interned_.end()) return *it;
    const std::string_view kept = keep(s);
    interned_.insert(kept);
    return kept;
  }

 private:
  static constexpr std::size_t kBlock = std::size_t(1) << 20;

  void grow(std::size_t at_least) {
    const std::size_t size = std::max(kBlock, at_least);
    blocks_.emplace_back(new char[size]);  // not zeroed: untouched room costs no page
    at_ = blocks_.back().get();
    left_ = size;
  }

  std::vector<std::unique_ptr<char[]>> blocks_;
  std::unordered_set<std::string_view> interned_;
  char* at_ = nullptr;
  std::size_t left_ = 0;
};

}  // namespace torchprobe::compare

#pragma once
// The text of a dump's rows, kept in a few large blocks that the rows refer to by string_view.
// A million entries make some three million rows of ten texts each: as std::strings they were
// tens of millions of allocations and most of a large compare's memory and time (page faults,
// malloc, copies); here a name costs its bytes, and a text that repeats (a dtype, a shape,
// "True") is kept once. Blocks never move, so a TextStore may be moved with the rows that refer
// to it; it must outlive them.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <stdexcept>
#include <string>
#include <new>
#include <type_traits>
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
    objects_ = std::move(o.objects_);
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

  // A copy of `value` that lives as long as the store, at an address that never changes: the few
  // objects rows share (their entry) or keep beside them (what few rows have). Objects without a
  // destructor lie in the blocks, others are held one by one.
  template <class T>
  T* own(T value) {
    if constexpr (std::is_trivially_destructible_v<T>) {
      const auto pad = [&] { return (alignof(T) - reinterpret_cast<std::uintptr_t>(at_) % alignof(T)) % alignof(T); };
      if (pad() + sizeof(T) > left_) grow(sizeof(T) + alignof(T));
      const std::size_t skip = pad();  // of the new block, if one was taken
      T* out = new (at_ + skip) T(std::move(value));
      at_ += skip + sizeof(T);
      left_ -= skip + sizeof(T);
      return out;
    } else {
      auto held = std::make_unique<Held<T>>(std::move(value));
      T* out = &held->value;
      objects_.push_back(std::move(held));
      return out;
    }
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

  struct HeldObject {
    virtual ~HeldObject() = default;
  };
  template <class T>
  struct Held final : HeldObject {
    explicit Held(T v) : value(std::move(v)) {}
    T value;
  };

  std::vector<std::unique_ptr<char[]>> blocks_;
  std::vector<std::unique_ptr<HeldObject>> objects_;
  std::unordered_set<std::string_view> interned_;
  char* at_ = nullptr;
  std::size_t left_ = 0;
};

// A view of text in 8 bytes instead of a string_view's 16: its address and length packed into one
// word (user-space addresses have 47 bits on x86-64 and AArch64's default 48; lengths up to 65,534).
// A row holds five such texts and there are five million rows in a million-entry compare. A text
// that does not fit so (longer, or at an address above 2^48) is reached through a string_view kept
// in a TextStore, which then must be given. Reads as a std::string_view.
class TextRef {
 public:
  TextRef() = default;
  // For texts that fit (literals, short texts): else std::length_error.
  TextRef(std::string_view s) {  // NOLINT: implicit, as a string_view's own conversions
    if (!pack(s)) throw std::length_error("TextRef: a text that does not fit 8 bytes needs a TextStore");
  }
  TextRef(const char* s) : TextRef(std::string_view(s)) {}  // NOLINT
  // Any text; one that does not fit is reached through a view kept in `store`.
  TextRef(std::string_view s, TextStore& store) {
    if (pack(s)) return;
    const auto kept = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(store.own(s)));
    if ((kept >> 48) != 0) throw std::length_error("TextRef: an address above 2^48");
    bits_ = (kept << 16) | kIndirect;
  }

  std::string_view view() const {
    const auto at = reinterpret_cast<const char*>(static_cast<std::uintptr_t>(bits_ >> 16));
    if ((bits_ & kLengthMask) == kIndirect) return *reinterpret_cast<const std::string_view*>(at);
    return {at, static_cast<std::size_t>(bits_ & kLengthMask)};
  }
  operator std::string_view() const { return view(); }  // NOLINT

  std::size_t size() const { return view().size(); }
  bool empty() const { return view().empty(); }
  const char* data() const { return view().data(); }
  std::size_t find(std::string_view s, std::size_t pos = 0) const { return view().find(s, pos); }
  std::size_t find(char c, std::size_t pos = 0) const { return view().find(c, pos); }
  std::size_t rfind(std::string_view s, std::size_t pos = std::string_view::npos) const { return view().rfind(s, pos); }
  std::size_t rfind(char c, std::size_t pos = std::string_view::npos) const { return view().rfind(c, pos); }
  std::string_view substr(std::size_t pos, std::size_t n = std::string_view::npos) const {
    return view().substr(pos, n);
  }

  friend bool operator==(const TextRef& a, const TextRef& b) { return a.view() == b.view(); }
  friend bool operator!=(const TextRef& a, const TextRef& b) { return a.view() != b.view(); }
  friend bool operator==(const TextRef& a, std::string_view b) { return a.view() == b; }
  friend bool operator!=(const TextRef& a, std::string_view b) { return a.view() != b; }
  friend bool operator==(std::string_view a, const TextRef& b) { return a == b.view(); }
  friend bool operator!=(std::string_view a, const TextRef& b) { return a != b.view(); }
  friend bool operator==(const TextRef& a, const char* b) { return a.view() == b; }
  friend bool operator!=(const TextRef& a, const char* b) { return a.view() != b; }
  friend bool operator<(const TextRef& a, const TextRef& b) { return a.view() < b.view(); }
  friend std::ostream& operator<<(std::ostream& out, const TextRef& t) { return out << t.view(); }

 private:
  static constexpr std::uint64_t kLengthMask = 0xFFFF;
  static constexpr std::uint64_t kIndirect = 0xFFFF;  // in the length's place: the address is a kept view's
  bool pack(std::string_view s) {
    const auto at = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(s.data()));
    if (s.size() >= kIndirect || (at >> 48) != 0) return false;
    bits_ = (at << 16) | s.size();
    return true;
  }
  std::uint64_t bits_ = 0;
};

}  // namespace torchprobe::compare

#pragma once
// Items found by name among millions (a dump's rows by compare key): an open-addressing table of the
// items' positions, the names themselves staying where the items keep them. std::unordered_map's
// node per name (an allocation, and a pointer chased on every probe) was seconds of a
// million-entry compare.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

namespace torchprobe::compare::details {

class NameIndex {
 public:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  // Room for `n` names: the table is kept at most half full.
  explicit NameIndex(std::size_t n) {
    std::size_t size = 16;
    while (size < 2 * n) size *= 2;
    slots_.assign(size, 0);
  }

  // Adds item `i` under `name` unless some item has that name: returns that item, or npos when `i`
  // was added. `name_of(k)` gives item k's name.
  template <class NameOf>
  std::size_t insert(std::string_view name, std::size_t i, NameOf&& name_of) {
    const std::uint64_t h = hash(name);
    for (std::size_t at = h & mask();; at = (at + 1) & mask()) {
      const std::uint64_t slot = slots_[at];
      if (slot == 0) {
        slots_[at] = tag(h) | (i + 1);
        return npos;
      }
      if ((slot & kTagBits) == tag(h) && name_of(item(slot)) == name) return item(slot);
    }
  }

  // The item named `name`, or npos.
  template <class NameOf>
  std::size_t find(std::string_view name, NameOf&& name_of) const {
    const std::uint64_t h = hash(name);
    for (std::size_t at = h & mask();; at = (at + 1) & mask()) {
      const std::uint64_t slot = slots_[at];
      if (slot == 0) return npos;
      if ((slot & kTagBits) == tag(h) && name_of(item(slot)) == name) return item(slot);
    }
  }

 private:
  // A slot: the name hash's top 24 bits (most names that are not it are told apart without being
  // read), then the item's position + 1 (0: empty).
  static constexpr std::uint64_t kTagBits = ~std::uint64_t(0) << 40;
  static std::uint64_t hash(std::string_view s) { return std::hash<std::string_view>{}(s); }
  static std::uint64_t tag(std::uint64_t h) { return h & kTagBits; }
  static std::size_t item(std::uint64_t slot) { return static_cast<std::size_t>((slot & ~kTagBits) - 1); }
  std::size_t mask() const { return slots_.size() - 1; }

  std::vector<std::uint64_t> slots_;
};

}  // namespace torchprobe::compare::details

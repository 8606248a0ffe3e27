#pragma once
// construct.json's map: each entry's parent module, hashed (a million entries made a tree slow to
// build). The names are kept in a TextStore and the map holds views of them: a lookup by a row's
// name (itself a view) makes no string, and a million names cost their bytes, not two allocations
// each (a compare of a million entries a side made four million strings of them).
#include <string_view>
#include <unordered_map>
#include <utility>

#include "torchprobe/analysis/compare/text_store.hpp"

namespace torchprobe::compare {

class Parents {
 public:
  using Map = std::unordered_map<std::string_view, std::string_view>;
  using const_iterator = Map::const_iterator;

  Parents() = default;
  Parents(Parents&&) noexcept = default;
  Parents& operator=(Parents&&) noexcept = default;
  Parents(const Parents& o) { *this = o; }
  Parents& operator=(const Parents& o) {
    if (this == &o) return *this;
    Parents copy;  // views of this copy's own text
    copy.reserve(o.size());
    for (const auto& [key, parent] : o.map_) copy.set(key, parent);
    return *this = std::move(copy);
  }

  // key -> parent, unless key has a parent already: then false, and nothing changes.
  bool insert(std::string_view key, std::string_view parent) {
    if (map_.count(key)) return false;
    map_.emplace(text_.keep(key), text_.intern(parent));  // a module is the parent of many
    return true;
  }
  // key -> parent, replacing an earlier parent (a repeated key: its last value, as nlohmann keeps it).
  void set(std::string_view key, std::string_view parent) {
    const auto it = map_.find(key);
    if (it == map_.end())
      map_.emplace(text_.keep(key), text_.intern(parent));
    else
      it->second = text_.intern(parent);
  }

  const_iterator find(std::string_view key) const { return map_.find(key); }
  std::size_t count(std::string_view key) const { return map_.count(key); }
  const_iterator begin() const { return map_.begin(); }
  const_iterator end() const { return map_.end(); }
  std::size_t size() const { return map_.size(); }
  bool empty() const { return map_.empty(); }
  void reserve(std::size_t n) { map_.reserve(n); }

  bool operator==(const Parents& o) const { return map_ == o.map_; }
  bool operator!=(const Parents& o) const { return !(*this == o); }

 private:
  TextStore text_;  // before map_: the views it holds die after it
  Map map_;
};

}  // namespace torchprobe::compare

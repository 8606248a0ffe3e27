#pragma once
// Level L2's bookkeeping: which recorded call created an autograd node, so that the ops the node
// runs in backward sit under that call's backward entry; and the construct.json parents of a call
// nested in another.
//
// Autograd numbers the nodes a thread creates (sequence numbers); the nodes a call created are
// those numbered in [peek at its start, peek at its end). Nested calls' ranges lie inside their
// enclosing call's, so the innermost range that holds a node's number names its creator. Each
// autograd node record carries the forward thread and the number (fn.forwardThreadId(), seqNr()).
#include <ATen/record_function.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "torchprobe/capture/api_observer.hpp"

namespace torchprobe::capture {

class BackwardOwners {
 public:
  // The call that ran on `thread` and created nodes [begin, end) has `owner` as its backward entry.
  void add(std::uint64_t thread, std::uint64_t begin, std::uint64_t end, Enclosing owner) {
    if (end <= begin) return;
    std::lock_guard<std::mutex> lock(mutex_);
    // A call that created exactly the nodes of the one nested in it (layer_norm around
    // native_layer_norm) ends last: the inner call keeps the range.
    ranges_.emplace(Key{thread, begin, ~end}, Range{end, std::move(owner)});
  }

  // The innermost range holding node `seq` of `thread`. Ranges are nested or disjoint, so walking
  // down from the last one that starts at or before `seq`, the first that holds it is the
  // innermost; the walk is bounded (a node no call created would otherwise scan them all).
  std::optional<Enclosing> find(std::uint64_t thread, std::int64_t seq) const {
    if (seq < 0) return std::nullopt;  // AccumulateGrad and nodes made outside grad mode
    const auto s = static_cast<std::uint64_t>(seq);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = ranges_.upper_bound(Key{thread, s, ~std::uint64_t{0}});
    for (int steps = 0; it != ranges_.begin() && steps < 256; ++steps) {
      --it;
      if (std::get<0>(it->first) != thread) break;
      if (it->second.end > s) return it->second.owner;
    }
    return std::nullopt;
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    ranges_.clear();
  }

 private:
  // (thread, begin, ~end): for one begin, the shorter (inner) range comes last.
  using Key = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>;
  struct Range {
    std::uint64_t end = 0;
    Enclosing owner;
  };
  mutable std::mutex mutex_;
  std::map<Key, Range> ranges_;
};

// construct.json parents of a call at L2, where every entry is in construct.json: the enclosing
// call's entries; an outermost call's come from `outer` (a ScopedModuleDump's module), else null.
template <class Outer>
struct NestedParents {
  const Enclosing& frame;
  const Outer& outer;
  std::optional<std::string> forward() const {
    return frame.forward ? *frame.forward : outer.forward().value_or(std::string());
  }
  std::optional<std::string> backward() const {
    if (frame.backward) return *frame.backward;
    return frame.forward ? std::string() : outer.backward().value_or(std::string());
  }
};

}  // namespace torchprobe::capture

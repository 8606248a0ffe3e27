#pragma once
// What one step has captured so far, shared by every thread that records into it.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "torchprobe/config/types.hpp"
#include "torchprobe/core/tensor_json.hpp"
#include "torchprobe/config/name_filter.hpp"
#include "torchprobe/core/record.hpp"
#include "torchprobe/stats/item_stats.hpp"

namespace torchprobe::details {

// A step's records in commit order. A deque: it grows without moving the records it holds, and
// without the spare capacity (a third on average) that a vector keeps for growing.
using RecordBatch = std::deque<Record>;

class StepState {
 public:
  explicit StepState(const Config& config) : filter_(config) {}

  struct Admission {
    std::string name;
    std::uint64_t order = 0;
    bool admitted = false;
  };

  // Names the next call of an API ("Aten.add." -> "Aten.add.3.forward") and decides whether it
  // is dumped. The counter advances even for calls the filters drop, as msprobe's does, so a
  // call keeps its number whatever the filters say.
  // `key_id` numbers `key` (OpInfo::key_id), so the hot path indexes a vector instead of hashing.
  Admission begin_api_call(const std::string& key, std::size_t key_id, std::string_view api) {
    std::lock_guard<std::mutex> lock(mutex_);
    Admission a;
    if (key_id >= api_counters_.size()) api_counters_.resize(key_id + 1, 0);
    const std::string n = std::to_string(api_counters_[key_id]++);
    a.name.reserve(key.size() + n.size() + 8);
    a.name.append(key).append(n).append(".forward");
    a.order = next_order_++;
    a.admitted = filter_.admit(a.name) && filter_.admits_op(api);
    return a;
  }

  // For entries that are not API forward calls (backward, modules): their number and admission.
  std::int64_t next_index(const std::string& counter_key) {
    std::lock_guard<std::mutex> lock(mutex_);
    return counters_[counter_key]++;
  }
  std::uint64_t next_order() {
    std::lock_guard<std::mutex> lock(mutex_);
    return next_order_++;
  }
  bool admit(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    return filter_.admit(name);
  }
  // An API's backward entry: its name, and its op under risk_level, as for its forward.
  bool admit_api(const std::string& name, std::string_view api) {
    std::lock_guard<std::mutex> lock(mutex_);
    return filter_.admit(name) && filter_.admits_op(api);
  }
  void enter_module(const std::string& forward_name) {
    std::lock_guard<std::mutex> lock(mutex_);
    filter_.enter_module(forward_name);
  }
  void exit_module(const std::string& forward_name) {
    std::lock_guard<std::mutex> lock(mutex_);
    filter_.exit_module(forward_name);
  }

  // Commits with the next position in dump order (entries that are complete only at their end).
  void commit_last(Record&& r) {
    std::lock_guard<std::mutex> lock(mutex_);
    r.order = next_order_++;
    records_.push_back(std::move(r));
  }

  void commit(Record&& r) {
    std::lock_guard<std::mutex> lock(mutex_);
    records_.push_back(std::move(r));
  }

  // Everything the step has recorded so far, for a writer that may run after the step moved on.
  struct Sealed {
    std::vector<const Record*> records;  // in dump order
    std::shared_ptr<const void> owner;   // keeps `records` alive
    std::size_t bytes = 0;               // about what the records take in memory
    // Records of this seal whose deferred values (statistics on a device, md5 checksums) were
    // filled in by it: the journal got them without those values and gets them again.
    std::vector<const Record*> resolved;
  };

  // The records committed since the last seal(), with every deferred statistic resolved (one
  // device-to-host copy for all of them), become an immutable batch; returns every batch of the
  // step in dump order. A step stopped and started again has several batches: each is sorted, and
  // they are merged by `order`, an earlier batch first among equals (a repeated name keeps its
  // last value, as when it was committed).
  Sealed seal() {
    std::lock_guard<std::mutex> lock(mutex_);
    Sealed out;
    if (!records_.empty() || sealed_.empty()) {
      const auto by_order = [](const Record& a, const Record& b) { return a.order < b.order; };
      // Mostly in order already (API entries commit in call order): sorting would move every record.
      if (!std::is_sorted(records_.begin(), records_.end(), by_order))
        std::stable_sort(records_.begin(), records_.end(), by_order);
      for (const Record& r : records_)  // a deque keeps its elements in place when it is moved below
        if (!r.pending.empty() || !r.pending_checksums.empty()) out.resolved.push_back(&r);
      resolve_pending();
      auto batch = std::make_shared<RecordBatch>(std::move(records_));
      records_ = RecordBatch();
      for (const Record& r : *batch) sealed_bytes_ += estimated_bytes(r);
      sealed_.push_back(std::move(batch));
    }
    const auto by_order = [](const Record* a, const Record* b) { return a->order < b->order; };
    for (const auto& batch : sealed_) {
      const std::size_t before = out.records.size();
      for (const Record& r : *batch) out.records.push_back(&r);
      if (before > 0 && !batch->empty() && out.records[before]->order < out.records[before - 1]->order)
        std::inplace_merge(out.records.begin(), out.records.begin() + static_cast<std::ptrdiff_t>(before),
                           out.records.end(), by_order);
    }
    out.owner = std::make_shared<std::vector<std::shared_ptr<const RecordBatch>>>(sealed_);
    out.bytes = sealed_bytes_;
    return out;
  }

  // Records committed and not sealed, and in sealed batches.
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t n = records_.size();
    for (const auto& batch : sealed_) n += batch->size();
    return n;
  }

  // What a record takes in memory, about: a writer's backlog is bounded by it (max_pending_mb).
  static std::size_t estimated_bytes(const Record& r) {
    constexpr std::size_t kRest = 256;  // its body (compact or JSON), parent and call stack
    return sizeof(Record) + r.name.capacity() + kRest;
  }

  // The step's sealed batches leave the state (the step has ended): whoever takes them decides on
  // which thread they are freed (the writer's: a large step takes a while to free).
  std::vector<std::shared_ptr<const RecordBatch>> take_sealed() {
    std::lock_guard<std::mutex> lock(mutex_);
    sealed_bytes_ = 0;
    return std::move(sealed_);
  }

  // step(): a new step starts with no records, counters at 0, and the scope range closed. Batches
  // handed to a writer stay alive with it.
  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    records_.clear();
    sealed_.clear();
    sealed_bytes_ = 0;
    counters_.clear();
    std::fill(api_counters_.begin(), api_counters_.end(), 0);
    next_order_ = 0;
    filter_.reset();
  }

 private:
  void resolve_pending() {
    resolve_checksums();
    stats::resolve_pending_stats(records_);
  }

  // Checksums computed off the training thread (stats/checksum_worker.hpp) join their items.
  void resolve_checksums() {
    for (auto& r : records_) {
      if (r.pending_checksums.empty()) continue;
      r.materialize();
      for (PendingChecksum& p : r.pending_checksums) {
        try {
          r.body.at(nlohmann::ordered_json::json_pointer(p.pointer))["md5"] = p.value.get();
        } catch (const std::exception&) {
          // The checksum could not be computed (memory): the item keeps md5 null, the rest is written.
        }
      }
      r.pending_checksums.clear();
    }
  }

  mutable std::mutex mutex_;
  NameFilter filter_;
  RecordBatch records_;                                     // committed since the last seal()
  std::vector<std::shared_ptr<const RecordBatch>> sealed_;  // the step's earlier records
  std::size_t sealed_bytes_ = 0;
  std::unordered_map<std::string, std::int64_t> counters_;  // modules and backward entries
  std::vector<std::int64_t> api_counters_;                  // API forward calls, by OpInfo::key_id
  std::uint64_t next_order_ = 0;
};

}  // namespace torchprobe::details

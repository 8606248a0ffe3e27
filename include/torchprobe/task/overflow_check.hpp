#pragma once
// Task::OverflowCheck (classic msprobe's overflow_check; docs/overflow.md): an entry overflows when one
// of its tensors has a non-finite Max or Min (Mean/Norm alone never count). Only overflowing entries
// are written, each with all its tensors saved as .pt; after overflow_nums of them the dump ends.
// Each step with an overflow also gets overflow_summary.json (task/overflow_summary.hpp).
//
// What keeps it cheap when nothing overflows:
//  - Statistics are the fused one-pass CPU kernels; the decision is a look at the entry's Max/Min.
//  - Tensors are not copied while an entry is undecided: the entry holds references, and only a
//    kept entry's tensors are snapshotted and handed to the writer (io/tensor_writer.hpp). The one
//    exception is the tensor an in-place op is about to overwrite (see describe()).
//  - Tensors on a device are reduced there, as for statistics; their entries are held back until
//    the reductions are read, all at once, at flush (or once many are waiting): no host
//    synchronisation per op. overflow_nums is then applied at that point.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "torchprobe/core/site.hpp"
#include "torchprobe/config/types.hpp"
#include "torchprobe/core/names.hpp"
#include "torchprobe/core/probe_guard.hpp"
#include "torchprobe/core/record.hpp"
#include "torchprobe/core/tensor_json.hpp"
#include "torchprobe/io/files.hpp"
#include "torchprobe/stats/item_stats.hpp"
#include "torchprobe/task/overflow_summary.hpp"
#include "torchprobe/task/tensor_saver.hpp"

namespace torchprobe {

class OverflowCheckTask {
 public:
  static constexpr std::string_view name = task_name(Task::OverflowCheck);
  static constexpr LevelSet levels{Level::L0, Level::L1, Level::Mix};
  static constexpr std::array<std::string_view, 1> config_keys{"overflow_nums"};
  // The tensors of the calls that overflow are saved, as classic msprobe does.
  static bool saves_tensors(const Config&) { return true; }
  // Entries whose statistics are still on the device are decided in batches of at most this many,
  // or once the tensors they keep alive (for their files) pass kHeldBytesBeforeDecision.
  static constexpr std::size_t kHeldEntriesBeforeDecision = 1000;
  static constexpr std::size_t kHeldBytesBeforeDecision = std::size_t(512) << 20;

  // `saver`: the Recorder's (the tensors of the calls that overflow are saved, without async_dump).
  OverflowCheckTask(const Config& config, TensorSaver saver)
      : limit_(config.overflow_nums), saver_(saver.writer(), /*at_flush=*/false) {}

  // As StatisticsTask::force_device_path: CPU tensors take the device path (tests use it to run the
  // deferred decision without a GPU).
  void force_device_path(bool on) { force_device_ = on; }

  nlohmann::ordered_json describe(const at::Tensor& t, const Site& site, Record& record, bool gradient = false) const {
    nlohmann::ordered_json j = tensor_header(t);
    stats::put_tensor_stats(j, t, site, record,
                            force_device_);  // a device tensor's: read back with the entry's decision
    j["requires_grad"] = gradient ? false : t.requires_grad();
    stage(t, site, record, j);
    return j;
  }

  // Called for every finished entry. Keeps an overflowing entry (snapshotting its tensors for the
  // writer) while fewer than overflow_nums were kept; holds back an entry whose statistics are still
  // on the device; drops the rest, which frees their tensor references and nothing more.
  bool keep(Record& r) {
    if (ended_.load(std::memory_order_relaxed)) return false;
    if (is_save_entry(r.name)) {  // save() asked for exactly this value
      snapshot_saves(r);
      return true;
    }
    r.materialize();  // API entries arrive with part of their body still compact
    if (!overflow::any_nonfinite_stat(r.body)) {
      if (!r.pending.empty()) hold(std::move(r));
      return false;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (limit_ >= 0 && kept_ >= limit_) return false;
      ++kept_;
      if (limit_ >= 0 && kept_ >= limit_) ended_.store(true);
    }
    snapshot_saves(r);
    return true;
  }

  // True once overflow_nums overflowing entries were kept: the dump is over (the Debugger stops
  // capturing, writes the files at once and ignores later start() calls).
  bool ended() const { return ended_.load(); }
  std::string end_reason() const {
    return "overflow_check found overflow_nums = " + std::to_string(limit_) +
           " overflowing calls (\"Reached the preset overflow times\"); the dump has ended and start() does nothing";
  }

  // Whether held-back entries should be decided before the flush (too many, or too much memory).
  bool decision_due() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_.size() >= kHeldEntriesBeforeDecision || held_bytes_ >= kHeldBytesBeforeDecision;
  }

  // Decides the held-back entries: one device-to-host copy for all their statistics, then each
  // overflowing one goes to `commit` (which calls keep() again) in dump order.
  template <class Commit>
  void decide_held(Commit&& commit) {
    std::vector<Record> held;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      held.swap(held_);
      held_bytes_ = 0;
    }
    if (held.empty() || ended()) return;
    std::stable_sort(held.begin(), held.end(), [](const Record& a, const Record& b) { return a.order < b.order; });
    stats::resolve_pending_stats(held);
    for (Record& r : held)
      if (overflow::any_nonfinite_stat(r.body)) commit(std::move(r));
  }

  // overflow_summary.json, for a step with overflowing entries (given in dump order).
  std::vector<std::pair<std::string, nlohmann::ordered_json>> step_files(const std::vector<const Record*>& records,
                                                                         std::int64_t step) const {
    nlohmann::ordered_json summary = overflow::summarize(records, step, ended());
    if (summary.is_null()) return {};
    return {{"overflow_summary.json", std::move(summary)}};
  }

  std::int64_t overflowing_calls_kept() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return kept_;
  }
  const TensorSaver& saver() const { return saver_; }

 private:
  // msprobe saves every tensor of an overflowing call, and "data_name" goes on every tensor item.
  // Only a reference is kept here (TensorSaver::stage_reference); keep() snapshots the tensors of
  // the entries it keeps.
  void stage(const at::Tensor& t, const Site& site, Record& record, nlohmann::ordered_json& item) const {
    std::string name = saver_.stage_reference(t, site, record);
    if (name.empty()) return;
    record.saves.back().pointer.clear();  // named in the item now
    item["data_name"] = std::move(name);
  }
  void snapshot_saves(Record& r) const { saver_.snapshot_references(r); }

  void hold(Record&& r) {
    std::size_t bytes = 0;
    for (const PendingSave& s : r.saves) bytes += static_cast<std::size_t>(s.data.numel()) * s.data.element_size();
    std::lock_guard<std::mutex> lock(mutex_);
    held_bytes_ += bytes;
    held_.push_back(std::move(r));
  }

  const std::int64_t limit_;  // overflow_nums; -1: no limit
  TensorSaver saver_;
  bool force_device_ = false;
  mutable std::mutex mutex_;
  std::int64_t kept_ = 0;
  std::atomic<bool> ended_{false};
  std::vector<Record> held_;  // entries waiting for their device statistics
  std::size_t held_bytes_ = 0;
};

}  // namespace torchprobe

#pragma once
// Task::Statistics: every tensor becomes its Max/Min/Mean/Norm (or a checksum, summary_mode).
// With a tensor_list, the tensors of entries whose name contains one of its items are also saved
// to dump_tensor_data/ (msprobe's rule); Task::Tensor (tensor.hpp) saves every tensor. With
// bench_path, the live check (live_check.hpp) judges each entry against a reference dump as it
// ends and saves only the tensors of the first diff_nums entries where a difference starts.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "torchprobe/core/tensor_json.hpp"
#include "torchprobe/core/site.hpp"
#include "torchprobe/config/types.hpp"
#include "torchprobe/core/names.hpp"
#include "torchprobe/core/record.hpp"
#include "torchprobe/stats/checksum.hpp"
#include "torchprobe/stats/checksum_worker.hpp"
#include "torchprobe/stats/cpu_stats.hpp"
#include "torchprobe/stats/item_stats.hpp"
#include "torchprobe/task/live_check.hpp"
#include "torchprobe/task/tensor_saver.hpp"

namespace torchprobe {

class StatisticsTask {
 public:
  static constexpr std::string_view name = task_name(Task::Statistics);
  static constexpr LevelSet levels{Level::L0, Level::L1, Level::Mix, Level::L2, Level::Debug};
  static constexpr std::array<std::string_view, 4> config_keys{"summary_mode", "tensor_list", "bench_path",
                                                               "diff_nums"};
  // dump_tensor_data/ holds the tensors of the entries a tensor_list names (msprobe's rule), and
  // those of the entries the live check finds differing.
  static bool saves_tensors(const Config& c) { return !c.tensor_list.empty() || !c.bench_path.empty(); }

  // With the Recorder's saver (a tensor_list saves tensors); alone, it saves none.
  StatisticsTask(const Config& config, TensorSaver saver) : StatisticsTask(config, std::move(saver), false) {}
  explicit StatisticsTask(const Config& config) : StatisticsTask(config, TensorSaver(), false) {}

  // Tensors whose statistics are reduced where they live and read back in one batch at flush.
  // CPU tensors use the CPU kernels unless the device path is forced (tests use that to check
  // the device path against the CPU one without a GPU).
  void force_device_path(bool on) { force_device_ = on; }

  // The dump.json item for one tensor. `gradient` tensors are written with requires_grad false,
  // as msprobe does for the gradients it captures.
  nlohmann::ordered_json describe(const at::Tensor& t, const Site& site, Record& record, bool gradient = false) const {
    TensorSummary summary;
    if (summarize(t, site, record, summary)) {  // the common case: a CPU tensor's statistics, nothing more
      if (gradient) summary.requires_grad = false;
      return tensor_item(summary);
    }
    nlohmann::ordered_json j = tensor_header(t);
    const bool empty = t.numel() == 0 || !t.has_storage();
    if (mode_ == SummaryMode::Xor) {
      // xor mode writes no statistics; a 0-d tensor shows its value instead of a checksum.
      if (empty)
        j["md5"] = nullptr;
      else if (t.dim() == 0)
        j["md5"] = stats::cpu_stats(t.device().is_cpu() ? t : stats::host_contiguous(t)).max;
      else
        j["md5"] = stats::xor64_hex(t);
    } else {
      stats::put_tensor_stats(j, t, site, record, force_device_);  // a device tensor's: filled at flush
    }
    j["requires_grad"] = gradient ? false : t.requires_grad();
    if (live_)
      saver_.stage_reference(t, site, record);  // named and copied if keep() saves the entry
    else if (saves(record))
      saver_.stage(t, site, record, j);
    if (mode_ == SummaryMode::Md5) {
      if (empty) {
        j["md5"] = nullptr;
      } else if (auto later = checksums_->submit(t, force_device_)) {
        j["md5"] = nullptr;  // filled when the step is written
        record.pending_checksums.push_back({site.pointer, std::move(*later)});
      } else {
        j["md5"] = stats::crc32_hex(t);
      }
    }
    return j;
  }

  // The compact form of describe() for the common case, a CPU tensor summarised by statistics:
  // false when the tensor needs describe() (a device tensor, a checksum mode, a tensor to save).
  // With the live check the tensor is kept by reference too, for keep() to save if it must.
  bool summarize(const at::Tensor& t, const Site& site, Record& record, TensorSummary& out) const {
    if (mode_ != SummaryMode::Statistics || force_device_ || !t.device().is_cpu() || (!live_ && saves(record)))
      return false;
    if (live_) saver_.stage_reference(t, site, record);
    out.dtype = t.scalar_type();
    const at::IntArrayRef sizes = t.sizes();
    out.shape.assign(sizes.begin(), sizes.end());
    out.stats = stats::cpu_stats(t);  // nulls for empty tensors and dtypes without a kernel
    out.requires_grad = t.requires_grad();
    return true;
  }

  // Called for every finished entry before it joins the step; statistics keeps them all. With the
  // live check, the entry is judged now, and its tensors are saved only if the check says so.
  bool keep(Record& r) {
    // save() entries are written as asked; construct_only ones (inferred containers) are no entries.
    if (!live_ || is_save_entry(r.name) || r.construct_only) return true;
    settle(r);
    if (live_->judge(r).save)
      name_saved_files(r);
    else
      r.saves.clear();
    return true;
  }

  // The live check's report of each step, live_check.json.
  std::vector<std::pair<std::string, nlohmann::ordered_json>> step_files(const std::vector<const Record*>&,
                                                                         std::int64_t step) const {
    if (!live_ || !live_->any_checked() || !live_->reports(step)) return {};
    return {{"live_check.json", live_->report(step)}};
  }
  void set_step(std::int64_t step) {
    if (live_) live_->set_step(step);
  }

  // How many md5 checksums were computed off the training thread so far.
  std::uint64_t checksums_offloaded() const { return checksums_ ? checksums_->offloaded() : 0; }

  // Where saved tensors go (its writer() reports throughput and stalls).
  const TensorSaver& saver() const { return saver_; }

 protected:
  // `saver` (the Recorder's) is used for task tensor (save_every_tensor) and a non-empty tensor_list.
  StatisticsTask(const Config& config, TensorSaver saver, bool save_every_tensor)
      : mode_(config.summary_mode),
        saver_(save_every_tensor || saves_tensors(config) ? std::move(saver) : TensorSaver()),
        tensor_list_(config.tensor_list),
        save_every_tensor_(save_every_tensor),
        checksums_(mode_ == SummaryMode::Md5 ? std::make_unique<stats::ChecksumWorker>() : nullptr),
        live_(config.bench_path.empty() ? nullptr : std::make_unique<LiveCheck>(config, mode_ == SummaryMode::Md5)) {}

 private:
  // Are this entry's tensors saved to dump_tensor_data/?
  bool saves(const Record& record) const {
    return saver_.enabled() && (save_every_tensor_ || named_in_tensor_list(record.name));
  }

  // The values the live check judges, now: statistics still on the device and checksums still
  // being computed (one host synchronisation per entry while the check is on). A compact body
  // stays compact: the check reads it as it is.
  static void settle(Record& r) {
    if (!r.pending.empty() || !r.pending_checksums.empty()) r.materialize();  // their items are filled in place
    if (!r.pending.empty()) {
      std::vector<std::reference_wrapper<Record>> one{r};
      stats::resolve_pending_stats(one);
    }
    for (PendingChecksum& p : r.pending_checksums)
      r.body.at(nlohmann::ordered_json::json_pointer(p.pointer))["md5"] = p.value.get();
    r.pending_checksums.clear();
  }

  // The entry the live check saves: each item names its file (after "requires_grad" and before
  // "md5", msprobe's order), and the tensors are copied for the writer.
  void name_saved_files(Record& r) const {
    r.materialize();  // the items get a key: the body becomes JSON (a saved entry is rare)
    for (const PendingSave& s : r.saves) {
      if (s.pointer.empty()) continue;
      nlohmann::ordered_json& item = r.body.at(nlohmann::ordered_json::json_pointer(s.pointer));
      nlohmann::ordered_json md5;
      const bool has_md5 = item.contains("md5");
      if (has_md5) {
        md5 = std::move(item["md5"]);
        item.erase("md5");
      }
      item["data_name"] = s.file_name;
      if (has_md5) item["md5"] = std::move(md5);
    }
    saver_.snapshot_references(r);
  }

  bool named_in_tensor_list(const std::string& name) const {
    for (const std::string& item : tensor_list_)
      if (name.find(item) != std::string::npos) return true;
    return false;
  }

  SummaryMode mode_;
  bool force_device_ = false;
  TensorSaver saver_;  // enabled for task tensor and for a non-empty tensor_list only
  std::vector<std::string> tensor_list_;
  bool save_every_tensor_;
  std::unique_ptr<stats::ChecksumWorker> checksums_;  // md5 of large CPU tensors, off the training thread
  std::unique_ptr<LiveCheck> live_;                   // bench_path: each entry against a reference
};

}  // namespace torchprobe

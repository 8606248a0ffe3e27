#pragma once
// A tensor item's four statistics, now or at the flush: one rule for every task that writes them.
// A CPU tensor's are computed on the spot by the SIMD kernels; a device tensor's are reduced where
// it lives and read back later, all of a batch in one copy, so that no op waits for the device.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <vector>

#include "torchprobe/core/record.hpp"
#include "torchprobe/core/site.hpp"
#include "torchprobe/core/tensor_json.hpp"
#include "torchprobe/stats/cpu_stats.hpp"
#include "torchprobe/stats/device_stats.hpp"

namespace torchprobe::stats {

// Writes Max/Min/Mean/Norm of `t` into `item`: nulls for an empty tensor or a dtype without a
// kernel; the values for a CPU tensor; nulls for now for a device tensor (or any tensor, with
// `device_path`, which tests use to run this path without a GPU), with its reduction queued on
// `record` at `site`, for resolve_pending_stats().
inline void put_tensor_stats(nlohmann::ordered_json& item, const at::Tensor& t, const Site& site, Record& record,
                             bool device_path = false) {
  const bool empty = t.numel() == 0 || !t.has_storage();
  if (empty || !has_cpu_kernel(t.scalar_type())) {
    put_stats(item, TensorStats{});
  } else if (t.device().is_cpu() && !device_path) {
    put_stats(item, cpu_stats(t));
  } else {
    put_stats(item, TensorStats{});
    record.pending.push_back({site.pointer, device_stats_tensor(t), t.scalar_type(), t.dim() == 0});
  }
}

// Fills every statistic the records still wait for, with one device-to-host copy for all of
// them, and empties their `pending` lists. `Records`: a container of Record.
template <class Records>
void resolve_pending_stats(Records& records) {
  DeferredStats batch;
  for (const Record& r : records)
    for (const PendingStats& p : r.pending) batch.add_reduced(p.values, p.dtype, p.zero_dim);
  if (batch.empty()) return;
  const std::vector<TensorStats> resolved = batch.resolve();
  std::size_t next = 0;
  for (Record& r : records) {
    for (const PendingStats& p : r.pending)
      put_stats(r.body.at(nlohmann::ordered_json::json_pointer(p.pointer)), resolved[next++]);
    r.pending.clear();
  }
}

}  // namespace torchprobe::stats

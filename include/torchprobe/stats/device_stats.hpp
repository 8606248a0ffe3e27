#pragma once
// Statistics of a tensor on an accelerator, reduced where the tensor lives.
//
// Reading each statistic back with .item() would synchronise the host with the device four
// times per tensor. Instead the four values are reduced on the device into one small float64
// tensor that stays there; the step's pending tensors are copied to the host in one batch when
// the step is flushed (see DeferredStats).
#include <ATen/ATen.h>

#include <vector>

#include "torchprobe/core/tensor_stats.hpp"
#include "torchprobe/core/probe_guard.hpp"

namespace torchprobe::stats {

// Reduce `t` on its own device into a float64 tensor [max, min, mean, norm]. No host sync.
// bool: [any, all, -, -]; complex: statistics of |z|. Callers check numel() > 0 first.
inline at::Tensor device_stats_tensor(const at::Tensor& t) {
  ProbeGuard guard;
  if (t.scalar_type() == at::kBool) {
    const at::Tensor any = t.any().to(at::kDouble);
    const at::Tensor all = t.all().to(at::kDouble);
    return at::stack({any, all, any, any});
  }
  const at::Tensor x = t.is_complex() ? t.to(at::kComplexDouble).abs() : t.to(at::kDouble);
  // norm of |z| equals the complex tensor's L2 norm.
  return at::stack({x.max(), x.min(), x.mean(), x.norm()});
}

// Turn the four reduced values back into statistics with the rules of cpu_stats: Max/Min keep
// the dtype's kind, bool has null Mean/Norm, a 0-d tensor shows its value in all four.
inline TensorStats decode_device_stats(const double* v, at::ScalarType dtype, bool zero_dim) {
  TensorStats s;
  if (dtype == at::kBool) {
    s.max = StatValue::boolean(v[0] != 0.0);
    s.min = StatValue::boolean(v[1] != 0.0);
    return s;
  }
  if (at::isIntegralType(dtype, /*includeBool=*/false)) {
    s.max = StatValue::integer(static_cast<std::int64_t>(v[0]));
    s.min = StatValue::integer(static_cast<std::int64_t>(v[1]));
  } else {
    s.max = StatValue::real(v[0]);
    s.min = StatValue::real(v[1]);
  }
  s.mean = StatValue::real(zero_dim ? v[0] : v[2]);
  s.norm = StatValue::real(zero_dim ? v[0] : v[3]);
  return s;
}

// Statistics waiting on the device. `add` keeps the reduced tensor; `resolve` copies them all to
// the host with one transfer and hands each result back in the order they were added.
class DeferredStats {
 public:
  struct Item {
    at::Tensor values;  // float64 [4] on the device
    at::ScalarType dtype;
    bool zero_dim;
  };

  std::size_t add(const at::Tensor& t) { return add_reduced(device_stats_tensor(t), t.scalar_type(), t.dim() == 0); }
  // For values already reduced by device_stats_tensor.
  std::size_t add_reduced(at::Tensor values, at::ScalarType dtype, bool zero_dim) {
    items_.push_back({std::move(values), dtype, zero_dim});
    return items_.size() - 1;
  }
  bool empty() const { return items_.empty(); }
  std::size_t size() const { return items_.size(); }

  std::vector<TensorStats> resolve() {
    std::vector<TensorStats> out;
    if (items_.empty()) return out;
    ProbeGuard guard;
    std::vector<at::Tensor> parts;
    parts.reserve(items_.size());
    for (auto& it : items_) parts.push_back(it.values.to(items_.front().values.device()));
    // One device-to-host copy for the whole batch.
    const at::Tensor host = at::stack(parts).to(at::kCPU).contiguous();
    const double* p = host.data_ptr<double>();
    out.reserve(items_.size());
    for (std::size_t k = 0; k < items_.size(); ++k)
      out.push_back(decode_device_stats(p + 4 * k, items_[k].dtype, items_[k].zero_dim));
    items_.clear();
    return out;
  }

 private:
  std::vector<Item> items_;
};

}  // namespace torchprobe::stats

#pragma once
// What grad_probe records of each gradient (msprobe-grad-probe-run-ut.md §A.4, §A.5), computed where
// the gradient lives: every statistic, count and direction of one step is reduced on the device into
// byte tensors that go to the host in one copy per device (no synchronisation per parameter).
//
// Exact where msprobe is not: max and min are exact in any dtype, the norm is accumulated in float64
// (msprobe's fp16 norm overflows to inf) and reported rounded to float32 as msprobe reports it.
#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <zlib.h>

#include "torchprobe/config/types.hpp"
#include "torchprobe/core/tensor_stats.hpp"
#include "torchprobe/stats/cpu_stats.hpp"

namespace torchprobe::grad_probe {

// One monitored parameter's gradient at this step.
struct NamedGrad {
  std::string name;
  at::Tensor grad;
};

// What the CSV row and the direction files are made of.
struct GradSummary {
  std::string name;
  std::vector<std::int64_t> shape;
  std::int64_t numel = 0;
  double max = 0, min = 0, norm = 0;  // float32 values, as msprobe's .float()
  std::vector<std::int64_t> buckets;  // L2: elements per interval (bounds.size() + 1)
  std::int64_t zeros = 0;             // L2: elements == 0
  std::uint32_t crc = 0;              // L0: CRC-32 of the float32-cast bytes (msprobe's "MD5")
  std::string direction;              // L1/L2: grad > 0, one byte (0/1) per element
  std::string sign;                   // L1/L2 with signs: -1, 0, +1 as int8 bytes (NaN is 0)
};

namespace details {

inline at::Tensor as_bytes(const at::Tensor& t) { return t.contiguous().reshape({-1}).view(at::kByte); }

// The bounds as msprobe's bucketize sees them: float32 values, in the dtype the gradient is compared in.
inline at::Tensor bounds_tensor(const std::vector<GradBound>& bounds, const at::Tensor& like) {
  std::vector<float> v;
  for (const GradBound& b : bounds) v.push_back(static_cast<float>(b.value));
  at::Tensor t = at::tensor(v, at::TensorOptions().dtype(at::kFloat));
  return t.to(like.options());
}

}  // namespace details

class GradStatsComputer {
 public:
  GradStatsComputer(GradLevel level, std::vector<GradBound> bounds, bool with_sign)
      : level_(level), bounds_(std::move(bounds)), with_sign_(with_sign) {}

  // How CPU gradients are read: Scan (float32/float64: one C++ pass over the values), or as device
  // gradients are: ATen reductions with bucketize (Torch) or with counts of x <= b (TorchByComparison,
  // the device way). Tests check that all three agree.
  enum class CpuMode { Scan, Torch, TorchByComparison };
  void cpu_mode(CpuMode mode) { cpu_mode_ = mode; }

  std::vector<GradSummary> compute(const std::vector<NamedGrad>& grads) {
    std::vector<GradSummary> out(grads.size());
    std::vector<at::Tensor> parts;  // byte tensors on the grads' devices
    std::vector<std::size_t> first(grads.size(), 0), count(grads.size(), 0);
    std::vector<bool> scanned(grads.size(), false);
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const at::Tensor& g = grads[i].grad;
      GradSummary& s = out[i];
      s.name = grads[i].name;
      s.shape = g.sizes().vec();
      s.numel = g.numel();
      first[i] = parts.size();
      if (s.numel == 0) continue;
      if (g.is_cpu() && cpu_mode_ == CpuMode::Scan && g.scalar_type() == at::kFloat) {
        scan_cpu<float>(g, s);
        scanned[i] = true;
        continue;
      }
      if (g.is_cpu() && cpu_mode_ == CpuMode::Scan && g.scalar_type() == at::kDouble) {
        scan_cpu<double>(g, s);
        scanned[i] = true;
        continue;
      }
      queue(g, parts);
      count[i] = parts.size() - first[i];
    }
    const std::vector<std::pair<const std::uint8_t*, std::size_t>> host = to_host(parts);
    for (std::size_t i = 0; i < grads.size(); ++i)
      if (!scanned[i]) fill(out[i], host, first[i], count[i]);
    return out;
  }

 private:
  // Appends this gradient's byte tensors: stats (float64), [float32 bytes], [direction], [sign].
  void queue(const at::Tensor& g, std::vector<at::Tensor>& parts) {
    // aminmax (one pass) lacks fp16 on libtorch 1.13's CPU; widening to float32 is exact.
    const bool narrow = g.scalar_type() == at::kHalf || g.scalar_type() == at::kBFloat16;
    const auto extrema = at::aminmax(narrow && g.is_cpu() ? g.to(at::kFloat) : g);
    std::vector<at::Tensor> stats = {std::get<1>(extrema).to(at::kDouble).reshape({1}),
                                     std::get<0>(extrema).to(at::kDouble).reshape({1}),
                                     at::linalg_vector_norm(g, 2, c10::nullopt, false, at::kDouble).reshape({1})};
    if (level_ == GradLevel::L2) {
      // msprobe: bucketize(grad, float32 bounds), bf16 as float32; zeros also counted in their interval.
      const at::Tensor x = g.scalar_type() == at::kDouble ? g : g.to(at::kFloat);
      const int64_t n = static_cast<int64_t>(bounds_.size()) + 1;
      if (bounds_.empty()) {
        stats.push_back(at::full({1}, static_cast<double>(g.numel()), g.options().dtype(at::kDouble)));
      } else if (x.is_cpu() && cpu_mode_ != CpuMode::TorchByComparison) {
        const at::Tensor idx = at::bucketize(x, bounds_on(x), false, false).reshape({-1});
        stats.push_back(at::bincount(idx, {}, n).to(at::kDouble));
      } else {
        // bincount sizes its output from the data (a synchronisation); counts of x <= b_i do not:
        // interval i holds those <= b_i and not <= b_(i-1); NaN is <= nothing, so it lands in the last.
        const at::Tensor b = bounds_on(x);
        std::vector<at::Tensor> le;
        for (int64_t i = 0; i + 1 < n; ++i) le.push_back((x <= b[i]).sum().to(at::kDouble).reshape({1}));
        le.push_back(at::full({1}, static_cast<double>(x.numel()), x.options().dtype(at::kDouble)));
        const at::Tensor cum = at::cat(le);
        stats.push_back(at::cat({cum.slice(0, 0, 1), cum.slice(0, 1) - cum.slice(0, 0, n - 1)}));
      }
      stats.push_back((g == 0).sum().to(at::kDouble).reshape({1}));
    }
    parts.push_back(at::cat(stats).view(at::kByte));
    if (level_ == GradLevel::L0) parts.push_back(details::as_bytes(g.to(at::kFloat)));
    if (level_ != GradLevel::L0) {
      parts.push_back(details::as_bytes(g > 0));
      if (with_sign_) parts.push_back(details::as_bytes((g > 0).to(at::kChar) - (g < 0).to(at::kChar)));
    }
  }

  // A CPU float32/float64 gradient: max, min and norm from the statistics kernels (SIMD, double
  // accumulation, ATen's NaN rules), then one branch-free pass per output (direction, sign, one per
  // bound, zeros), which the compiler vectorises: a NaN is > nothing, so it falls in the last interval.
  template <class T>
  void scan_cpu(const at::Tensor& g, GradSummary& s) const {
    const at::Tensor c = g.contiguous();
    const T* p = c.data_ptr<T>();
    const auto n = static_cast<std::size_t>(c.numel());
    const TensorStats st = stats::cpu_stats(c.reshape({-1}));  // a 0-d norm is |v|, not msprobe's dump rule
    auto as_float = [](const StatValue& v) { return static_cast<double>(static_cast<float>(v.d)); };
    s.max = as_float(st.max);
    s.min = as_float(st.min);
    s.norm = as_float(st.norm);
    if (level_ != GradLevel::L0) {
      s.direction.resize(n);
      char* d = s.direction.data();
      for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<char>(p[i] > T(0));
      if (with_sign_) {
        s.sign.resize(n);
        char* q = s.sign.data();
        for (std::size_t i = 0; i < n; ++i) q[i] = static_cast<char>((p[i] > T(0)) - (p[i] < T(0)));
      }
    }
    if (level_ == GradLevel::L2) s.buckets = bucket_counts(p, n, std::isnan(s.max), s.zeros);
    if (level_ == GradLevel::L0) {
      const at::Tensor f = c.to(at::kFloat);  // the same tensor when it is float32 already
      s.crc = crc32_bytes(reinterpret_cast<const std::uint8_t*>(f.data_ptr<float>()), n * sizeof(float));
    }
  }

  // Elements per interval (b[k-1] < x <= b[k], float32 bounds) from counts above each bound.
  template <class T>
  std::vector<std::int64_t> bucket_counts(const T* p, std::size_t n, bool has_nan, std::int64_t& zeros) const {
    auto count = [&](auto&& pred) {
      std::int64_t c = 0;
      for (std::size_t i = 0; i < n; ++i) c += pred(p[i]) ? 1 : 0;
      return c;
    };
    const std::int64_t nans = has_nan ? count([](T v) { return v != v; }) : 0;
    std::vector<std::int64_t> above;
    for (const GradBound& x : bounds_) {
      const T b = static_cast<T>(static_cast<float>(x.value));
      above.push_back(count([b](T v) { return v > b; }));
    }
    zeros = count([](T v) { return v == T(0); });
    std::vector<std::int64_t> buckets(above.size() + 1, 0);
    const auto valid = static_cast<std::int64_t>(n) - nans;
    for (std::size_t k = 0; k <= above.size(); ++k)
      buckets[k] = (k == 0 ? valid : above[k - 1]) - (k == above.size() ? -nans : above[k]);
    return buckets;
  }

  static std::uint32_t crc32_bytes(const std::uint8_t* p, std::size_t left) {
    uLong crc = crc32(0L, Z_NULL, 0);
    while (left > 0) {  // zlib takes uInt lengths
      const uInt chunk = static_cast<uInt>(std::min<std::size_t>(left, std::size_t(1) << 30));
      crc = crc32(crc, p, chunk);
      p += chunk;
      left -= chunk;
    }
    return static_cast<std::uint32_t>(crc);
  }

  // CPU parts are read in place; the parts of each other device are concatenated and copied once.
  static std::vector<std::pair<const std::uint8_t*, std::size_t>> to_host(std::vector<at::Tensor>& parts) {
    std::vector<std::pair<const std::uint8_t*, std::size_t>> host(parts.size());
    std::map<std::string, std::vector<std::size_t>> by_device;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].device().is_cpu())
        host[i] = {parts[i].data_ptr<std::uint8_t>(), static_cast<std::size_t>(parts[i].numel())};
      else
        by_device[parts[i].device().str()].push_back(i);
    }
    for (auto& [device, ids] : by_device) {
      std::vector<at::Tensor> group;
      for (std::size_t i : ids) group.push_back(parts[i]);
      at::Tensor copied = at::cat(group).to(at::kCPU);  // the one device-to-host copy of this device
      std::size_t offset = 0;
      for (std::size_t i : ids) {
        const auto n = static_cast<std::size_t>(parts[i].numel());
        host[i] = {copied.data_ptr<std::uint8_t>() + offset, n};
        offset += n;
      }
      parts.push_back(copied);  // keeps the host copy alive while `host` points into it
    }
    return host;
  }

  void fill(GradSummary& s, const std::vector<std::pair<const std::uint8_t*, std::size_t>>& host, std::size_t first,
            std::size_t count) const {
    if (count == 0) {  // an empty gradient: msprobe's torch.max would raise; no values, no counts
      s.max = s.min = std::numeric_limits<double>::quiet_NaN();
      s.norm = 0;
      if (level_ == GradLevel::L2) s.buckets.assign(bounds_.size() + 1, 0);
      return;
    }
    std::size_t k = first;
    std::vector<double> stats(host[k].second / sizeof(double));
    std::memcpy(stats.data(), host[k].first, host[k].second);
    ++k;
    auto as_float = [](double v) { return static_cast<double>(static_cast<float>(v)); };
    s.max = as_float(stats[0]);
    s.min = as_float(stats[1]);
    s.norm = as_float(stats[2]);
    if (level_ == GradLevel::L2) {
      for (std::size_t b = 0; b <= bounds_.size(); ++b) s.buckets.push_back(static_cast<std::int64_t>(stats[3 + b]));
      s.zeros = static_cast<std::int64_t>(stats[3 + bounds_.size() + 1]);
    }
    if (level_ == GradLevel::L0) {
      s.crc = crc32_bytes(host[k].first, host[k].second);
      ++k;
    } else {
      s.direction.assign(reinterpret_cast<const char*>(host[k].first), host[k].second);
      ++k;
      if (with_sign_) s.sign.assign(reinterpret_cast<const char*>(host[k].first), host[k].second);
    }
    (void)count;
  }

  const at::Tensor& bounds_on(const at::Tensor& like) {
    const std::string key = like.device().str() + "/" + std::string(c10::toString(like.scalar_type()));
    auto it = bounds_cache_.find(key);
    if (it == bounds_cache_.end()) it = bounds_cache_.emplace(key, details::bounds_tensor(bounds_, like)).first;
    return it->second;
  }

  GradLevel level_;
  std::vector<GradBound> bounds_;
  bool with_sign_;
  CpuMode cpu_mode_ = CpuMode::Scan;
  std::map<std::string, at::Tensor> bounds_cache_;
};

}  // namespace torchprobe::grad_probe

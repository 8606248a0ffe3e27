#pragma once
// free_benchmark's preheat (if_preheat true; msprobe-reference.md §7.3, msprobe's PreheatHandler and
// PreheatCounter): which calls are checked, and the per-API, per-dtype threshold they are judged by.
//  - step 0 only counts the calls of each API (`total`);
//  - from step 1 on, of an API's calls in a step (numbered 1, 2, ... in call order) those numbered
//    (preheat_step * (i - 1) + step) % total (0 read as total), i = 1..k, are sampled, with
//    k = min(ceil(total / preheat_step), max_sample); over preheat_step steps every call number is seen;
//  - in steps 1 .. preheat_step - 1 a sampled call is also compared with the CPU (to_cpu's standard),
//    and the API's threshold for the dtype of its first output, which starts at 2.05, is adapted
//    after the step's k-th sample: CPU-consistent ratios only -> thd - 1 halved (doubled when one of
//    them is above thd); inconsistent ones above every consistent one -> the smallest inconsistent
//    ratio, and that dtype is no longer preheated; never below the dtype's default threshold.
// Difference from msprobe: msprobe re-runs and compares every call from step 1 on and samples only
// its CPU comparisons; TorchProbe re-runs the sampled calls only, in every step (the cost: at most k
// re-runs per API per step). Nothing here needs libtorch: dtypes are their names ("torch.float16").
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchprobe::free_benchmark {

// A call chosen for checking: what the preheat needs to know of it when it is decided.
struct Sample {
  std::int64_t step = 0;
  bool with_cpu = false;      // a preheat step: compared with the CPU as well
  std::int64_t sampled = 0;   // how many of its API's calls were sampled in the step, this one included
  std::int64_t per_step = 0;  // k of its API
};

class Preheat {
 public:
  static constexpr double kInitialThreshold = 2.05;
  static constexpr double kThresholdStep = 2.0;

  Preheat(std::int64_t preheat_step, std::int64_t max_sample) : preheat_step_(preheat_step), max_sample_(max_sample) {}

  // The step the next calls belong to.
  void set_step(std::int64_t step) {
    if (step == step_) return;
    step_ = step;
    called_.clear();
    sampled_.clear();
  }
  std::int64_t step() const { return step_; }

  // At a call's start: the sample, or nothing when the call is not checked (step 0 counts it).
  std::optional<Sample> sample(const std::string& api) {
    if (step_ == 0) {
      ++total_[api];
      return std::nullopt;
    }
    const std::int64_t total = total_count(api);
    const std::int64_t seq = ++called_[api];
    if (total == 0) return std::nullopt;
    const std::int64_t k = per_step(api);
    bool chosen = false;
    for (std::int64_t i = 1; i <= k && !chosen; ++i) {
      std::int64_t n = (preheat_step_ * (i - 1) + step_) % total;
      chosen = (n == 0 ? total : n) == seq;
    }
    if (!chosen) return std::nullopt;
    return Sample{step_, step_ < preheat_step_, ++sampled_[api], k};
  }

  std::int64_t total_count(const std::string& api) const {
    const auto it = total_.find(api);
    return it == total_.end() ? 0 : it->second;
  }
  // k: how many of the API's calls are sampled per step.
  std::int64_t per_step(const std::string& api) const {
    const std::int64_t total = total_count(api);
    return std::min((total + preheat_step_ - 1) / preheat_step_, max_sample_);
  }

  // The threshold an output of `dtype` of `api` is judged by now.
  double threshold(const std::string& api, const std::string& dtype) {
    return thresholds_[api].emplace(dtype, kInitialThreshold).first->second;
  }
  const std::map<std::string, std::map<std::string, double>>& thresholds() const { return thresholds_; }

  // A sampled call compared with the CPU, decided (in call order): its largest ratio over its
  // outputs, whether the CPU agreed with it, and its first output's dtype and default threshold.
  void learn(const std::string& api, const Sample& s, const std::string& dtype, double default_threshold,
             double max_ratio, bool cpu_consistent) {
    if (!s.with_cpu) return;
    if (s.step != record_step_) {
      record_step_ = s.step;
      record_.clear();
    }
    if (!preheating(api, dtype)) return;
    defaults_[dtype] = default_threshold;
    record_[api][dtype].emplace_back(max_ratio, cpu_consistent);
    if (s.sampled < s.per_step) return;
    for (const auto& [d, results] : record_[api]) {
      const double adapted = adapt(api, d, results);
      thresholds_[api][d] = std::max(adapted, defaults_[d]);
    }
  }

  bool preheating(const std::string& api, const std::string& dtype) const {
    const auto a = done_.find(api);
    return a == done_.end() || !a->second.count(dtype);
  }

 private:
  double adapt(const std::string& api, const std::string& dtype, const std::vector<std::pair<double, bool>>& results) {
    std::vector<double> con, incon;
    for (const auto& [ratio, ok] : results) (ok ? con : incon).push_back(ratio);
    const double old = threshold(api, dtype);
    if (!con.empty() && !incon.empty()) {
      const double lowest_bad = *std::min_element(incon.begin(), incon.end());
      if (lowest_bad <= *std::max_element(con.begin(), con.end())) return old;
      done_[api][dtype] = true;
      return std::min(lowest_bad, old);
    }
    if (!con.empty()) {
      const bool missed = *std::max_element(con.begin(), con.end()) > old;
      return missed ? 1 + (old - 1) * kThresholdStep : 1 + (old - 1) / kThresholdStep;
    }
    done_[api][dtype] = true;
    return std::min(*std::min_element(incon.begin(), incon.end()), old);
  }

  const std::int64_t preheat_step_, max_sample_;
  std::int64_t step_ = 0;
  std::map<std::string, std::int64_t> total_;    // calls per API in step 0
  std::map<std::string, std::int64_t> called_;   // calls per API in this step
  std::map<std::string, std::int64_t> sampled_;  // sampled calls per API in this step
  // Decided in call order, at flush:
  std::map<std::string, std::map<std::string, double>> thresholds_;
  std::map<std::string, std::map<std::string, bool>> done_;  // dtypes no longer preheated
  std::map<std::string, double> defaults_;
  std::int64_t record_step_ = -1;
  std::map<std::string, std::map<std::string, std::vector<std::pair<double, bool>>>> record_;
};

}  // namespace torchprobe::free_benchmark

#pragma once
// GradMonitor: msprobe's grad_probe task (msprobe-grad-probe-run-ut.md part A; docs/grad_probe.md).
//
//   torchprobe::GradMonitor mon("config.json");   // "task": "grad_probe"
//   mon.monitor(model);                            // once, before training
//   ... loss.backward(); [clip / unscale]; mon.step(); optimizer.step();
//
// libtorch has no optimizer hooks, so step() is called where msprobe's optimizer step pre-hook runs:
// it reads the gradients the optimizer is about to use and writes
//   {dump_path}/rank{R}/grad_summary_{step}.csv          (all levels)
//   {dump_path}/rank{R}/step{step}/{param_name}.npy      (L1, L2: grad > 0, NumPy bool)
//   {dump_path}/rank{R}/grad_probe_run.jsonl             (TorchProbe's: this run's id, steps, parameters)
// Steps are this monitor's own step() calls, counted from 0 (msprobe counts every optimizer's steps).
// The rank is read at every step ($RANK, else 0), not once. Failures never reach training: they go
// to rank{R}/dump_error_info.log.
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "torchprobe/config/grad_probe.hpp"
#include "torchprobe/config/options.hpp"
#include "torchprobe/io/error_log.hpp"
#include "torchprobe/io/files.hpp"
#include "torchprobe/io/npy.hpp"
#include "torchprobe/task/grad_probe/grad_stats.hpp"
#include "torchprobe/io/grad_run_manifest.hpp"
#include "torchprobe/task/grad_probe/summary_csv.hpp"

namespace torchprobe {

class GradMonitor {
 public:
  // The configuration file (task grad_probe); `overrides` win over it, as for a Debugger.
  explicit GradMonitor(const std::string& config_path, Options overrides = Options())
      : GradMonitor(overrides.config_file(config_path)) {}
  explicit GradMonitor(const Options& options) : GradMonitor(options.resolve(std::nullopt, Task::GradProbe)) {}
  explicit GradMonitor(Config config)
      : config_(std::move(config)),
        stats_(config_.grad_probe.grad_level, config_.grad_probe.bounds, /*with_sign=*/false) {}

  // Also writes rank{R}/sign/step{step}/{param_name}.npy (int8 -1, 0, +1) beside msprobe's bool
  // file, whose False mixes zeros and negatives; `torchprobe grad-compare` compares signs when present.
  GradMonitor& write_signs(bool on = true) {
    signs_ = on;
    stats_ = grad_probe::GradStatsComputer(config_.grad_probe.grad_level, config_.grad_probe.bounds, on);
    return *this;
  }

  // The parameters to watch, in named_parameters() order (param_list, when given, selects by exact name).
  void monitor(const torch::nn::Module& model) {
    params_.clear();
    const auto& wanted = config_.grad_probe.param_list;
    for (const auto& item : model.named_parameters(/*recurse=*/true)) {
      if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), item.key()) == wanted.end()) continue;
      params_.push_back({item.key(), item.value()});
    }
  }
  template <class T>
  void monitor(const std::shared_ptr<T>& model) {
    monitor(static_cast<const torch::nn::Module&>(*model));
  }
  template <class T>
  void monitor(const torch::nn::ModuleHolder<T>& model) {
    monitor(static_cast<const torch::nn::Module&>(*model));
  }

  // Right before optimizer.step(): counts the step and records it when the step (and rank) is
  // selected. `rank_id` overrides $RANK. Never throws.
  void step(std::optional<std::int64_t> rank_id = std::nullopt) noexcept {
    ++step_;
    std::int64_t rank = 0;
    try {
      const std::optional<std::int64_t> known = rank_id ? rank_id : env_rank();
      rank = known.value_or(0);
      if (!config_.step.contains(step_)) return;
      if (known && !config_.rank.contains(rank)) return;  // a process without a rank is not filtered, as msprobe
      record(rank);
    } catch (const std::exception& e) {
      io::ErrorLog(rank_dir(rank)).log("grad_probe_step", "step" + std::to_string(step_), e);
    } catch (...) {
      io::ErrorLog(rank_dir(rank)).log("grad_probe_step", "step" + std::to_string(step_), "unknown", "unknown error");
    }
  }

  const Config& config() const { return config_; }
  // This monitor's run id (grad_probe_run.jsonl); empty before its first recorded step.
  const std::string& run_id() const { return run_id_; }
  std::int64_t current_step() const { return step_; }  // -1 before the first step()

 private:
  struct Param {
    std::string name;
    at::Tensor tensor;
  };

  static std::optional<std::int64_t> env_rank() {
    const char* env = std::getenv("RANK");
    if (!env || !*env) return std::nullopt;
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (*end != '\0' || v < 0) return std::nullopt;
    return v;
  }

  std::string rank_dir(std::int64_t rank) const { return config_.dump_path + "/rank" + std::to_string(rank); }

  void record(std::int64_t rank) {
    std::vector<grad_probe::NamedGrad> grads;
    for (const Param& p : params_) {
      const at::Tensor& g = p.tensor.grad();
      if (!g.defined()) {  // msprobe: a warning, no row, no file
        if (none_reported_.insert(p.name).second)
          std::cerr << "[torchprobe] grad_probe: grad is None: " << p.name << "\n";
        continue;
      }
      grads.push_back({p.name, g.detach()});
    }
    const std::vector<grad_probe::GradSummary> rows = stats_.compute(grads);

    const GradLevel level = config_.grad_probe.grad_level;
    const std::string dir = rank_dir(rank);
    io::create_directories(dir, 0750);
    if (manifest_started_.insert(rank).second) {  // this run's first step in this rank directory
      if (run_id_.empty()) run_id_ = grad_probe::new_run_id();
      grad_probe::start_run_manifest(dir, run_id_, grad_level_name(level));
    }
    write_step_files(dir, level, rows);
    std::vector<std::string> names;
    for (const grad_probe::GradSummary& s : rows) names.push_back(io::safe_component(s.name));  // as files are named
    grad_probe::append_run_step(dir, step_, names);  // last: a listed step is a complete one
  }

  void write_step_files(const std::string& dir, GradLevel level, const std::vector<grad_probe::GradSummary>& rows) {
    io::write_file_atomic(dir + "/grad_summary_" + std::to_string(step_) + ".csv",
                          grad_probe::summary_csv(level, config_.grad_probe.bounds, rows), 0640, false);
    if (level == GradLevel::L0) return;
    const std::string step_dir = dir + "/step" + std::to_string(step_);
    io::create_directories(step_dir, 0750);
    for (const grad_probe::GradSummary& s : rows)
      write_npy(step_dir + "/" + io::safe_component(s.name) + ".npy", "|b1", s.shape, s.direction);
    if (!signs_) return;
    const std::string sign_dir = dir + "/sign/step" + std::to_string(step_);
    io::create_directories(sign_dir, 0750);
    for (const grad_probe::GradSummary& s : rows)
      write_npy(sign_dir + "/" + io::safe_component(s.name) + ".npy", "|i1", s.shape, s.sign);
  }

  static void write_npy(const std::string& path, const char* descr, const std::vector<std::int64_t>& shape,
                        const std::string& data) {
    io::AtomicFile f(path, 0640);
    f.write(io::npy_header(descr, shape));
    f.write(data);
    f.commit(false);
  }

  Config config_;
  grad_probe::GradStatsComputer stats_;
  bool signs_ = false;
  std::vector<Param> params_;
  std::set<std::string> none_reported_;
  std::set<std::int64_t> manifest_started_;  // ranks whose directory holds this run's manifest
  std::string run_id_;
  std::int64_t step_ = -1;
};

}  // namespace torchprobe

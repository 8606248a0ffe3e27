#pragma once
// Task::FreeBenchmark (classic msprobe's free_benchmark; docs/free_benchmark.md): which API of a run
// is numerically fragile, without a reference run. Each outermost ATen call (level L1) whose first
// valid argument is a floating tensor or a list is run a second time, through the dispatcher (the
// same operator handle, boxed, under ProbeGuard so it is never recorded), with perturbed inputs
// (task/free_benchmark/perturbation.hpp); the outputs are compared (comparison.hpp) and the
// inconsistent ones listed in free_benchmark.csv, with a per-API summary (report.hpp).
//
// - The re-run happens when the call starts, on the probe's own values: arguments the op writes
//   (in-place self, out=) are copies, so in check mode nothing the user holds changes.
// - Calls that draw random numbers are not re-run: a second draw would move the generator.
// - handler_type fix: the outputs are overwritten in place with the re-run's values cast back
//   (forward only), so training continues with them.
// - No entry is made of a call: dump.json's "data" stays {} as msprobe's does.
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "torchprobe/capture/call_check.hpp"
#include "torchprobe/capture/op_registry.hpp"
#include "torchprobe/capture/value_encoder.hpp"
#include "torchprobe/config/types.hpp"
#include "torchprobe/core/probe_guard.hpp"
#include "torchprobe/core/record.hpp"
#include "torchprobe/core/tensor_json.hpp"
#include "torchprobe/stats/cpu_stats.hpp"
#include "torchprobe/task/free_benchmark/comparison.hpp"
#include "torchprobe/task/free_benchmark/perturbation.hpp"
#include "torchprobe/task/free_benchmark/report.hpp"

namespace torchprobe {

class FreeBenchmarkTask {
 public:
  static constexpr Task kind = Task::FreeBenchmark;
  static constexpr LevelSet levels{Level::L1};
  static constexpr std::array<std::string_view, 8> config_keys{"fuzz_device",  "pert_mode",  "handler_type",
                                                               "fuzz_level",   "fuzz_stage", "if_preheat",
                                                               "preheat_step", "max_sample"};
  static bool saves_tensors(const Config&) { return false; }

  explicit FreeBenchmarkTask(const Config& config) : cfg_(config.free_benchmark) {}

  // Only save()'s values are described (debug.json): with statistics, as task statistics does.
  nlohmann::ordered_json describe(const at::Tensor& t, const capture::Site&, Record&, bool gradient = false) const {
    nlohmann::ordered_json j = tensor_header(t);
    const bool empty = t.numel() == 0 || !t.has_storage();
    put_stats(j, !empty && t.device().is_cpu() && stats::has_cpu_kernel(t.scalar_type()) ? stats::cpu_stats(t)
                                                                                         : TensorStats{});
    j["requires_grad"] = gradient ? false : t.requires_grad();
    return j;
  }
  // Calls make no entries; save()'s entries ("{name}.{n}.debug") are written as asked.
  bool keep(Record& r) const { return r.name.size() > 6 && r.name.compare(r.name.size() - 6, 6, ".debug") == 0; }

  // The call starts: perturb its inputs and re-run it now, while they are as the user gave them.
  template <class Values>
  std::unique_ptr<capture::CallCheck> check_call(const capture::OpInfo& op, const Values& inputs,
                                                 const std::string& name) {
    if (!op.handle || !op.schema_known || draws_random_numbers(op)) return nullptr;
    std::vector<c10::IValue> stack(inputs.begin(), inputs.end());
    const std::ptrdiff_t valid = free_benchmark::first_valid_input(
        stack, [&](std::size_t i) { return i >= op.args.size() || !op.args[i].kwarg_only; });
    if (valid < 0) return nullptr;
    ProbeGuard guard;
    if (!free_benchmark::perturb(cfg_.pert_mode, stack, valid)) return nullptr;
    auto copy = [](const at::Tensor& t) { return t.defined() ? t.clone() : at::Tensor(); };
    for (std::size_t i = 0; i < stack.size() && i < op.args.size(); ++i)
      if (op.args[i].written) stack[i] = free_benchmark::map_tensors(stack[i], copy);
    op.handle->callBoxed(&stack);
    auto check = std::make_unique<Rerun>();
    check->name = name;
    check->outputs = std::move(stack);
    return check;
  }

  // The call ended: compare its outputs with the re-run's (and, with fix, take the re-run's).
  template <class Values>
  void check_call_end(capture::CallCheck& check, const Values& outputs) {
    Rerun& rerun = static_cast<Rerun&>(check);
    ProbeGuard guard;
    free_benchmark::CheckedCall call{std::move(rerun.name), {}};
    const std::size_t n = std::min<std::size_t>(outputs.size(), rerun.outputs.size());
    for (std::size_t k = 0; k < n; ++k) {
      const c10::IValue& o = outputs[k];
      const c10::IValue& p = rerun.outputs[k];
      const std::optional<int64_t> index = n > 1 ? std::optional<int64_t>(static_cast<int64_t>(k)) : std::nullopt;
      if (o.isTensor() && p.isTensor()) {
        compare_tensors(o.toTensor(), p.toTensor(), index, call);
      } else if (o.isTensorList() && p.isTensorList() && n == 1) {
        const std::vector<at::Tensor> os = o.toTensorList().vec(), ps = p.toTensorList().vec();
        for (std::size_t i = 0; i < os.size() && i < ps.size(); ++i)
          compare_tensors(os[i], ps[i], static_cast<int64_t>(i), call);
      } else if ((o.isInt() && p.isInt()) || (o.isDouble() && p.isDouble())) {
        call.outputs.push_back(compare_scalars(o, p, index));
      }
    }
    if (call.outputs.empty()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    fresh_.push_back(std::move(call));
  }

  // free_benchmark_summary.json, for every dumped step.
  std::vector<std::pair<std::string, nlohmann::ordered_json>> step_files(const std::vector<const Record*>&,
                                                                         std::int64_t step) const {
    return {{"free_benchmark_summary.json", free_benchmark::summary_json(collect(step), cfg_, step)}};
  }
  // free_benchmark.csv, for a step with an inconsistent call.
  std::vector<std::pair<std::string, std::string>> step_text_files(std::int64_t step, std::int64_t rank) const {
    std::string csv = free_benchmark::csv_text(collect(step), cfg_, step, rank);
    if (csv.empty()) return {};
    return {{"free_benchmark.csv", std::move(csv)}};
  }

  const FreeBenchmarkConfig& settings() const { return cfg_; }

 private:
  struct Rerun : capture::CallCheck {
    std::string name;
    std::vector<c10::IValue> outputs;  // the perturbed re-run's
  };

  void compare_tensors(const at::Tensor& o, const at::Tensor& p, std::optional<int64_t> index,
                       free_benchmark::CheckedCall& call) const {
    if (!o.defined() || !p.defined() || o.is_meta() || o.layout() != c10::kStrided) return;
    free_benchmark::Comparison c = cfg_.pert_mode == PertMode::ToCpu
                                       ? free_benchmark::compare_benchmark(o, p)
                                       : free_benchmark::compare_ratio(o, p, cfg_.pert_mode);
    c.index = index;
    call.outputs.push_back(std::move(c));
    if (cfg_.handler_type == FuzzHandler::Fix && at::isFloatingType(o.scalar_type()) && o.sizes() == p.sizes()) {
      // In place, below autograd: the caller's tensor (and what autograd saved of it) takes the values.
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      const_cast<at::Tensor&>(o).copy_(p);
    }
  }

  // Python int outputs are compared with ==, floats with math.isclose (ratio a/b, +1e-8 when b is 0).
  static free_benchmark::Comparison compare_scalars(const c10::IValue& o, const c10::IValue& p,
                                                    std::optional<int64_t> index) {
    free_benchmark::Comparison c;
    c.kind = free_benchmark::Comparison::Kind::Scalar;
    c.index = index;
    c.dtype = o.isInt() ? at::kLong : at::kDouble;
    if (o.isInt()) {
      c.consistent = o.toInt() == p.toInt();
      c.score = c.consistent ? 1.0 : std::numeric_limits<double>::infinity();
    } else {
      double a = o.toDouble(), b = p.toDouble();
      if (b == 0) {
        a += 1e-8;
        b += 1e-8;
      }
      c.consistent = std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b));
      c.ratio = a / b;
      c.score = std::max(a / b, b / a);
    }
    return c;
  }

  static bool draws_random_numbers(const capture::OpInfo& op) {
    static const std::unordered_set<std::string_view> random_ops = {
        "dropout",        "dropout_",       "feature_dropout", "alpha_dropout", "feature_alpha_dropout",
        "native_dropout", "_fused_dropout", "bernoulli",       "bernoulli_",    "rand_like",
        "randn_like",     "randint_like",   "normal",          "normal_",       "uniform_",
        "exponential_",   "geometric_",     "cauchy_",         "log_normal_",   "random_",
        "multinomial",    "poisson",        "rrelu",           "rrelu_",        "rrelu_with_noise",
        "randperm",       "rand",           "randn",           "randint"};
    if (random_ops.count(op.api)) return true;
    for (const auto& a : op.handle->schema().arguments()) {
      c10::TypePtr t = a.type();
      if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
      if (t->kind() == c10::TypeKind::GeneratorType) return true;
    }
    return false;
  }

  // The calls of `step` so far, decided: the comparisons still on a device are read back in one
  // batch here. Flushing a step again (stop() and start() within it) gives its earlier calls too.
  std::vector<free_benchmark::CheckedCall> collect(std::int64_t step) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<free_benchmark::Comparison*> pending;
    for (auto& call : fresh_)
      for (auto& c : call.outputs) pending.push_back(&c);
    {
      ProbeGuard guard;
      free_benchmark::resolve(pending);
    }
    if (step != step_) {
      step_ = step;
      decided_.clear();
    }
    for (auto& call : fresh_) decided_.push_back(std::move(call));
    fresh_.clear();
    return decided_;
  }

  const FreeBenchmarkConfig cfg_;
  // What the step's files are made of: collect() decides and moves them on, from const file hooks.
  mutable std::mutex mutex_;
  mutable std::vector<free_benchmark::CheckedCall> fresh_;    // checked since the last flush, maybe undecided
  mutable std::vector<free_benchmark::CheckedCall> decided_;  // of step_, decided
  mutable std::int64_t step_ = -1;
};

}  // namespace torchprobe

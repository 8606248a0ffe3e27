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
// - if_preheat: only the calls the preheat samples are re-run, judged by its adapted thresholds
//   (task/free_benchmark/preheat.hpp); in its steps they are also re-run on the CPU.
// - Calls that draw random numbers are not re-run: a second draw would move the generator.
// - handler_type fix: the outputs are overwritten in place with the re-run's values cast back
//   (forward only), so training continues with them.
// - fuzz_stage backward: the backward is recomputed when the gradient comes (free_benchmark/backward.hpp).
// - No entry is made of a call: dump.json's "data" stays {} as msprobe's does.
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "torchprobe/task/task_traits.hpp"
#include "torchprobe/config/types.hpp"
#include "torchprobe/core/names.hpp"
#include "torchprobe/core/probe_guard.hpp"
#include "torchprobe/core/record.hpp"
#include "torchprobe/core/tensor_json.hpp"
#include "torchprobe/stats/item_stats.hpp"
#include "torchprobe/task/free_benchmark/backward.hpp"
#include "torchprobe/task/free_benchmark/comparison.hpp"
#include "torchprobe/task/free_benchmark/perturbation.hpp"
#include "torchprobe/task/free_benchmark/preheat.hpp"
#include "torchprobe/task/free_benchmark/report.hpp"

namespace torchprobe {

class FreeBenchmarkTask {
 public:
  static constexpr std::string_view name = task_name(Task::FreeBenchmark);
  static constexpr LevelSet levels{Level::L1};
  static constexpr std::array<std::string_view, 8> config_keys{"fuzz_device",  "pert_mode",  "handler_type",
                                                               "fuzz_level",   "fuzz_stage", "if_preheat",
                                                               "preheat_step", "max_sample"};
  static bool saves_tensors(const Config&) { return false; }

  explicit FreeBenchmarkTask(const Config& config)
      : cfg_(config.free_benchmark), preheat_(cfg_.preheat_step, cfg_.max_sample) {}

  // The step whose calls come next (the preheat counts and samples per step).
  void set_step(std::int64_t step) {
    std::lock_guard<std::mutex> lock(mutex_);
    preheat_.set_step(step);
  }

  // Only save()'s values are described (debug.json): with statistics, as task statistics does.
  nlohmann::ordered_json describe(const at::Tensor& t, const Site& site, Record& record, bool gradient = false) const {
    nlohmann::ordered_json j = tensor_header(t);
    stats::put_tensor_stats(j, t, site, record);
    j["requires_grad"] = gradient ? false : t.requires_grad();
    return j;
  }
  // Calls make no entries; save()'s entries ("{name}.{n}.debug") are written as asked.
  bool keep(Record& r) const { return is_save_entry(r.name); }

  // The call starts: perturb its inputs and re-run it now, while they are as the user gave them.
  template <class Values>
  std::unique_ptr<CallCheck> check_call(const OpInfo& op, const Values& inputs, const std::string& name) {
    if (!op.handle || !op.schema_known || draws_random_numbers(op)) return nullptr;
    std::vector<c10::IValue> stack(inputs.begin(), inputs.end());
    const std::ptrdiff_t valid = free_benchmark::first_valid_input(
        stack, [&](std::size_t i) { return i >= op.args.size() || !op.args[i].kwarg_only; });
    if (valid < 0) return nullptr;
    if (cfg_.fuzz_stage == FuzzStage::Backward) return check_backward(op, stack, valid, name);
    std::optional<free_benchmark::Sample> sample;
    if (cfg_.if_preheat) {
      std::lock_guard<std::mutex> lock(mutex_);
      sample = preheat_.sample(free_benchmark::api_of(name));
      if (!sample) return nullptr;
    }
    ProbeGuard guard;
    std::vector<c10::IValue> cpu_stack;
    const bool with_cpu = sample && sample->with_cpu && cfg_.pert_mode != PertMode::ToCpu;
    if (with_cpu) cpu_stack = stack;
    if (!rerun(op, cfg_.pert_mode, stack, valid)) return nullptr;
    auto check = std::make_unique<Rerun>();
    check->name = name;
    check->outputs = std::move(stack);
    check->sample = sample;
    if (with_cpu && rerun(op, PertMode::ToCpu, cpu_stack, valid)) check->cpu_outputs = std::move(cpu_stack);
    if (sample && sample->with_cpu && cfg_.pert_mode == PertMode::ToCpu) check->cpu_outputs = check->outputs;
    return check;
  }

  // The call ended: compare its outputs with the re-run's (and, with fix, take the re-run's).
  template <class Values>
  void check_call_end(CallCheck& check, const Values& outputs) {
    Rerun& rerun = static_cast<Rerun&>(check);
    if (rerun.backward) {
      hook_backward(std::move(rerun.backward), outputs);
      return;
    }
    ProbeGuard guard;
    free_benchmark::CheckedCall call{std::move(rerun.name), {}, rerun.sample, {}};
    // With preheat every mode is judged by the ratio (msprobe's PreheatHandler), to_cpu's standard
    // serving as the CPU benchmark.
    const bool benchmark = cfg_.pert_mode == PertMode::ToCpu && !cfg_.if_preheat;
    if (!has_floating_tensor(rerun.outputs)) return;  // msprobe's handlers: Tools.is_float_tensor
    compare_outputs(outputs, rerun.outputs, benchmark, call.outputs);
    if (!rerun.cpu_outputs.empty()) compare_outputs(outputs, rerun.cpu_outputs, true, call.cpu);
    if (call.outputs.empty()) return;
    if (cfg_.handler_type == FuzzHandler::Fix) fix(outputs, rerun.outputs);
    std::lock_guard<std::mutex> lock(mutex_);
    fresh_.push_back(std::move(call));
  }

  // free_benchmark_summary.json, for every dumped step.
  std::vector<std::pair<std::string, nlohmann::ordered_json>> step_files(const std::vector<const Record*>&,
                                                                         std::int64_t step) const {
    nlohmann::ordered_json summary = free_benchmark::summary_json(collect(step), cfg_, step);
    if (cfg_.if_preheat) {  // the thresholds the preheat has reached, per API and dtype
      std::lock_guard<std::mutex> lock(mutex_);
      summary["thresholds"] = preheat_.thresholds();
    }
    return {{"free_benchmark_summary.json", std::move(summary)}};
  }
  // free_benchmark.csv, for a step with an inconsistent call.
  std::vector<std::pair<std::string, std::string>> step_text_files(std::int64_t step, std::int64_t rank) const {
    std::string csv = free_benchmark::csv_text(collect(step), cfg_, step, rank);
    if (csv.empty()) return {};
    return {{"free_benchmark.csv", std::move(csv)}};
  }

  const FreeBenchmarkConfig& settings() const { return cfg_; }

 private:
  struct Rerun : CallCheck {
    std::string name;
    std::vector<c10::IValue> outputs;  // the perturbed re-run's
    std::optional<free_benchmark::Sample> sample;
    std::vector<c10::IValue> cpu_outputs;                    // preheat steps: the CPU re-run's
    std::shared_ptr<free_benchmark::BackwardCall> backward;  // fuzz_stage backward
  };

  // fuzz_stage backward: a snapshot of the inputs, for the backward recomputed when the gradient
  // comes. In-place and out= ops are left out (the op wrote the inputs the snapshot is of).
  std::unique_ptr<CallCheck> check_backward(const OpInfo& op, const std::vector<c10::IValue>& stack,
                                            std::ptrdiff_t valid, const std::string& name) {
    if (!c10::GradMode::is_enabled()) return nullptr;
    for (const auto& a : op.args)
      if (a.written) return nullptr;
    ProbeGuard guard;
    auto call = std::make_shared<free_benchmark::BackwardCall>(*op.handle);
    if (!call->take(stack)) return nullptr;
    call->name = name;
    call->valid = valid;
    call->mode = cfg_.pert_mode;
    call->into = backward_;
    auto check = std::make_unique<Rerun>();
    check->backward = std::move(call);
    return check;
  }

  // The hook on the call's first floating output that requires grad.
  template <class Values>
  static void hook_backward(std::shared_ptr<free_benchmark::BackwardCall> call, const Values& outputs) {
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      if (!outputs[k].isTensor()) continue;
      const at::Tensor& out = outputs[k].toTensor();
      if (!free_benchmark::is_floating(out) || !out.requires_grad()) continue;
      call->output = k;
      out.register_hook([call](const at::Tensor& grad) {
        try {
          call->check(grad);
        } catch (const std::exception&) {  // the probe never breaks the backward pass
        }
      });
      return;
    }
  }

  // Perturbs `stack` (the probe's copy of the inputs) as `mode` says and runs the op on it; the
  // outputs replace the inputs. False when nothing was perturbed (no re-run).
  static bool rerun(const OpInfo& op, PertMode mode, std::vector<c10::IValue>& stack, std::ptrdiff_t valid) {
    if (!free_benchmark::perturb(mode, stack, valid)) return false;
    auto copy = [](const at::Tensor& t) { return t.defined() ? t.clone() : at::Tensor(); };
    for (std::size_t i = 0; i < stack.size() && i < op.args.size(); ++i)
      if (op.args[i].written) stack[i] = free_benchmark::map_tensors(stack[i], copy);
    op.handle->callBoxed(&stack);
    return true;
  }

  // A floating tensor as the output, or among the outputs (tuple) or the output's list.
  static bool has_floating_tensor(const std::vector<c10::IValue>& outputs) {
    auto floating = [](const at::Tensor& t) { return t.defined() && at::isFloatingType(t.scalar_type()); };
    for (const c10::IValue& v : outputs) {
      if (v.isTensor() && floating(v.toTensor())) return true;
      if (v.isTensorList())
        for (const at::Tensor& t : v.toTensorList().vec())
          if (floating(t)) return true;
    }
    return false;
  }

  // Per output, tuple and list outputs element by element. to_cpu's standard judges a tuple or list
  // output as a whole, as msprobe's SingleCompare.compare_seq, whose compare_list_seq passes each
  // element's roles swapped: the CPU's value is the actual one (its dtype picks the bounds, its
  // inf/nan count as 1) and the original's is the golden (an inf/nan in it makes it consistent).
  template <class Values>
  void compare_outputs(const Values& outputs, const std::vector<c10::IValue>& rerun, bool benchmark,
                       std::vector<free_benchmark::Comparison>& into) const {
    const std::size_t n = std::min<std::size_t>(outputs.size(), rerun.size());
    if (benchmark && (n > 1 || (n == 1 && outputs[0].isTensorList()))) {
      auto swapped = [&](const at::Tensor& o, const at::Tensor& p) {
        if (!o.defined() || !p.defined() || o.is_meta() || o.layout() != c10::kStrided) return;
        free_benchmark::Comparison c = free_benchmark::compare_benchmark(p, o);
        c.in_sequence = true;
        into.push_back(std::move(c));
      };
      for (std::size_t k = 0; k < n; ++k) {
        const c10::IValue &o = outputs[k], &p = rerun[k];
        if (o.isTensor() && p.isTensor()) {
          swapped(o.toTensor(), p.toTensor());
        } else if (o.isTensorList() && p.isTensorList()) {
          const std::vector<at::Tensor> os = o.toTensorList().vec(), ps = p.toTensorList().vec();
          for (std::size_t i = 0; i < os.size() && i < ps.size(); ++i) swapped(os[i], ps[i]);
        } else if ((o.isInt() && p.isInt()) || (o.isDouble() && p.isDouble())) {
          into.push_back(compare_scalars(o, p, std::nullopt));
          into.back().in_sequence = true;
        }
      }
      return;
    }
    for (std::size_t k = 0; k < n; ++k) {
      const c10::IValue& o = outputs[k];
      const c10::IValue& p = rerun[k];
      const std::optional<int64_t> index = n > 1 ? std::optional<int64_t>(static_cast<int64_t>(k)) : std::nullopt;
      if (o.isTensor() && p.isTensor()) {
        compare_tensors(o.toTensor(), p.toTensor(), index, benchmark, into);
      } else if (o.isTensorList() && p.isTensorList() && n == 1) {
        const std::vector<at::Tensor> os = o.toTensorList().vec(), ps = p.toTensorList().vec();
        for (std::size_t i = 0; i < os.size() && i < ps.size(); ++i)
          compare_tensors(os[i], ps[i], static_cast<int64_t>(i), benchmark, into);
      } else if ((o.isInt() && p.isInt()) || (o.isDouble() && p.isDouble())) {
        into.push_back(compare_scalars(o, p, index));
      }
    }
  }

  void compare_tensors(const at::Tensor& o, const at::Tensor& p, std::optional<int64_t> index, bool benchmark,
                       std::vector<free_benchmark::Comparison>& into) const {
    if (!o.defined() || !p.defined() || o.is_meta() || o.layout() != c10::kStrided) return;
    free_benchmark::Comparison c =
        benchmark ? free_benchmark::compare_benchmark(o, p) : free_benchmark::compare_ratio(o, p, cfg_.pert_mode);
    c.index = index;
    into.push_back(std::move(c));
  }

  // handler_type fix: the caller's floating outputs take the re-run's values.
  template <class Values>
  static void fix(const Values& outputs, const std::vector<c10::IValue>& rerun) {
    auto take = [](const at::Tensor& o, const at::Tensor& p) {
      if (!o.defined() || !p.defined() || !at::isFloatingType(o.scalar_type()) || o.sizes() != p.sizes()) return;
      // In place, below autograd: the caller's tensor (and what autograd saved of it) takes the values.
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      const_cast<at::Tensor&>(o).copy_(p);
    };
    const std::size_t n = std::min<std::size_t>(outputs.size(), rerun.size());
    for (std::size_t k = 0; k < n; ++k) {
      if (outputs[k].isTensor() && rerun[k].isTensor()) {
        take(outputs[k].toTensor(), rerun[k].toTensor());
      } else if (outputs[k].isTensorList() && rerun[k].isTensorList() && n == 1) {
        const std::vector<at::Tensor> os = outputs[k].toTensorList().vec(), ps = rerun[k].toTensorList().vec();
        for (std::size_t i = 0; i < os.size() && i < ps.size(); ++i) take(os[i], ps[i]);
      }
    }
  }

  // Preheat, in call order once the call's numbers are read: the thresholds of the moment judge
  // its outputs, then a CPU-compared sample teaches them.
  void judge_sampled(free_benchmark::CheckedCall& call) const {
    const std::string api = free_benchmark::api_of(call.name);
    double max_ratio = 0;
    std::optional<at::ScalarType> first;
    for (free_benchmark::Comparison& c : call.outputs) {
      if (c.kind == free_benchmark::Comparison::Kind::Scalar) {
        if (c.ratio) max_ratio = std::max(max_ratio, *c.ratio);
        continue;
      }
      if (!first) first = c.dtype;
      if (c.kind != free_benchmark::Comparison::Kind::Ratio || !c.ratio) continue;
      c.threshold = preheat_.threshold(api, dtype_name(c.dtype));
      c.consistent = c.threshold >= *c.ratio && *c.ratio >= 1.0 / c.threshold;
      max_ratio = std::max(max_ratio, *c.ratio);
    }
    if (!first || call.cpu.empty()) return;
    const bool cpu_consistent =
        std::all_of(call.cpu.begin(), call.cpu.end(), [](const free_benchmark::Comparison& c) { return c.consistent; });
    preheat_.learn(api, *call.sample, dtype_name(*first), free_benchmark::ratio_threshold(*first, cfg_.pert_mode),
                   max_ratio, cpu_consistent);
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

  static bool draws_random_numbers(const OpInfo& op) {
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
    {
      std::lock_guard<std::mutex> hooks(backward_->mutex);
      for (auto& call : backward_->calls) fresh_.push_back(std::move(call));
      backward_->calls.clear();
    }
    std::vector<free_benchmark::Comparison*> pending;
    for (auto& call : fresh_) {
      for (auto& c : call.outputs) pending.push_back(&c);
      for (auto& c : call.cpu) pending.push_back(&c);
    }
    {
      ProbeGuard guard;
      free_benchmark::resolve(pending);
    }
    for (auto& call : fresh_)
      if (call.sample) judge_sampled(call);
    if (step != step_) {
      step_ = step;
      decided_.clear();
    }
    for (auto& call : fresh_) decided_.push_back(std::move(call));
    fresh_.clear();
    return decided_;
  }

  const FreeBenchmarkConfig cfg_;
  mutable free_benchmark::Preheat preheat_;  // with if_preheat; under mutex_
  // fuzz_stage backward: what the gradient hooks decided (shared: a hook may outlive the task).
  std::shared_ptr<free_benchmark::BackwardCalls> backward_ = std::make_shared<free_benchmark::BackwardCalls>();
  // What the step's files are made of: collect() decides and moves them on, from const file hooks.
  mutable std::mutex mutex_;
  mutable std::vector<free_benchmark::CheckedCall> fresh_;    // checked since the last flush, maybe undecided
  mutable std::vector<free_benchmark::CheckedCall> decided_;  // of step_, decided
  mutable std::int64_t step_ = -1;
};

}  // namespace torchprobe

#pragma once
// The entries "Module.{path}.{Class}.parameters_grad.{k}" (levels L0 and mix): the gradients of a
// module's own parameters once they have been accumulated, and the order of a module's backward
// entry after them, as msprobe writes them.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "torchprobe/capture/backward_probe.hpp"
#include "torchprobe/capture/module_catalog.hpp"
#include "torchprobe/capture/value_encoder.hpp"
#include "torchprobe/core/probe_guard.hpp"
#include "torchprobe/core/record.hpp"
#include "torchprobe/details/recorder.hpp"

namespace torchprobe::capture {

// Owned by a shared_ptr (the hooks on parameters and the module backward entries reach it
// weakly): once the capture is gone they record nothing more.
template <class TaskT>
class ParameterGradients final : public std::enable_shared_from_this<ParameterGradients<TaskT>> {
  using Core = torchprobe::details::Recorder<TaskT>;

 public:
  explicit ParameterGradients(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  // The modules whose parameters to follow. Parameters already hooked stay hooked (once each).
  void set_catalog(std::shared_ptr<ModuleCatalog> catalog) {
    catalog_ = std::move(catalog);
    std::lock_guard<std::mutex> lock(mutex_);
    state_.clear();
    for (const ModuleInfo* info : catalog_->all())
      for (const auto& p : info->params) hook_parameter(p.second);
  }

  // msprobe writes a module's parameters_grad before its backward entry: a module's backward is
  // complete once the gradients of its parameters have been accumulated too.
  bool waits_for(const ModuleInfo& info) const {
    for (const auto& p : info.params)
      if (p.second.requires_grad() && hooked_.count(p.second.unsafeGetTensorImpl())) return true;
    return false;
  }

  // A module's backward entry `r` is complete; `key` is its ModuleInfo, as a key only (a
  // ScopedModuleDump's one is gone by then). Written now, or after its parameters_grad.
  void module_backward_done(const ModuleInfo* key, bool waits, Record&& r) {
    if (!core_->entries().admit(r.name)) return;
    std::lock_guard<std::mutex> lock(mutex_);
    State& s = state_[key];
    if (!waits || s.backwards_done < s.params_done) {
      ++s.backwards_done;
      core_->commit_last(std::move(r));
    } else {
      s.stashed.push_back(std::move(r));
    }
  }

  // Before a flush: module backward entries still waiting for their parameter gradients, and
  // parameter gradients that arrived only in part, are written as they are.
  void release_pending() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& kv : state_) {
      State& s = kv.second;
      if (!s.arrival.empty()) complete(*kv.first, s);
      while (!s.stashed.empty()) {
        core_->commit_last(std::move(s.stashed.front()));
        s.stashed.pop_front();
      }
      s.params_done = s.backwards_done = 0;
    }
  }

  // Is anything waiting that release_pending() would write? (a step stopped before its backward)
  bool has_pending() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& kv : state_)
      if (!kv.second.arrival.empty() || !kv.second.stashed.empty()) return true;
    return false;
  }

  void on_step() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& kv : state_) kv.second = State{};
  }

 private:
  struct State {
    std::vector<bool> fired;
    std::vector<std::size_t> arrival;  // parameter indices in the order their gradients arrived
    std::int64_t k = 0;                // parameters_grad.{k}
    std::int64_t params_done = 0, backwards_done = 0;
    std::deque<Record> stashed;  // module backward entries waiting for parameters_grad
  };

  class Hook final : public torch::autograd::FunctionPostHook {
   public:
    Hook(std::weak_ptr<ParameterGradients> owner, const c10::TensorImpl* p) : owner_(std::move(owner)), param_(p) {}
    variable_list operator()(const variable_list& outputs, const variable_list& /*inputs*/) override {
      if (auto o = owner_.lock()) o->arrived(param_);
      return outputs;
    }

   private:
    std::weak_ptr<ParameterGradients> owner_;
    const c10::TensorImpl* param_;
  };

  // A post-hook on the parameter's AccumulateGrad node runs once its .grad is updated. The node
  // is kept alive here, so every later graph accumulates through this same node and hook.
  void hook_parameter(const at::Tensor& p) {
    if (!p.requires_grad() || !p.is_leaf()) return;
    const c10::TensorImpl* impl = p.unsafeGetTensorImpl();
    if (hooked_.count(impl)) return;
    std::shared_ptr<Node> acc = torch::autograd::impl::grad_accumulator(p);
    if (!acc) return;
    acc->add_post_hook(std::make_unique<Hook>(this->weak_from_this(), impl));
    hooked_[impl] = std::move(acc);
  }

  void arrived(const c10::TensorImpl* impl) {
    if (!core_->gradients_live() || !catalog_) return;  // until step(), after a start() of this step
    if (!core_->config().data_mode.backward) return;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const ModuleInfo* info : catalog_->all()) {
      for (std::size_t k = 0; k < info->params.size(); ++k) {
        if (info->params[k].second.unsafeGetTensorImpl() != impl) continue;
        State& s = state_[info];
        s.fired.resize(info->params.size(), false);
        if (s.fired[k]) complete(*info, s);  // a new backward pass began
        s.fired[k] = true;
        s.arrival.push_back(k);
        std::size_t trainable = 0;
        for (const auto& p : info->params) trainable += p.second.requires_grad() ? 1 : 0;
        if (s.arrival.size() >= trainable) complete(*info, s);
        return;
      }
    }
  }

  // Module.{path}.{Class}.parameters_grad.{k}: {"weight": [grad], "bias": [grad]}, in the order
  // the gradients arrived, then the module's backward entries that were waiting for it.
  void complete(const ModuleInfo& info, State& s) {
    Record r;
    r.name = info.prefix + "parameters_grad." + std::to_string(s.k++);
    if (core_->entries().admit(r.name)) {
      ProbeGuard guard;
      for (std::size_t k : s.arrival) {
        const auto& p = info.params[k];
        const at::Tensor grad = p.second.grad();
        nlohmann::ordered_json one = nlohmann::ordered_json::array();
        one.push_back(grad.defined() ? core_->task().describe(grad, Site::parameter_grad(p.first), r, /*gradient=*/true)
                                     : nlohmann::ordered_json(nullptr));
        r.body[p.first] = std::move(one);
      }
      core_->commit_last(std::move(r));
    }
    s.arrival.clear();
    std::fill(s.fired.begin(), s.fired.end(), false);
    ++s.params_done;
    while (!s.stashed.empty() && s.backwards_done < s.params_done) {
      ++s.backwards_done;
      core_->commit_last(std::move(s.stashed.front()));
      s.stashed.pop_front();
    }
  }

  std::shared_ptr<Core> core_;
  std::shared_ptr<ModuleCatalog> catalog_;
  std::unordered_map<const c10::TensorImpl*, std::shared_ptr<Node>> hooked_;
  std::mutex mutex_;
  std::unordered_map<const ModuleInfo*, State> state_;  // per module
};

}  // namespace torchprobe::capture

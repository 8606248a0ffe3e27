#pragma once
// What the probe makes of each outermost ATen call and each module forward: the composition that
// a Debugger holds and that the observer (api_observer.hpp) and the module guards call into.
//  - api_entries.hpp: the API entries "Aten.{op}.{n}.forward" and ".backward" (L1, mix);
//  - module_tracking.hpp: which module a call belongs to, the module entries ".forward.{n}" and
//    ".backward.{n}", construct.json's parent of every entry (L0, mix);
//  - parameter_gradients.hpp: the module entries ".parameters_grad.{k}" (L0, mix).
// docs/capture.md describes how they fit together.
#include <ATen/record_function.h>

#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "torchprobe/capture/api_entries.hpp"
#include "torchprobe/capture/api_observer.hpp"
#include "torchprobe/capture/call_values.hpp"
#include "torchprobe/capture/model_ref.hpp"
#include "torchprobe/capture/module_catalog.hpp"
#include "torchprobe/capture/module_events.hpp"
#include "torchprobe/capture/module_state.hpp"
#include "torchprobe/capture/module_tracking.hpp"
#include "torchprobe/capture/nested_calls.hpp"
#include "torchprobe/capture/parameter_gradients.hpp"
#include "torchprobe/capture/pending_collectives.hpp"
#include "torchprobe/capture/token_window.hpp"
#include "torchprobe/details/recorder.hpp"
#include "torchprobe/level/level.hpp"

namespace torchprobe::capture {

template <class TaskT, Level L>
class CallCapture final : public ApiHandler, public ModuleEvents {
  static constexpr bool kApis = LevelTraits<L>::captures_apis;
  static constexpr bool kModules = LevelTraits<L>::captures_modules;
  static constexpr bool kNested = LevelTraits<L>::nested_apis;
  using Core = torchprobe::details::Recorder<TaskT>;

 public:
  explicit CallCapture(std::shared_ptr<Core> core)
      : core_(std::move(core)),
        apis_(core_),
        grads_(std::make_shared<ParameterGradients<TaskT>>(core_)),
        modules_(core_, grads_) {}

  // start(model): the modules to recognise. Kept while the same models are passed again, so
  // parameter-gradient hooks are registered once per parameter.
  void set_models(const ModelRef& models) {
    if (!kModules) return;
    if (same_models(models)) return;
    models_ = models;
    has_models_ = true;
    auto catalog = std::make_shared<ModuleCatalog>(models);
    modules_.set_catalog(catalog);
    grads_->set_catalog(std::move(catalog));
  }

  // start(model, token_range): only the calls made while the window is open are recorded; null:
  // every call.
  void set_token_window(std::shared_ptr<TokenWindow> window) { window_ = std::move(window); }

  // ---- the observer's callbacks -------------------------------------------------------------

  // A task that ended the dump stopped the capture (Recorder::capturing()); the observer stays
  // attached until stop() removes it on the training thread.
  std::unique_ptr<CallContext> on_api_start(const at::RecordFunction& fn, const OpInfo& op) override {
    if (!core_->capturing()) return nullptr;
    if (collectives_.waiting()) finish_collectives(/*final=*/false);
    if (window_ && !window_->open()) {
      if (op.user_api) window_->saw_call();
      return nullptr;
    }
    ThreadModules& tm = modules_.this_thread();
    std::unique_ptr<Call> call;
    try {
      if (!op.user_api) {
        modules_.boundary(tm);
        return nullptr;
      }
      call = std::make_unique<Call>();
      call->schema_known = op.schema_known;
      call->returns = op.returns;
      const auto inputs = details::own_values(fn.inputs(), op.schema_known, op.args.size());
      const bool modules = modules_.tracks(tm);
      if (modules) modules_.call_started(tm, op, inputs, call->module);
      if (kApis && !tm.dump_only) apis_.start(op, inputs, modules_.parents(tm, call->module.in_episode), call->api);
      if (!call->api.forward && !call->api.backward && !modules) return nullptr;
      return call;
    } catch (const std::exception& e) {
      // The entry's name when it has one, as msprobe logs it.
      core_->errors().log("forward_input_data_collect",
                          call && !call->api.record.name.empty() ? call->api.record.name : op.qualified, e);
      return nullptr;
    }
  }

  // Level L2: every call at every depth. Its parent is the call it runs in (`frame`); the calls
  // it runs take it as theirs. Infrastructure ops hide what they run, as at L1.
  std::unique_ptr<CallContext> on_nested_start(const at::RecordFunction& fn, const OpInfo& op,
                                               Enclosing& frame) override {
    if constexpr (!kNested) {
      return nullptr;
    } else {
      if (!core_->capturing()) return nullptr;
      if (!op.user_api) {
        frame.hidden = true;
        return nullptr;
      }
      std::unique_ptr<Call> call;
      try {
        call = std::make_unique<Call>();
        call->schema_known = op.schema_known;
        call->returns = op.returns;
        const auto inputs = details::own_values(fn.inputs(), op.schema_known, op.args.size());
        ThreadModules& tm = modules_.this_thread();
        const auto outer = modules_.parents(tm, false);
        const std::string* listed = core_->config().list.empty() ? nullptr : &core_->config().list.front();
        call->api.inside_backward = frame.inside_backward;
        apis_.start(op, inputs, NestedParents<decltype(outer)>{frame, outer}, call->api, frame.inside);
        ApiCall& api = call->api;
        if (listed && api.backward && api.backward_name == *listed) api.inside_backward = true;
        frame.inside = frame.inside || (listed && api.name == *listed);
        frame.inside_backward = api.inside_backward;
        frame.forward = std::make_shared<const std::string>(api.name);
        frame.backward = api.backward ? std::make_shared<const std::string>(api.backward_name) : nullptr;
        if (!api.forward && !api.backward) return nullptr;
        call->thread = at::RecordFunction::currentThreadId();
        return call;
      } catch (const std::exception& e) {
        core_->errors().log("forward_input_data_collect",
                            call && !call->api.name.empty() ? call->api.name : op.qualified, e);
        frame.hidden = true;  // what it runs would name a parent that was never recorded
        return nullptr;
      }
    }
  }

  std::optional<Enclosing> backward_node(std::uint64_t forward_thread, std::int64_t seq) override {
    return owners_.find(forward_thread, seq);
  }

  void on_api_end(const at::RecordFunction& fn, CallContext& ctx) override {
    Call& call = static_cast<Call&>(ctx);
    ThreadModules& tm = modules_.this_thread();
    try {
      const auto outputs =
          details::own_values(c10::ArrayRef<c10::IValue>(fn.outputs()), call.schema_known, call.returns);
      modules_.call_ended(tm, outputs, call.module);
      if (call.api.forward) apis_.finish(outputs, call.api);
      if (call.api.backward && apis_.attach_backward(outputs, call.api) && kNested)
        owners_.add(call.thread, call.api.seq_begin, at::sequence_number::peek(),
                    Enclosing{std::make_shared<const std::string>(call.api.backward_name), nullptr, false,
                              call.api.inside_backward, call.api.inside_backward});
    } catch (const std::exception& e) {
      core_->errors().log("forward_output_data_collect", call.api.record.name, e);
    }
  }

  // ---- collectives (distributed.hpp): API entries of their own, at levels that record APIs ----

  std::unique_ptr<CallContext> on_collective_start(const Collective& c) override {
    if constexpr (!kApis) return nullptr;
    if (!core_->capturing()) return nullptr;
    std::unique_ptr<Call> call;
    try {
      ThreadModules& tm = modules_.this_thread();
      if (tm.dump_only) return nullptr;
      call = std::make_unique<Call>();
      apis_.start_collective(OpRegistry::named("Distributed", c.api), c, modules_.parents(tm, false), call->api);
      if (!call->api.forward) return nullptr;
      return call;
    } catch (const std::exception& e) {
      core_->errors().log("forward_input_data_collect", call ? call->api.record.name : "Distributed." + c.api, e);
      return nullptr;
    }
  }

  void on_collective_end(const Collective& c, CallContext& ctx) override {
    Call& call = static_cast<Call&>(ctx);
    try {
      apis_.finish_collective(c, call.api);
    } catch (const std::exception& e) {
      core_->errors().log("forward_output_data_collect", call.api.record.name, e);
    }
  }

  // A dispatched collective returned, its work usually still running: kept until a later call
  // finds the work completed (the tensors then hold the result), or until stop().
  void on_collective_dispatched(Collective c, std::unique_ptr<CallContext> entry) override {
    if (PendingCollectives::completed(c)) return on_collective_end(c, *entry);
    collectives_.add(std::move(c), std::move(entry));
  }

  // ---- module guards, ScopedModuleDump and TorchScript probes (ModuleEvents) ----------------

  void* module_enter(const torch::nn::Module& module, const std::string* dump_name,
                     std::vector<c10::IValue> inputs) override {
    if (window_) {
      if (!dump_name && &module == window_->root()) {
        // Leaf episodes still open belong to the token before: they end with it.
        if (window_->forward_begins() == TokenWindow::Change::Closed) modules_.close_open_episodes();
        return nullptr;
      }
      if (!window_->open()) return nullptr;
    }
    return modules_.module_enter(module, dump_name, std::move(inputs));
  }
  void module_exit(void* token, const std::vector<c10::IValue>* outputs, bool unwinding) override {
    modules_.module_exit(token, outputs, unwinding);
  }
  // Outside the token window the calls are skipped in pairs: the window changes only between
  // root forwards, so an exit on this thread pairs with the latest enter.
  void script_module_enter(const void* object, std::vector<c10::IValue> inputs) override {
    if (window_ && !window_->open()) {
      ++skipped_script_calls();
      return;
    }
    modules_.script_module_enter(object, std::move(inputs));
  }
  void script_module_exit(const c10::IValue& output) override {
    if (skipped_script_calls() > 0) {
      --skipped_script_calls();
      return;
    }
    modules_.script_module_exit(output);
  }

  // ---- the Debugger's calls at stop() and step() --------------------------------------------

  // Ends the episodes still open on every thread (a model's last module ends only when the
  // next call starts, and there may be none before stop()).
  void close_open_episodes() { modules_.close_open_episodes(); }

  // Before a flush: module backward entries still waiting for their parameter gradients, and
  // parameter gradients that arrived only in part, are written as they are.
  // Dispatched collectives still running are written without an output.
  void release_pending() {
    grads_->release_pending();
    finish_collectives(/*final=*/true);
  }

  bool has_pending() { return grads_->has_pending(); }

  void on_step() {
    grads_->on_step();
    owners_.clear();
  }

 private:
  using ThreadModules = typename ModuleTracker<TaskT, L>::ThreadModules;

  // A call in flight, from on_api_start to on_api_end.
  struct Call : CallContext {
    ApiCall api;
    ModuleCall module;
    bool schema_known = false;
    std::size_t returns = 0;   // the schema's, for on_api_end
    std::uint64_t thread = 0;  // L2: RecordFunction's id of the thread that ran it
  };

  void finish_collectives(bool final) {
    collectives_.poll(final, [this](const Collective& c, CallContext& ctx) { on_collective_end(c, ctx); });
  }

  static int& skipped_script_calls() {
    thread_local int n = 0;
    return n;
  }

  bool same_models(const ModelRef& m) const {
    if (!has_models_ || m.nn.size() != models_.nn.size() || m.jit.size() != models_.jit.size()) return false;
    for (std::size_t i = 0; i < m.nn.size(); ++i)
      if (m.nn[i] != models_.nn[i]) return false;
    for (std::size_t i = 0; i < m.jit.size(); ++i)
      if (m.jit[i]._ivalue() != models_.jit[i]._ivalue()) return false;
    return true;
  }

  std::shared_ptr<Core> core_;
  ApiEntries<TaskT, kNested> apis_;
  std::shared_ptr<ParameterGradients<TaskT>> grads_;  // hooks on parameters reach it weakly
  ModuleTracker<TaskT, L> modules_;
  ModelRef models_;
  bool has_models_ = false;
  std::shared_ptr<TokenWindow> window_;
  BackwardOwners owners_;  // L2: which backward entry each autograd node's ops belong to
  PendingCollectives collectives_;
};

}  // namespace torchprobe::capture

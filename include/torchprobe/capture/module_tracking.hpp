#pragma once
// Which module each outermost ATen call belongs to, and the module entries
// "Module.{path}.{Class}.forward.{n}" and ".backward.{n}" (levels L0 and mix):
//  - a parameter-owning leaf module (Linear, Conv, norms, Embedding, RNNs) is recognised by its
//    parameters among the call's inputs, a call of it being the run of consecutive calls that
//    use them (its "episode");
//  - other modules are marked by a ModuleGuard in their forward, a ScopedModuleDump, or the
//    probes around TorchScript submodule calls (torchscript.hpp);
//  - every entry's parent in construct.json is the innermost module open on its thread, the
//    containers no guard marks included (inferred_containers.hpp).
#include <ATen/SequenceNumber.h>
#include <c10/core/GradMode.h>

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "torchprobe/capture/backward_probe.hpp"
#include "torchprobe/capture/call_values.hpp"
#include "torchprobe/capture/gradient_recorder.hpp"
#include "torchprobe/capture/inferred_containers.hpp"
#include "torchprobe/capture/module_catalog.hpp"
#include "torchprobe/capture/module_state.hpp"
#include "torchprobe/capture/op_registry.hpp"
#include "torchprobe/capture/parameter_gradients.hpp"
#include "torchprobe/capture/value_encoder.hpp"
#include "torchprobe/core/names.hpp"
#include "torchprobe/core/probe_guard.hpp"
#include "torchprobe/core/record.hpp"
#include "torchprobe/details/recorder.hpp"
#include "torchprobe/io/call_stack_capture.hpp"
#include "torchprobe/level/level.hpp"

namespace torchprobe::capture {

template <class TaskT, Level L>
class ModuleTracker {
  static constexpr bool kModules = LevelTraits<L>::captures_modules;
  using Core = torchprobe::details::Recorder<TaskT>;
  using OpenModule = details::OpenModule;

 public:
  using ThreadModules = details::ThreadModules;

  ModuleTracker(std::shared_ptr<Core> core, std::shared_ptr<ParameterGradients<TaskT>> grads)
      : core_(std::move(core)), grads_(std::move(grads)), serial_(next_serial()) {}

  void set_catalog(std::shared_ptr<ModuleCatalog> catalog) { catalog_ = std::move(catalog); }

  // This thread's modules. A thread-local cache, keyed by the tracker's serial number, spares
  // the lock on every call.
  ThreadModules& this_thread() {
    struct Cache {
      std::uint64_t serial = 0;
      ThreadModules* tm = nullptr;
    };
    thread_local Cache cache;
    if (cache.serial == serial_ && cache.tm) return *cache.tm;
    std::lock_guard<std::mutex> lock(threads_mutex_);
    auto& slot = threads_[std::this_thread::get_id()];
    if (!slot) slot = std::make_unique<ThreadModules>();
    cache = {serial_, slot.get()};
    return *slot;
  }

  // The construct.json parents of the entries of a call on this thread.
  EntryParents parents(const ThreadModules& tm, bool in_episode) const {
    return EntryParents(tm, in_episode, kModules);
  }

  bool tracks(const ThreadModules& tm) const { return tm.dump_only || (kModules && catalog_ && !catalog_->empty()); }

  // Infrastructure ops and autograd's own records end a module's episode.
  void boundary(ThreadModules& tm) {
    if (tm.episode) close_episode(tm);
  }

  // A user call starts: it may continue the open episode, end it, or begin one.
  template <class Inputs>
  void call_started(ThreadModules& tm, const OpInfo& op, const Inputs& inputs, ModuleCall& call) {
    const std::vector<at::Tensor> tensors = details::tensors_of(inputs);
    const ModuleInfo* owner = nullptr;
    bool param_only = true;
    std::vector<const at::Tensor*> plain;
    for (const at::Tensor& t : tensors) {
      if (!t.defined()) continue;
      const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
      const ModuleInfo* o = owner_of(tm, impl);
      if (!o && tm.episode && tm.episode->derived.count(impl)) o = tm.episode->info;
      if (o) {
        if (!owner) owner = o;
      } else {
        param_only = false;
        plain.push_back(&t);
      }
    }
    // A guarded module's own parameters are covered by its guard.
    if (owner && !tm.guards.empty() && tm.guards.back()->info == owner) owner = nullptr;

    if (tm.episode) {
      OpenModule& ep = *tm.episode;
      bool continues = owner == ep.info;
      if (continues && ep.has_main) {
        // After the main call, only an in-place update of the episode's own result (Linear's
        // `output += bias`) continues it; anything else is the module's next call.
        bool on_result = !plain.empty() && is_inplace_op(op.api);
        for (const at::Tensor* t : plain) on_result = on_result && ep.produced.count(t->unsafeGetTensorImpl());
        continues = on_result;
      }
      if (!continues) close_episode(tm);
    }
    if (!owner) return;
    if (!tm.episode) {
      tm.episode.emplace();
      open_module(tm, *owner, *tm.episode);
    }
    OpenModule& ep = *tm.episode;
    call.in_episode = true;
    call.param_only = param_only;
    if (!param_only) ep.has_main = true;
    for (const at::Tensor* t : plain) {
      const c10::TensorImpl* impl = t->unsafeGetTensorImpl();
      if (ep.produced.count(impl) || !ep.inputs_seen.insert(impl).second) continue;
      ep.input_edges.push_back(gradient_edge_of(*t));
      if (ep.admitted && core_->config().data_mode.forward_inputs()) {
        ep.record.body["input_args"].push_back(
            core_->task().describe(*t, Site::input(ep.record.body["input_args"].size()), ep.record));
      }
    }
  }

  // A user call ended with these outputs.
  template <class Outputs>
  void call_ended(ThreadModules& tm, const Outputs& outputs, const ModuleCall& call) {
    if (kModules || tm.dump_only) {  // a guard's output is its last call's: keep it (only then)
      tm.last_outputs.assign(outputs.begin(), outputs.end());
      ++tm.calls;
    }
    if (call.in_episode && tm.episode) {
      OpenModule& ep = *tm.episode;
      ep.last_outputs.assign(outputs.begin(), outputs.end());
      for (const at::Tensor& t : details::tensors_of(outputs)) {
        ep.produced.insert(t.unsafeGetTensorImpl());
        if (call.param_only) ep.derived.insert(t.unsafeGetTensorImpl());  // W.t() and the like
      }
    }
  }

  // ---- module guards (ModuleEvents, through the capture) --------------------------------------

  void* module_enter(const torch::nn::Module& module, const std::string* dump_name, std::vector<c10::IValue> inputs) {
    ThreadModules& tm = this_thread();
    try {
      const ModuleInfo* info = nullptr;
      if (dump_name) {
        if (tm.dump_only) return nullptr;  // one ScopedModuleDump at a time per thread
        tm.dump_only = module_info(module, *dump_name, "");
        info = tm.dump_only.get();
        // A parameter-owning leaf is recognised by its parameters, call by call; the scope
        // then only switches the capture to this module.
        if (info->leaf && !info->params.empty()) return tm.dump_only.get();
      } else {
        if (!kModules || tm.dump_only || !catalog_) return nullptr;
        info = catalog_->find(&module);
        if (!info) return nullptr;
      }
      return enter_module(tm, *info, inputs);
    } catch (const std::exception& e) {
      core_->errors().log("module_forward_pre", module.name(), e);
      return nullptr;
    }
  }

  void script_module_enter(const void* object, std::vector<c10::IValue> inputs) {
    ThreadModules& tm = this_thread();
    void* token = nullptr;
    try {
      const ModuleInfo* info = kModules && !tm.dump_only && catalog_ ? catalog_->find(object) : nullptr;
      if (info) token = enter_module(tm, *info, inputs);
    } catch (const std::exception& e) {
      core_->errors().log("module_forward_pre", "TorchScript module", e);
    }
    tm.script_tokens.push_back(token);  // pushed even when null: exits pair with enters
  }

  void script_module_exit(const c10::IValue& output) {
    ThreadModules& tm = this_thread();
    if (tm.script_tokens.empty()) return;
    void* token = tm.script_tokens.back();
    tm.script_tokens.pop_back();
    if (!token) return;
    // A module returning a tuple lists its items, as msprobe does for Python modules.
    std::vector<c10::IValue> outputs;
    if (output.isTuple()) {
      for (const c10::IValue& e : output.toTupleRef().elements()) outputs.push_back(e);
    } else {
      outputs.push_back(output);
    }
    module_exit(token, &outputs, /*unwinding=*/false);
  }

  void module_exit(void* token, const std::vector<c10::IValue>* outputs, bool unwinding) {
    ThreadModules& tm = this_thread();
    try {
      if (tm.dump_only && token == tm.dump_only.get()) {  // a ScopedModuleDump of a parameter-owning leaf
        if (tm.episode) close_episode(tm);
        tm.dump_only.reset();
        return;
      }
      if (tm.episode) close_episode(tm);
      while (!tm.guards.empty()) {
        std::unique_ptr<OpenModule> m = std::move(tm.guards.back());
        tm.guards.pop_back();
        const bool mine = m.get() == token;
        std::vector<c10::IValue> out;
        if (mine && outputs)
          out = *outputs;
        else if (mine && tm.calls > m->calls_at_start)
          out = tm.last_outputs;
        finish_module(*m, out, /*with_backward=*/mine && !unwinding);
        if (mine) break;
      }
      if (tm.dump_only && tm.guards.empty()) tm.dump_only.reset();
    } catch (const std::exception& e) {
      core_->errors().log("module_forward", "module", e);
    }
  }

  // Ends the episodes still open on every thread (a model's last module ends only when the
  // next call starts, and there may be none before stop()).
  void close_open_episodes() {
    std::lock_guard<std::mutex> lock(threads_mutex_);
    for (auto& kv : threads_)
      if (kv.second->episode) close_episode(*kv.second);
  }

 private:
  static std::uint64_t next_serial() {
    static std::atomic<std::uint64_t> s{1};
    return s.fetch_add(1);
  }

  auto describer(Record& record) const {
    return [this, &record](const at::Tensor& t, const Site& site) { return core_->task().describe(t, site, record); };
  }

  const ModuleInfo* owner_of(const ThreadModules& tm, const c10::TensorImpl* impl) const {
    if (tm.dump_only) {  // ScopedModuleDump: only that module's parameters count
      for (const auto& p : tm.dump_only->params)
        if (p.second.unsafeGetTensorImpl() == impl) return tm.dump_only.get();
      return nullptr;
    }
    return catalog_ ? catalog_->owner_of(impl) : nullptr;
  }

  // A module's forward begins on this thread (a guard, a ScopedModuleDump, a TorchScript call).
  void* enter_module(ThreadModules& tm, const ModuleInfo& info, const std::vector<c10::IValue>& inputs) {
    if (tm.episode) close_episode(tm);
    auto m = std::make_unique<OpenModule>();
    open_module(tm, info, *m);
    if (m->admitted && core_->config().data_mode.forward_inputs()) {
      try {
        auto describe = describer(m->record);
        ValueEncoder<decltype(describe)> encode(describe);
        for (const c10::IValue& v : inputs) {
          m->record.body["input_args"].push_back(
              encode.encode(v, ArgKind::Generic, Site::input(m->record.body["input_args"].size())));
        }
      } catch (const std::exception& e) {
        // No entry for this call; the module's scope (list/scope filters) closes with it.
        core_->entries().exit_module(m->record.name);
        core_->errors().log("module_forward_pre", m->record.name, e);
        return nullptr;
      }
    }
    for (const at::Tensor& t : details::tensors_of(inputs)) m->input_edges.push_back(gradient_edge_of(t));
    m->calls_at_start = tm.calls;
    tm.guards.push_back(std::move(m));
    return tm.guards.back().get();
  }

  // A module forward begins: its name, number, parameters and where its backward will start.
  void open_module(ThreadModules& tm, const ModuleInfo& info, OpenModule& m) {
    m.info = &info;
    m.index = core_->entries().next_index(info.counter_key());
    m.record.name = info.forward_name(m.index);
    m.record.parent = parents(tm, /*in_episode=*/false).forward();
    if (!tm.guards.empty()) m.parent_backward = tm.guards.back()->info->backward_name(tm.guards.back()->index);
    if (kModules && !tm.dump_only) details::infer_containers(*core_, tm, info, m);
    core_->entries().enter_module(m.record.name);
    m.admitted = core_->entries().admit(m.record.name);
    m.grad_enabled = c10::GradMode::is_enabled();
    m.seq_begin = at::sequence_number::peek();
    if (!m.admitted) return;
    const DataMode& mode = core_->config().data_mode;
    if (mode.forward_inputs()) {
      m.record.body["input_args"] = nlohmann::ordered_json::array();
      m.record.body["input_kwargs"] = nlohmann::ordered_json::object();
    }
    if (mode.forward_outputs() && !info.params.empty()) {
      ProbeGuard guard;
      nlohmann::ordered_json params = nlohmann::ordered_json::object();
      for (const auto& p : info.params)
        params[p.first] = core_->task().describe(p.second, Site::parameter(p.first), m.record);
      m.record.body["parameters"] = std::move(params);
    }
    if (core_->config().extra_info) m.record.stack = io::capture_shared_call_stack();
  }

  void close_episode(ThreadModules& tm) {
    OpenModule ep = std::move(*tm.episode);
    tm.episode.reset();
    const std::vector<c10::IValue> outputs = std::move(ep.last_outputs);
    finish_module(ep, outputs, /*with_backward=*/true);
  }

  // A module forward ends: its entry goes into dump order now (after the calls made inside
  // it, as msprobe orders them), and its backward is hooked.
  void finish_module(OpenModule& m, const std::vector<c10::IValue>& outputs, bool with_backward) {
    core_->entries().exit_module(m.record.name);
    const DataMode& mode = core_->config().data_mode;
    if (m.admitted) {
      Record r;
      r.name = m.record.name;
      r.stack = std::move(m.record.stack);
      r.parent = m.record.parent;
      r.pending = std::move(m.record.pending);
      r.pending_checksums = std::move(m.record.pending_checksums);
      r.saves = std::move(m.record.saves);  // tensor files of its inputs and parameters
      nlohmann::ordered_json& body = m.record.body;
      if (body.contains("input_args")) {
        r.body["input_args"] = std::move(body["input_args"]);
        r.body["input_kwargs"] = std::move(body["input_kwargs"]);
      }
      if (mode.forward_outputs()) {
        ProbeGuard guard;
        auto describe = describer(r);
        ValueEncoder<decltype(describe)> encode(describe);
        nlohmann::ordered_json out = nlohmann::ordered_json::array();
        for (std::size_t k = 0; k < outputs.size(); ++k)
          out.push_back(encode.encode(outputs[k], ArgKind::Generic, Site::output(k)));
        r.body["output"] = std::move(out);
        if (body.contains("parameters")) r.body["parameters"] = std::move(body["parameters"]);
      }
      if (!r.body.empty()) core_->commit_last(std::move(r));
    }
    if (!with_backward || !m.grad_enabled || !mode.any_backward()) return;
    // Only the outputs and inputs that require grad, as msprobe's BackwardHook (docs/capture.md).
    std::vector<at::Tensor> tensors;
    for (const at::Tensor& t : details::tensors_of(outputs))
      if (t.defined() && t.requires_grad()) tensors.push_back(t);
    if (!details::any_in_graph(tensors)) return;
    std::vector<Edge> input_edges;
    for (const Edge& e : m.input_edges)
      if (e.is_valid()) input_edges.push_back(e);
    // Only a module whose parameters carry our gradient hooks waits for its parameters_grad (ModuleInfo: a key only).
    const ModuleInfo* key = m.info;
    const bool waits = grads_->waits_for(*m.info);
    std::weak_ptr<ParameterGradients<TaskT>> grads = grads_;
    auto recorder = std::make_shared<GradientRecorder<TaskT>>(
        core_, m.info->backward_name(m.index), tensors.size(), input_edges.size(),
        m.record.parent ? std::optional<std::string>(m.parent_backward) : std::nullopt,
        [grads, key, waits, inferred = m.inferred_parent](Core& core, Record&& r) {
          details::list_backward(core, inferred);
          if (auto g = grads.lock())
            g->module_backward_done(key, waits, std::move(r));
          else
            commit_if_admitted(core, std::move(r));
        });
    BackwardProbe::attach(tensors, input_edges, m.seq_begin, at::sequence_number::peek(), recorder,
                          InputUses::all_edges);
  }

  std::shared_ptr<Core> core_;
  std::shared_ptr<ParameterGradients<TaskT>> grads_;  // the capture's own, shared with it
  const std::uint64_t serial_;
  std::shared_ptr<ModuleCatalog> catalog_;
  std::mutex threads_mutex_;
  std::unordered_map<std::thread::id, std::unique_ptr<ThreadModules>> threads_;
};

}  // namespace torchprobe::capture

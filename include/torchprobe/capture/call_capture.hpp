#pragma once
// What the probe makes of each outermost ATen call:
//  - the API entry "Aten.{op}.{n}.forward" and, through its autograd nodes, ".backward" (L1, mix);
//  - which module the call belongs to (L0, mix): a parameter-owning leaf module (Linear, Conv,
//    norms, Embedding, RNNs) is recognised by its parameters among the call's inputs, a call of it
//    being the run of consecutive calls that use them (its "episode"); other modules are marked
//    by a ModuleGuard in their forward;
//  - the module entries "Module.{path}.{Class}.forward.{n}", ".backward.{n}" and
//    ".parameters_grad.{k}", and construct.json's parent of every entry (mix, L0).
#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include <atomic>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "torchprobe/capture/api_observer.hpp"
#include "torchprobe/capture/backward_probe.hpp"
#include "torchprobe/capture/captured_call.hpp"
#include "torchprobe/capture/gradient_recorder.hpp"
#include "torchprobe/capture/module_catalog.hpp"
#include "torchprobe/capture/module_events.hpp"
#include "torchprobe/capture/value_encoder.hpp"
#include "torchprobe/core/names.hpp"
#include "torchprobe/details/block_pool.hpp"
#include "torchprobe/details/dump_core.hpp"
#include "torchprobe/io/call_stack_capture.hpp"
#include "torchprobe/level/level.hpp"

namespace torchprobe::capture {

namespace detail {

// Calls visit(tensor) for every tensor among boxed values, lists and tuples, in order, until it
// returns false; returns false when stopped.
template <class Visit>
bool visit_tensors(const c10::IValue& v, Visit&& visit) {
  if (v.isTensor()) return visit(v.toTensor());
  if (v.isList()) {  // tensor lists included
    for (const c10::IValue& e : v.toListRef())
      if (!visit_tensors(e, visit)) return false;
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements())
      if (!visit_tensors(e, visit)) return false;
  }
  return true;
}

template <class Values>
std::vector<at::Tensor> tensors_of(const Values& values) {
  std::vector<at::Tensor> out;
  for (const c10::IValue& v : values)
    visit_tensors(v, [&](const at::Tensor& t) {
      out.push_back(t);
      return true;
    });
  return out;
}

// Does any of these tensors carry autograd history that a backward pass could run through?
inline bool any_in_graph(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors)
    if (t.defined() && t.requires_grad() && t.grad_fn()) return true;
  return false;
}

// Could a backward pass reach this call? Only through an input that requires grad: without one,
// no output gets a grad_fn, so there is nothing to hook (and nothing worth allocating for).
template <class Values>
bool any_requires_grad(const Values& values) {
  for (const c10::IValue& v : values)
    if (!visit_tensors(v, [](const at::Tensor& t) { return !(t.defined() && t.requires_grad()); })) return true;
  return false;
}

// Tasks with a compact form of a tensor's item (StatisticsTask::summarize): their CPU tensors are
// kept as summaries until written; other tasks' tensors are described into JSON at capture.
template <class T, class = void>
struct task_summarizes : std::false_type {};
template <class T>
struct task_summarizes<T, std::void_t<decltype(std::declval<const T&>().summarize(
                              std::declval<const at::Tensor&>(), std::declval<const Record&>(), std::declval<TensorSummary&>()))>>
    : std::true_type {};

// A boxed call (the TorchScript interpreter's) hands RecordFunction its whole stack, the values
// of earlier instructions included, as inputs and as outputs: the call's own are the last ones.
template <class T>
c10::ArrayRef<T> own_values(c10::ArrayRef<T> values, bool schema_known, std::size_t count) {
  return schema_known && values.size() > count ? values.slice(values.size() - count) : values;
}

}  // namespace detail

template <class TaskT, Level L>
class CallCapture final : public ApiHandler, public ModuleEvents, public std::enable_shared_from_this<CallCapture<TaskT, L>> {
  static constexpr bool kApis = LevelTraits<L>::captures_apis;
  static constexpr bool kModules = LevelTraits<L>::captures_modules;
  using Core = details::DumpCore<TaskT>;

 public:
  explicit CallCapture(std::shared_ptr<Core> core) : core_(std::move(core)), serial_(next_serial()) {}

  // start(model): the modules to recognise. Kept while the same models are passed again, so
  // parameter-gradient hooks are registered once per parameter.
  void set_models(const ModelRef& models) {
    if (!kModules) return;
    if (same_models(models)) return;
    models_ = models;
    catalog_ = std::make_shared<ModuleCatalog>(models);
    std::lock_guard<std::mutex> lock(grads_mutex_);
    grad_state_.clear();
    for (const ModuleInfo* info : catalog_->all())
      for (const auto& p : info->params) hook_parameter(p.second);
  }

  // ---- the observer's callbacks -------------------------------------------------------------

  std::unique_ptr<CallContext> on_api_start(const at::RecordFunction& fn, const OpInfo& op) override {
    ThreadModules& tm = thread_modules();
    std::unique_ptr<Call> call;
    try {
      if (!op.user_api) {  // infrastructure and autograd's own records end a module's episode
        if (tm.episode) close_episode(tm);
        return nullptr;
      }
      call = std::make_unique<Call>();
      call->schema_known = op.schema_known;
      call->returns = op.returns;
      const auto inputs = detail::own_values(fn.inputs(), op.schema_known, op.args.size());
      const bool modules = tracks_modules(tm);
      if (modules) track_module_call(tm, op, inputs, *call);
      if (kApis && !tm.dump_only) start_api_entry(fn, op, inputs, tm, *call);
      if (!call->api && !call->backward && !modules) return nullptr;
      return call;
    } catch (const std::exception& e) {
      // The entry's name when it has one, as msprobe logs it.
      core_->errors.log("forward_input_data_collect", call && !call->record.name.empty() ? call->record.name : op.qualified, e);
      return nullptr;
    }
  }

  void on_api_end(const at::RecordFunction& fn, CallContext& ctx) override {
    Call& call = static_cast<Call&>(ctx);
    ThreadModules& tm = thread_modules();
    try {
      const auto outputs = detail::own_values(c10::ArrayRef<c10::IValue>(fn.outputs()), call.schema_known, call.returns);
      if (kModules || tm.dump_only) {  // a guard's output is its last call's: keep it (only then)
        tm.last_outputs.assign(outputs.begin(), outputs.end());
        ++tm.calls;
      }
      if (call.in_episode && tm.episode) {
        OpenModule& ep = *tm.episode;
        ep.last_outputs.assign(outputs.begin(), outputs.end());
        for (const at::Tensor& t : detail::tensors_of(outputs)) {
          ep.produced.insert(t.unsafeGetTensorImpl());
          if (call.param_only) ep.derived.insert(t.unsafeGetTensorImpl());  // W.t() and the like
        }
      }
      if (call.api) finish_api_entry(outputs, call);
      if (call.backward) attach_api_backward(outputs, call);
    } catch (const std::exception& e) {
      core_->errors.log("forward_output_data_collect", call.record.name, e);
    }
  }

  // ---- module guards ------------------------------------------------------------------------

  void* module_enter(const torch::nn::Module& module, const std::string* dump_name, std::vector<c10::IValue> inputs) override {
    ThreadModules& tm = thread_modules();
    try {
      const ModuleInfo* info = nullptr;
      if (dump_name) {
        if (tm.dump_only) return nullptr;  // one ScopedModuleDump at a time per thread
        auto named = std::make_unique<ModuleInfo>();
        named->key = &module;
        named->cls = module_class_name(module.name());
        named->path = *dump_name;
        named->prefix = "Module." + *dump_name + "." + named->cls + ".";
        for (const auto& p : module.named_parameters(/*recurse=*/false)) named->params.emplace_back(p.key(), p.value());
        named->leaf = module.children().empty();
        tm.dump_only = std::move(named);
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
      core_->errors.log("module_forward_pre", module.name(), e);
      return nullptr;
    }
  }

  void script_module_enter(const void* object, std::vector<c10::IValue> inputs) override {
    ThreadModules& tm = thread_modules();
    void* token = nullptr;
    try {
      const ModuleInfo* info = kModules && !tm.dump_only && catalog_ ? catalog_->find(object) : nullptr;
      if (info) token = enter_module(tm, *info, inputs);
    } catch (const std::exception& e) {
      core_->errors.log("module_forward_pre", "TorchScript module", e);
    }
    tm.script_tokens.push_back(token);  // pushed even when null: exits pair with enters
  }

  void script_module_exit(const c10::IValue& output) override {
    ThreadModules& tm = thread_modules();
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

  void module_exit(void* token, const std::vector<c10::IValue>* outputs, bool unwinding) override {
    ThreadModules& tm = thread_modules();
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
        if (mine && outputs) out = *outputs;
        else if (mine && tm.calls > m->calls_at_start) out = tm.last_outputs;
        finish_module(*m, out, /*with_backward=*/mine && !unwinding);
        if (mine) break;
      }
      if (tm.dump_only && tm.guards.empty()) tm.dump_only.reset();
    } catch (const std::exception& e) {
      core_->errors.log("module_forward", "module", e);
    }
  }

  // ---- the Debugger's calls at stop() and step() --------------------------------------------

  // Ends the episodes still open on every thread (a model's last module ends only when the
  // next call starts, and there may be none before stop()).
  void close_open_episodes() {
    std::lock_guard<std::mutex> lock(threads_mutex_);
    for (auto& kv : threads_)
      if (kv.second->episode) close_episode(*kv.second);
  }

  // Before a flush: module backward entries still waiting for their parameter gradients, and
  // parameter gradients that arrived only in part, are written as they are.
  void release_pending() {
    std::lock_guard<std::mutex> lock(grads_mutex_);
    for (auto& kv : grad_state_) {
      GradState& gs = kv.second;
      if (!gs.arrival.empty()) complete_param_grads(*kv.first, gs);
      while (!gs.stashed.empty()) {
        core_->commit_last(std::move(gs.stashed.front()));
        gs.stashed.pop_front();
      }
      gs.params_done = gs.backwards_done = 0;
    }
  }

  void on_step() {
    std::lock_guard<std::mutex> lock(grads_mutex_);
    for (auto& kv : grad_state_) kv.second = GradState{};
  }

 private:
  // ---- per-call and per-thread state --------------------------------------------------------

  struct OpenModule {
    const ModuleInfo* info = nullptr;
    Record record;
    std::int64_t index = 0;
    bool admitted = false;
    bool grad_enabled = false;
    std::uint64_t seq_begin = 0;
    std::string parent_backward;  // the enclosing module's backward entry, "" at top level
    std::vector<Edge> input_edges;
    std::unordered_set<const c10::TensorImpl*> inputs_seen, produced, derived;
    std::vector<c10::IValue> last_outputs;
    bool has_main = false;  // a call with a non-parameter input ran in it
    std::uint64_t calls_at_start = 0;
  };

  struct ThreadModules {
    std::optional<OpenModule> episode;
    std::vector<std::unique_ptr<OpenModule>> guards;  // innermost last
    std::unique_ptr<ModuleInfo> dump_only;            // ScopedModuleDump's module
    std::vector<c10::IValue> last_outputs;            // of the latest outermost call
    std::uint64_t calls = 0;
    std::vector<void*> script_tokens;                 // open TorchScript module calls
  };

  struct Call : CallContext {
    Record record;
    std::shared_ptr<CapturedCall> captured;  // the entry's body, in compact form until written
    bool api = false;       // an API forward entry is being recorded
    bool backward = false;  // its backward is to be hooked
    bool in_episode = false;
    bool param_only = false;
    bool grad_enabled = false;
    bool schema_known = false;
    std::size_t returns = 0;  // the schema's, for on_api_end
    std::uint64_t seq_begin = 0;
    std::vector<Edge> input_edges;
    std::string backward_name;
    std::string api_name;
    std::optional<std::string> backward_parent;
  };

  struct GradState {
    std::vector<bool> fired;
    std::vector<std::size_t> arrival;  // parameter indices in the order their gradients arrived
    std::int64_t k = 0;                // parameters_grad.{k}
    std::int64_t params_done = 0, backwards_done = 0;
    std::deque<Record> stashed;        // module backward entries waiting for parameters_grad
  };

  ThreadModules& thread_modules() {
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

  static std::uint64_t next_serial() {
    static std::atomic<std::uint64_t> s{1};
    return s.fetch_add(1);
  }

  bool tracks_modules(const ThreadModules& tm) const { return tm.dump_only || (kModules && catalog_ && !catalog_->empty()); }

  auto describer(Record& record) const {
    return [this, &record](const at::Tensor& t, const Site& site) { return core_->task.describe(t, site, record); };
  }

  std::optional<std::string> construct_parent(const ThreadModules& tm, bool in_episode) const {
    if (!kModules && !tm.dump_only) return std::nullopt;  // L1: construct.json stays {}
    if (in_episode && tm.episode) return tm.episode->record.name;
    if (!tm.guards.empty()) return tm.guards.back()->record.name;
    return std::string();
  }
  std::optional<std::string> backward_parent(const ThreadModules& tm, bool in_episode) const {
    if (!kModules && !tm.dump_only) return std::nullopt;
    if (in_episode && tm.episode) return tm.episode->info->backward_name(tm.episode->index);
    if (!tm.guards.empty()) return tm.guards.back()->info->backward_name(tm.guards.back()->index);
    return std::string();
  }

  // ---- API entries --------------------------------------------------------------------------

  template <class Inputs>
  void start_api_entry(const at::RecordFunction& fn, const OpInfo& op, const Inputs& inputs, ThreadModules& tm, Call& call) {
    details::StepState::Admission a = core_->state.begin_api_call(op.key, op.key_id, op.api);
    const DataMode& mode = core_->config.data_mode;
    if (a.admitted) {
      call.api = true;
      call.record.name = std::move(a.name);
      call.record.order = a.order;
      call.record.parent = construct_parent(tm, call.in_episode);
      if (mode.allows(/*forward=*/true, /*input=*/true)) capture_inputs(op, inputs, call);
      if (core_->config.extra_info) call.record.stack = io::capture_call_stack();
    }
    // The backward entry is admitted on its own name later, so hook it whatever the forward's fate.
    if ((mode.allows(false, true) || mode.allows(false, false)) && c10::GradMode::is_enabled() && detail::any_requires_grad(inputs)) {
      call.backward = true;
      call.grad_enabled = true;
      call.seq_begin = at::sequence_number::peek();
      // Edges are taken now: an in-place op is about to move its input's history.
      for (const at::Tensor& t : detail::tensors_of(inputs)) call.input_edges.push_back(gradient_edge_of(t));
      const std::string& forward = call.api ? call.record.name : a.name;
      call.backward_name = forward.substr(0, forward.size() - std::string("forward").size()) + "backward";
      call.api_name = op.api;
      call.backward_parent = backward_parent(tm, call.in_episode);
    }
    (void)fn;
  }

  // One value in compact form: a CPU tensor as the task's summary, a plain value as it is; what
  // has neither form is encoded now, by the task's describe().
  // The value is filled in place: an item is a few hundred bytes, not worth moving around.
  void capture_value(CapturedCall& cc, const c10::IValue& v, ArgKind kind, CapturedCall::Section section, std::size_t index,
                     const std::string* name, Record& record) const {
    CapturedCall::Item& item = cc.items.emplace_back();
    item.section = section;
    item.name = name;
    CapturedValue& c = item.value;
    c.kind = kind;
    if (summarized(v, record, c.tensor)) {
      c.form = CapturedValue::Form::Summary;
    } else if (CapturedValue::plain(v)) {
      c.form = CapturedValue::Form::Plain;
      c.value = v;
    } else {
      c.form = CapturedValue::Form::Json;
      ProbeGuard guard;  // describe() may run ATen ops (device statistics, snapshots to save)
      auto describe = describer(record);
      ValueEncoder<decltype(describe)> encode(describe);
      c.json = encode.encode(v, kind, site_of(section, index, name));
    }
  }

  bool summarized(const c10::IValue& v, const Record& record, TensorSummary& out) const {
    if constexpr (detail::task_summarizes<TaskT>::value)
      return v.isTensor() && v.toTensor().defined() && core_->task.summarize(v.toTensor(), record, out);
    return false;
  }

  static Site site_of(CapturedCall::Section section, std::size_t index, const std::string* name) {
    const std::string i = std::to_string(index);
    switch (section) {
      case CapturedCall::Section::Kwarg: return Site{"/input_kwargs/" + pointer_token(*name), "kwargs." + *name};
      case CapturedCall::Section::Output: return Site{"/output/" + i, "output." + i};
      case CapturedCall::Section::Arg: break;
    }
    return Site{"/input_args/" + i, "input." + i};
  }

  // Positional schema arguments go to input_args, keyword-only ones to input_kwargs by name.
  // No ProbeGuard around it: summaries run no ATen ops, and switching RecordFunction off and on
  // costs more than the rest of a small call's capture (libtorch rebuilds its callback lists).
  template <class Inputs>
  void capture_inputs(const OpInfo& op, const Inputs& inputs, Call& call) const {
    call.captured = new_body();
    CapturedCall& cc = *call.captured;
    cc.has_inputs = true;
    std::size_t positional = 0;
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      const ArgInfo* info = k < op.args.size() ? &op.args[k] : nullptr;
      const ArgKind kind = info ? info->kind : ArgKind::Generic;
      if (info && info->kwarg_only) {
        capture_value(cc, inputs[k], kind, CapturedCall::Section::Kwarg, k, &info->name, call.record);
      } else {
        capture_value(cc, inputs[k], kind, CapturedCall::Section::Arg, positional, nullptr, call.record);
        ++positional;
      }
    }
  }

  static std::shared_ptr<CapturedCall> new_body() {
    return std::allocate_shared<CapturedCall>(details::BodyAllocator<CapturedCall>());
  }

  template <class Outputs>
  void finish_api_entry(const Outputs& outputs, Call& call) {
    if (core_->config.data_mode.allows(/*forward=*/true, /*input=*/false)) {
      if (!call.captured) call.captured = new_body();
      CapturedCall& cc = *call.captured;
      cc.has_outputs = true;
      for (std::size_t k = 0; k < outputs.size(); ++k)
        capture_value(cc, outputs[k], ArgKind::Generic, CapturedCall::Section::Output, k, nullptr, call.record);
    }
    if (call.captured) {
      call.record.deferred = std::move(call.captured);
      // Deferred statistics and checksums are filled in through JSON pointers into the body.
      if (!call.record.pending.empty() || !call.record.pending_checksums.empty()) call.record.materialize();
    }
    if (call.record.has_content()) core_->commit(std::move(call.record));
  }

  template <class Outputs>
  void attach_api_backward(const Outputs& outputs, const Call& call) {
    const std::vector<at::Tensor> tensors = detail::tensors_of(outputs);
    if (!detail::any_in_graph(tensors)) return;  // most calls: nothing to hook, nothing to allocate
    const std::string api = call.api_name;
    auto recorder = std::make_shared<GradientRecorder<TaskT>>(
        core_, call.backward_name, tensors.size(), call.input_edges.size(), call.backward_parent, [api](Core& core, Record&& r) {
          if (core.state.admit_api(r.name, api)) core.commit_last(std::move(r));
        });
    BackwardProbe::attach(tensors, call.input_edges, call.seq_begin, at::sequence_number::peek(), recorder);
  }

  // A module's forward begins on this thread (a guard, a ScopedModuleDump, a TorchScript call).
  void* enter_module(ThreadModules& tm, const ModuleInfo& info, const std::vector<c10::IValue>& inputs) {
    if (tm.episode) close_episode(tm);
    auto m = std::make_unique<OpenModule>();
    open_module(tm, info, *m);
    if (m->admitted && core_->config.data_mode.allows(true, true)) {
      try {
        auto describe = describer(m->record);
        ValueEncoder<decltype(describe)> encode(describe);
        for (const c10::IValue& v : inputs) {
          const std::string idx = std::to_string(m->record.body["input_args"].size());
          m->record.body["input_args"].push_back(encode.encode(v, ArgKind::Generic, Site{"/input_args/" + idx, "input." + idx}));
        }
      } catch (const std::exception& e) {
        // No entry for this call; the module's scope (list/scope filters) closes with it.
        core_->state.exit_module(m->record.name);
        core_->errors.log("module_forward_pre", m->record.name, e);
        return nullptr;
      }
    }
    for (const at::Tensor& t : detail::tensors_of(inputs)) m->input_edges.push_back(gradient_edge_of(t));
    m->calls_at_start = tm.calls;
    tm.guards.push_back(std::move(m));
    return tm.guards.back().get();
  }

  // ---- module episodes ----------------------------------------------------------------------

  const ModuleInfo* owner_of(const ThreadModules& tm, const c10::TensorImpl* impl) const {
    if (tm.dump_only) {  // ScopedModuleDump: only that module's parameters count
      for (const auto& p : tm.dump_only->params)
        if (p.second.unsafeGetTensorImpl() == impl) return tm.dump_only.get();
      return nullptr;
    }
    return catalog_ ? catalog_->owner_of(impl) : nullptr;
  }

  template <class Inputs>
  void track_module_call(ThreadModules& tm, const OpInfo& op, const Inputs& inputs, Call& call) {
    const std::vector<at::Tensor> tensors = detail::tensors_of(inputs);
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
      if (ep.admitted && core_->config.data_mode.allows(true, true)) {
        const std::string idx = std::to_string(ep.record.body["input_args"].size());
        ep.record.body["input_args"].push_back(core_->task.describe(*t, Site{"/input_args/" + idx, "input." + idx}, ep.record));
      }
    }
  }

  // A module forward begins: its name, number, parameters and where its backward will start.
  void open_module(ThreadModules& tm, const ModuleInfo& info, OpenModule& m) {
    m.info = &info;
    m.index = core_->state.next_index(info.counter_key());
    m.record.name = info.forward_name(m.index);
    m.record.parent = construct_parent(tm, /*in_episode=*/false);
    if (!tm.guards.empty()) m.parent_backward = tm.guards.back()->info->backward_name(tm.guards.back()->index);
    core_->state.enter_module(m.record.name);
    m.admitted = core_->state.admit(m.record.name);
    m.grad_enabled = c10::GradMode::is_enabled();
    m.seq_begin = at::sequence_number::peek();
    if (!m.admitted) return;
    const DataMode& mode = core_->config.data_mode;
    if (mode.allows(true, true)) {
      m.record.body["input_args"] = nlohmann::ordered_json::array();
      m.record.body["input_kwargs"] = nlohmann::ordered_json::object();
    }
    if (mode.allows(true, false) && !info.params.empty()) {
      ProbeGuard guard;
      nlohmann::ordered_json params = nlohmann::ordered_json::object();
      for (const auto& p : info.params)
        params[p.first] = core_->task.describe(p.second, Site{"/parameters/" + pointer_token(p.first), "parameters." + p.first}, m.record);
      m.record.body["parameters"] = std::move(params);
    }
    if (core_->config.extra_info) m.record.stack = io::capture_call_stack();
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
    core_->state.exit_module(m.record.name);
    const DataMode& mode = core_->config.data_mode;
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
      if (mode.allows(true, false)) {
        ProbeGuard guard;
        auto describe = describer(r);
        ValueEncoder<decltype(describe)> encode(describe);
        nlohmann::ordered_json out = nlohmann::ordered_json::array();
        for (std::size_t k = 0; k < outputs.size(); ++k)
          out.push_back(encode.encode(outputs[k], ArgKind::Generic, Site{"/output/" + std::to_string(k), "output." + std::to_string(k)}));
        r.body["output"] = std::move(out);
        if (body.contains("parameters")) r.body["parameters"] = std::move(body["parameters"]);
      }
      if (!r.body.empty()) core_->commit_last(std::move(r));
    }
    if (!with_backward || !m.grad_enabled || !(mode.allows(false, true) || mode.allows(false, false))) return;
    const std::vector<at::Tensor> tensors = detail::tensors_of(outputs);
    if (!detail::any_in_graph(tensors)) return;
    // Only a module whose parameters carry our gradient hooks waits for its parameters_grad.
    // The ModuleInfo is used as a key only: a ScopedModuleDump's one is gone by then.
    const ModuleInfo* key = m.info;
    const bool waits = waits_for_param_grads(*m.info);
    std::weak_ptr<CallCapture> self = this->shared_from_this();
    auto recorder = std::make_shared<GradientRecorder<TaskT>>(
        core_, m.info->backward_name(m.index), tensors.size(), m.input_edges.size(),
        m.record.parent ? std::optional<std::string>(m.parent_backward) : std::nullopt,
        [self, key, waits](Core& core, Record&& r) {
          if (auto capture = self.lock()) capture->module_backward_done(key, waits, std::move(r));
          else commit_if_admitted(core, std::move(r));
        });
    BackwardProbe::attach(tensors, m.input_edges, m.seq_begin, at::sequence_number::peek(), recorder);
  }

  // ---- module backward and parameter gradients ----------------------------------------------

  // msprobe writes a module's parameters_grad before its backward entry: a module's backward is
  // complete once the gradients of its parameters have been accumulated too.
  bool waits_for_param_grads(const ModuleInfo& info) const {
    for (const auto& p : info.params)
      if (p.second.requires_grad() && hooked_.count(p.second.unsafeGetTensorImpl())) return true;
    return false;
  }

  void module_backward_done(const ModuleInfo* key, bool waits, Record&& r) {
    if (!core_->state.admit(r.name)) return;
    std::lock_guard<std::mutex> lock(grads_mutex_);
    GradState& gs = grad_state_[key];
    if (!waits || gs.backwards_done < gs.params_done) {
      ++gs.backwards_done;
      core_->commit_last(std::move(r));
    } else {
      gs.stashed.push_back(std::move(r));
    }
  }

  class ParamGradHook final : public torch::autograd::FunctionPostHook {
   public:
    ParamGradHook(std::weak_ptr<CallCapture> c, const c10::TensorImpl* p) : capture_(std::move(c)), param_(p) {}
    variable_list operator()(const variable_list& outputs, const variable_list& /*inputs*/) override {
      if (auto c = capture_.lock()) c->param_grad_arrived(param_);
      return outputs;
    }

   private:
    std::weak_ptr<CallCapture> capture_;
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
    acc->add_post_hook(std::make_unique<ParamGradHook>(this->weak_from_this(), impl));
    hooked_[impl] = std::move(acc);
  }

  void param_grad_arrived(const c10::TensorImpl* impl) {
    if (!core_->capturing.load() || !catalog_) return;
    if (!core_->config.data_mode.backward) return;
    std::lock_guard<std::mutex> lock(grads_mutex_);
    for (const ModuleInfo* info : catalog_->all()) {
      for (std::size_t k = 0; k < info->params.size(); ++k) {
        if (info->params[k].second.unsafeGetTensorImpl() != impl) continue;
        GradState& gs = grad_state_[info];
        gs.fired.resize(info->params.size(), false);
        if (gs.fired[k]) complete_param_grads(*info, gs);  // a new backward pass began
        gs.fired[k] = true;
        gs.arrival.push_back(k);
        std::size_t trainable = 0;
        for (const auto& p : info->params) trainable += p.second.requires_grad() ? 1 : 0;
        if (gs.arrival.size() >= trainable) complete_param_grads(*info, gs);
        return;
      }
    }
  }

  // Module.{path}.{Class}.parameters_grad.{k}: {"weight": [grad], "bias": [grad]}, in the order
  // the gradients arrived, then the module's backward entries that were waiting for it.
  void complete_param_grads(const ModuleInfo& info, GradState& gs) {
    Record r;
    r.name = info.prefix + "parameters_grad." + std::to_string(gs.k++);
    if (core_->state.admit(r.name)) {
      ProbeGuard guard;
      for (std::size_t k : gs.arrival) {
        const auto& p = info.params[k];
        const at::Tensor grad = p.second.grad();
        nlohmann::ordered_json one = nlohmann::ordered_json::array();
        one.push_back(grad.defined() ? core_->task.describe(grad, Site{"/" + pointer_token(p.first) + "/0", p.first}, r, /*gradient=*/true)
                                     : nlohmann::ordered_json(nullptr));
        r.body[p.first] = std::move(one);
      }
      core_->commit_last(std::move(r));
    }
    gs.arrival.clear();
    std::fill(gs.fired.begin(), gs.fired.end(), false);
    ++gs.params_done;
    while (!gs.stashed.empty() && gs.backwards_done < gs.params_done) {
      ++gs.backwards_done;
      core_->commit_last(std::move(gs.stashed.front()));
      gs.stashed.pop_front();
    }
  }

  bool same_models(const ModelRef& m) const {
    if (!catalog_ || m.nn.size() != models_.nn.size() || m.jit.size() != models_.jit.size()) return false;
    for (std::size_t i = 0; i < m.nn.size(); ++i)
      if (m.nn[i] != models_.nn[i]) return false;
    for (std::size_t i = 0; i < m.jit.size(); ++i)
      if (m.jit[i]._ivalue() != models_.jit[i]._ivalue()) return false;
    return true;
  }

  std::shared_ptr<Core> core_;
  const std::uint64_t serial_;
  ModelRef models_;
  std::shared_ptr<ModuleCatalog> catalog_;
  std::unordered_map<const c10::TensorImpl*, std::shared_ptr<Node>> hooked_;
  std::mutex threads_mutex_;
  std::unordered_map<std::thread::id, std::unique_ptr<ThreadModules>> threads_;
  std::mutex grads_mutex_;
  std::unordered_map<const ModuleInfo*, GradState> grad_state_;
};

}  // namespace torchprobe::capture

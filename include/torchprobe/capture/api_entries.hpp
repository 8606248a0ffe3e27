#pragma once
// The API entries of an outermost ATen call: "Aten.{op}.{n}.forward" with the call's inputs and
// outputs, and ".backward" with the gradients that flow through the autograd nodes it created
// (levels L1 and mix).
#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "torchprobe/capture/backward_probe.hpp"
#include "torchprobe/capture/call_values.hpp"
#include "torchprobe/capture/collective.hpp"
#include "torchprobe/capture/captured_call.hpp"
#include "torchprobe/capture/gradient_recorder.hpp"
#include "torchprobe/capture/op_registry.hpp"
#include "torchprobe/capture/value_encoder.hpp"
#include "torchprobe/core/probe_guard.hpp"
#include "torchprobe/core/record.hpp"
#include "torchprobe/details/block_pool.hpp"
#include "torchprobe/details/recorder.hpp"
#include "torchprobe/io/call_stack_capture.hpp"
#include "torchprobe/task/task_traits.hpp"

namespace torchprobe::capture {

// What an API call in flight carries from its start to its end.
struct ApiCall {
  Record record;
  std::shared_ptr<CapturedCall> captured;  // the entry's body, in compact form until written
  bool forward = false;                    // the forward entry is being recorded
  bool backward = false;                   // its backward is to be hooked
  std::uint64_t seq_begin = 0;
  std::vector<Edge> input_edges;
  std::string backward_name;
  std::string api_name;
  std::optional<std::string> backward_parent;
  std::string name;                  // the forward entry's name, whether or not it is dumped
  bool inside_backward = false;      // L2: its backward is inside the listed backward, dumped whatever its name
  std::unique_ptr<CallCheck> check;  // a task that re-runs calls (task_traits::checks_calls): its state
};

// `LevelNested` (L2): calls keep their forward name for the calls nested in them.
template <class TaskT, bool LevelNested = false>
class ApiEntries {
  using Core = torchprobe::details::Recorder<TaskT>;

 public:
  explicit ApiEntries(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  // The call starts. `parents` tells where its entries sit in construct.json: parents.forward()
  // and parents.backward() (std::optional<std::string>), asked only when needed. `inside` (L2):
  // the call runs inside the one the list names, and is dumped whatever the filters say.
  template <class Inputs, class Parents>
  void start(const OpInfo& op, const Inputs& inputs, const Parents& parents, ApiCall& call, bool inside = false) {
    torchprobe::details::StepState::Admission a = core_->entries().begin_api_call(op.key, op.key_id, op.api);
    a.admitted = a.admitted || inside;
    if constexpr (LevelNested) call.name = a.name;
    if constexpr (task_traits::checks_calls<TaskT>::value) {  // the task makes no entries of calls: it checks them
      if (a.admitted) call.check = core_->task().check_call(op, inputs, a.name);
      call.forward = call.check != nullptr;
      if (call.forward) call.record.name = std::move(a.name);  // errors name the call
      return;
    }
    const DataMode& mode = core_->config().data_mode;
    if (a.admitted) {
      call.forward = true;
      call.record.name = std::move(a.name);
      call.record.order = a.order;
      call.record.parent = parents.forward();
      if (mode.forward_inputs()) capture_inputs(op, inputs, call);
      if (core_->config().extra_info) call.record.stack = io::capture_shared_call_stack();
    }
    // The backward entry is admitted on its own name later, so hook it whatever the forward's fate.
    if (mode.any_backward() && c10::GradMode::is_enabled() && details::any_requires_grad(inputs)) {
      call.backward = true;
      call.seq_begin = at::sequence_number::peek();
      // Edges are taken now: an in-place op is about to move its input's history.
      for (const at::Tensor& t : details::tensors_of(inputs)) call.input_edges.push_back(gradient_edge_of(t));
      const std::string& forward = call.forward ? call.record.name : a.name;
      call.backward_name = forward.substr(0, forward.size() - std::string("forward").size()) + "backward";
      call.api_name = op.api;
      call.backward_parent = parents.backward();
    }
  }

  // The call ended: its forward entry is complete.
  template <class Outputs>
  void finish(const Outputs& outputs, ApiCall& call) {
    if constexpr (task_traits::checks_calls<TaskT>::value) {
      if (call.check) core_->task().check_call_end(*call.check, outputs);
      return;
    }
    if (core_->config().data_mode.forward_outputs()) {
      if (!call.captured) call.captured = new_body(0);
      CapturedCall& cc = *call.captured;
      cc.has_outputs = true;
      for (std::size_t k = 0; k < outputs.size(); ++k)
        capture_value(cc, outputs[k], ArgKind::Generic, CapturedCall::Section::Output, k, nullptr, call.record);
    }
    commit(call);
  }

 private:
  void commit(ApiCall& call) {
    if (call.captured) {
      call.captured->release_spare();
      call.record.deferred = std::move(call.captured);
      // Deferred statistics and checksums are filled in through JSON pointers into the body.
      if (!call.record.pending.empty() || !call.record.pending_checksums.empty()) call.record.materialize();
    }
    if (call.record.has_content()) core_->commit(std::move(call.record));
  }

  static void add_json(CapturedCall& cc, CapturedCall::Section section, const std::string* name,
                       const nlohmann::ordered_json& json) {
    CapturedCall::Item item{section, name, {}};
    item.value.kind = ArgKind::Generic;
    item.value.set_json(json);
    cc.add(std::move(item));
  }

 public:
  // A collective (capture/collective.hpp) starts: its forward entry only (collectives write into
  // tensors that autograd does not track), inputs as they are now, before the collective runs.
  template <class Parents>
  void start_collective(const OpInfo& op, const Collective& c, const Parents& parents, ApiCall& call) {
    if constexpr (task_traits::checks_calls<TaskT>::value) return;  // a task that re-runs calls: not these
    torchprobe::details::StepState::Admission a = core_->entries().begin_api_call(op.key, op.key_id, op.api);
    if (!a.admitted) return;
    call.forward = true;
    call.record.name = std::move(a.name);
    call.record.order = a.order;
    call.record.parent = parents.forward();
    if (core_->config().data_mode.forward_inputs()) {
      call.captured = new_body(0);
      CapturedCall& cc = *call.captured;
      cc.has_inputs = true;
      for (std::size_t k = 0; k < c.args.size(); ++k)
        capture_value(cc, c.args[k], ArgKind::Generic, CapturedCall::Section::Arg, k, nullptr, call.record);
      for (const auto& [name, json] : c.kwargs) add_json(cc, CapturedCall::Section::Kwarg, name, json);
    }
    if (core_->config().extra_info) call.record.stack = io::capture_shared_call_stack();
  }

  // The collective's work completed: msprobe's output is the arguments again, then the keyword values.
  void finish_collective(const Collective& c, ApiCall& call) {
    if (c.ended && core_->config().data_mode.forward_outputs()) {
      if (!call.captured) call.captured = new_body(0);
      CapturedCall& cc = *call.captured;
      cc.has_outputs = true;
      for (std::size_t k = 0; k < c.args.size(); ++k)
        capture_value(cc, c.args[k], ArgKind::Generic, CapturedCall::Section::Output, k, nullptr, call.record);
      for (const auto& kw : c.kwargs) add_json(cc, CapturedCall::Section::Output, nullptr, kw.second);
    }
    commit(call);
  }

  // Hooks the backward entry on the autograd nodes the call created; false when there are none.
  template <class Outputs>
  bool attach_backward(const Outputs& outputs, const ApiCall& call) {
    const std::vector<at::Tensor> tensors = details::tensors_of(outputs);
    if (!details::any_in_graph(tensors)) return false;  // most calls: nothing to hook, nothing to allocate
    const std::string api = call.api_name;
    const bool inside = call.inside_backward;
    auto recorder =
        std::make_shared<GradientRecorder<TaskT>>(core_, call.backward_name, tensors.size(), call.input_edges.size(),
                                                  call.backward_parent, [api, inside](Core& core, Record&& r) {
                                                    if (core.entries().admit_api(r.name, api) || inside)
                                                      core.commit_last(std::move(r));
                                                  });
    return BackwardProbe::attach(tensors, call.input_edges, call.seq_begin, at::sequence_number::peek(), recorder);
  }

 private:
  auto describer(Record& record) const {
    return [this, &record](const at::Tensor& t, const Site& site) { return core_->task().describe(t, site, record); };
  }

  // One value in compact form: a CPU tensor as the task's summary, a plain value as it is; what
  // has neither form is encoded now, by the task's describe().
  void capture_value(CapturedCall& cc, const c10::IValue& v, ArgKind kind, CapturedCall::Section section,
                     std::size_t index, const std::string* name, Record& record) const {
    if (v.isTensor()) {
      TensorSummary summary;
      if (summarized(v, section, index, name, record, summary)) return cc.add_summary(section, name, kind, summary);
    }
    CapturedCall::Item item{section, name, {}};
    CapturedValue& c = item.value;
    c.kind = kind;
    if (CapturedValue::plain(v)) {
      c.set_plain(v);
    } else {
      ProbeGuard guard;  // describe() may run ATen ops (device statistics, snapshots to save)
      auto describe = describer(record);
      ValueEncoder<decltype(describe)> encode(describe);
      c.set_json(encode.encode(v, kind, site_of(section, index, name)));
    }
    cc.add(std::move(item));
  }

  bool summarized(const c10::IValue& v, CapturedCall::Section section, std::size_t index, const std::string* name,
                  Record& record, TensorSummary& out) const {
    if constexpr (task_traits::summarizes<TaskT>::value)
      return v.isTensor() && v.toTensor().defined() &&
             core_->task().summarize(v.toTensor(), site_of(section, index, name), record, out);
    return false;
  }

  static Site site_of(CapturedCall::Section section, std::size_t index, const std::string* name) {
    switch (section) {
      case CapturedCall::Section::Kwarg: return Site::kwarg(*name);
      case CapturedCall::Section::Output: return Site::output(index);
      case CapturedCall::Section::Arg: break;
    }
    return Site::input(index);
  }

  // Positional schema arguments go to input_args, keyword-only ones to input_kwargs by name.
  // No ProbeGuard around it: summaries run no ATen ops, and switching RecordFunction off and on
  // costs more than the rest of a small call's capture (libtorch rebuilds its callback lists).
  template <class Inputs>
  void capture_inputs(const OpInfo& op, const Inputs& inputs, ApiCall& call) const {
    call.captured = new_body(encoded_inputs_size(op, inputs));
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

  // What the inputs take in a CapturedCall, and an output like the first tensor (most calls have
  // one, shaped like an input).
  template <class Inputs>
  static std::size_t encoded_inputs_size(const OpInfo& op, const Inputs& inputs) {
    std::size_t bytes = 0;
    std::size_t output = 0;
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      const std::size_t n = CapturedCall::encoded_size(inputs[k], k < op.args.size() && op.args[k].kwarg_only);
      if (output == 0 && inputs[k].isTensor()) output = n;
      bytes += n;
    }
    return bytes + output;
  }

  static std::shared_ptr<CapturedCall> new_body(std::size_t bytes) {
    auto body = std::allocate_shared<CapturedCall>(torchprobe::details::BodyAllocator<CapturedCall>());
    body->reserve(bytes);
    return body;
  }

  std::shared_ptr<Core> core_;
};

}  // namespace torchprobe::capture

#pragma once
// Turns the observer's ATen calls into dump.json records for one task.
#include <ATen/record_function.h>

#include <exception>
#include <memory>

#include "../config/config.hpp"
#include "../details/dump_core.hpp"
#include "../io/error_log.hpp"
#include "../io/stack_trace.hpp"
#include "api_observer.hpp"
#include "value_encoder.hpp"

namespace torchprobe::capture {

template <class TaskT>
class ApiCapture final : public ApiHandler {
 public:
  explicit ApiCapture(std::shared_ptr<details::DumpCore<TaskT>> core)
      : core_(std::move(core)), config_(core_->config), task_(core_->task), state_(core_->state), errors_(core_->errors) {}

  std::unique_ptr<CallContext> on_api_start(const at::RecordFunction& fn, const OpInfo& op) override {
    try {
      details::StepState::Admission a = state_.begin_api_call(op.key, op.api);
      if (!a.admitted) return nullptr;
      auto call = std::make_unique<Call>();
      call->record.name = std::move(a.name);
      call->record.order = a.order;
      // Inputs are read here or never: fn.inputs() is only valid in the start callback, and an
      // in-place op has not yet overwritten them.
      if (config_.data_mode.allows(/*forward=*/true, /*input=*/true)) encode_inputs(fn, op, call->record);
      if (config_.extra_info) call->record.stack = io::capture_call_stack();
      return call;
    } catch (const std::exception& e) {
      errors_.log("forward_input_data_collect", op.qualified, e);
      return nullptr;
    }
  }

  void on_api_end(const at::RecordFunction& fn, CallContext& ctx) override {
    Record& record = static_cast<Call&>(ctx).record;
    try {
      if (config_.data_mode.allows(/*forward=*/true, /*input=*/false)) {
        ProbeGuard guard;
        auto describe = describer(record);
        ValueEncoder<decltype(describe)> encode(describe);
        nlohmann::ordered_json out = nlohmann::ordered_json::array();
        const auto& outputs = fn.outputs();
        for (std::size_t k = 0; k < outputs.size(); ++k)
          out.push_back(encode.encode(outputs[k], ArgKind::Generic, Site{"/output/" + std::to_string(k), "output." + std::to_string(k)}));
        record.body["output"] = std::move(out);
      }
    } catch (const std::exception& e) {
      errors_.log("forward_output_data_collect", record.name, e);
    }
    if (!record.body.empty()) state_.commit(std::move(record));
  }

 private:
  struct Call : CallContext {
    Record record;
  };

  auto describer(Record& record) const {
    return [this, &record](const at::Tensor& t, const Site& site) { return task_.describe(t, site, record); };
  }

  // Positional schema arguments go to input_args, keyword-only ones to input_kwargs by name.
  void encode_inputs(const at::RecordFunction& fn, const OpInfo& op, Record& record) const {
    ProbeGuard guard;
    auto describe = describer(record);
    ValueEncoder<decltype(describe)> encode(describe);
    nlohmann::ordered_json args = nlohmann::ordered_json::array();
    nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
    const auto inputs = fn.inputs();
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      const ArgInfo* info = k < op.args.size() ? &op.args[k] : nullptr;
      const ArgKind kind = info ? info->kind : ArgKind::Generic;
      if (info && info->kwarg_only) {
        kwargs[info->name] = encode.encode(inputs[k], kind, Site{"/input_kwargs/" + pointer_token(info->name), "kwargs." + info->name});
      } else {
        const std::string idx = std::to_string(args.size());
        args.push_back(encode.encode(inputs[k], kind, Site{"/input_args/" + idx, "input." + idx}));
      }
    }
    record.body["input_args"] = std::move(args);
    record.body["input_kwargs"] = std::move(kwargs);
  }

  std::shared_ptr<details::DumpCore<TaskT>> core_;  // keeps the references below alive
  const Config& config_;
  const TaskT& task_;
  details::StepState& state_;
  io::ErrorLog& errors_;
};

}  // namespace torchprobe::capture

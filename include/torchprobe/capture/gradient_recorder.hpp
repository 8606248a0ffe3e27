#pragma once
// Builds a backward entry ({"input": grads w.r.t. outputs, "output": grads w.r.t. inputs}) from
// the gradients a BackwardProbe reports, and hands it on when the region's backward is over.
#include <functional>
#include <memory>
#include <string>

#include "torchprobe/details/recorder.hpp"
#include "torchprobe/capture/backward_probe.hpp"
#include "torchprobe/capture/value_encoder.hpp"

namespace torchprobe::capture {

template <class TaskT>
class GradientRecorder final : public GradientReceiver {
 public:
  using Core = torchprobe::details::Recorder<TaskT>;
  using Done = std::function<void(Core&, Record&&)>;

  // `outputs`/`inputs`: how many gradient slots each list has; slots that never receive a
  // gradient stay null (an input that needs none, an output that got none).
  GradientRecorder(const std::shared_ptr<Core>& core, std::string name, std::size_t outputs, std::size_t inputs,
                   std::optional<std::string> parent, Done done)
      : core_(core), generation_(core->generation()), done_(std::move(done)) {
    record_.name = std::move(name);
    record_.parent = std::move(parent);
    const DataMode& mode = core->config().data_mode;
    want_in_ = mode.backward_inputs();
    want_out_ = mode.backward_outputs();
    if (want_in_) record_.body["input"] = nlohmann::ordered_json(std::vector<nlohmann::ordered_json>(outputs, nullptr));
    if (want_out_)
      record_.body["output"] = nlohmann::ordered_json(std::vector<nlohmann::ordered_json>(inputs, nullptr));
  }

  void grad_output(std::size_t i, const at::Tensor& grad) override { put(want_in_, "input", i, grad); }
  void grad_input(std::size_t k, const at::Tensor& grad) override { put(want_out_, "output", k, grad); }

  void backward_done() override {
    auto core = live_core();
    if (!core) return;
    const std::string name = record_.name;
    try {
      done_(*core, std::move(record_));
    } catch (const std::exception& e) {
      core->errors().log("backward_data_collect", name, e);
    }
  }

 private:
  std::shared_ptr<Core> live_core() const {
    auto core = core_.lock();
    return core && core->live(generation_) ? core : nullptr;
  }

  void put(bool wanted, const char* key, std::size_t index, const at::Tensor& grad) {
    if (!wanted || !grad.defined()) return;
    auto core = live_core();
    if (!core) return;
    try {
      record_.body[key][index] = core->task().describe(grad, Site::gradient(key, index), record_, /*gradient=*/true);
    } catch (const std::exception& e) {
      core->errors().log("backward_data_collect", record_.name, e);
    }
  }

  std::weak_ptr<Core> core_;  // a retained graph must not keep a finished debugger alive
  std::uint64_t generation_;
  Done done_;
  Record record_;
  bool want_in_ = true, want_out_ = true;
};

// The usual end of a backward entry: filtered by name like any entry, placed in dump order
// when it completes.
template <class Core>
void commit_if_admitted(Core& core, Record&& r) {
  if (core.entries().admit(r.name)) core.commit_last(std::move(r));
}

}  // namespace torchprobe::capture

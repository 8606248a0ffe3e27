#pragma once
// PrecisionDebugger: msprobe's entry point, driven by a config.json. The task and level come from
// the file at run time, so it picks the matching BasicDebugger<Level, TaskT> of its task list.
// With "task": "grad_probe" it is a GradMonitor instead: monitor(model) once, then step() right
// before each optimizer.step(); start() and stop() do nothing for that task, as in msprobe.
// With "dump_enable" in the file (msprobe's dynamic start/stop) the file is watched: a change is read
// at the next step() and the following steps use it, numbered on; "dump_enable": false makes start()
// record nothing. A broken edit is reported (stderr and {dump_path}/dump_error_info.log) and the
// configuration in use is kept.
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "torchprobe/config/config_watch.hpp"
#include "torchprobe/config/options.hpp"
#include "torchprobe/debugger.hpp"
#include "torchprobe/debugger_interface.hpp"
#include "torchprobe/process_debugger.hpp"
#include "torchprobe/task/builtin.hpp"

namespace torchprobe {

template <class Tasks>
class BasicPrecisionDebugger final : public DebuggerInterface {
 public:
  explicit BasicPrecisionDebugger(const std::string& config_path, Options overrides = Options())
      : BasicPrecisionDebugger(overrides.config_file(config_path)) {}
  explicit BasicPrecisionDebugger(const Options& options);
  BasicPrecisionDebugger(const BasicPrecisionDebugger&) = delete;
  BasicPrecisionDebugger& operator=(const BasicPrecisionDebugger&) = delete;
  ~BasicPrecisionDebugger() override { details::release_process_debugger(this); }

  // The process's debugger (process_debugger.hpp): the first PrecisionDebugger made and still
  // alive, reached from any file of the program. std::logic_error when there is none, or when it is
  // a PrecisionDebugger of another task list.
  static BasicPrecisionDebugger& instance() {
    auto* d = dynamic_cast<BasicPrecisionDebugger*>(&process_debugger());
    if (d == nullptr)
      throw std::logic_error("torchprobe: the process's debugger is a PrecisionDebugger of another task list");
    return *d;
  }

  // start(...) in all its forms is DebuggerInterface's, each a start_with().
  void start_with(const ModelRef& model, std::optional<std::int64_t> rank_id,
                  std::optional<TokenRange> tokens = std::nullopt) override {
    // L0/mix: the model given, else an earlier start()'s, else std::invalid_argument; checked also
    // when dump_enable is false.
    const ModelRef use = grad_probe_ ? model : model_for_start(impl_->config().level, model, model_);
    if (tokens && !grad_probe_) check_token_range(*tokens, use);
    if (!use.empty()) model_ = use;
    rank_id_ = rank_id;
    tokens_ = tokens;
    if (impl_->config().dump_enable.value_or(true)) impl_->start_with(use, rank_id, tokens);
  }
  void stop() noexcept override { impl_->stop(); }
  // grad_probe: call it right before optimizer.step(); other tasks: at the end of each step.
  void step() override {
    impl_->step();
    if (watch_ && watch_->changed()) reload();
  }
  // grad_probe: the model whose parameters' gradients are recorded (msprobe's debugger.monitor).
  template <class Model>
  void monitor(const Model& model) {
    monitor_model(to_model_ref(model));
  }
  void monitor_model(const ModelRef& model) override { impl_->monitor_model(model); }
  void wait_written() override { impl_->wait_written(); }
  void set_init_step(std::int64_t step) override { impl_->set_init_step(step); }
  void save(const SaveValue& value, const std::string& name, bool save_backward = true) override {
    impl_->save(value, name, save_backward);
  }
  bool running() const override { return impl_->running(); }
  std::int64_t current_step() const override { return impl_->current_step(); }
  const Config& config() const override { return impl_->config(); }

 private:
  // The debugger of the configured task and level; its definition is in precision_debugger_impl.hpp.
  static std::unique_ptr<DebuggerInterface> make(const Options& options);
  // dump_enable: the edited file replaces the debugger between two steps.
  void reload();

  Options options_;
  bool grad_probe_;  // task grad_probe: impl_ is a details::GradProbeDebugger
  std::unique_ptr<DebuggerInterface> impl_;
  std::optional<ConfigFileWatch> watch_;  // dump_enable
  ModelRef model_;                        // of the last start(), for a capture that goes on after a reload
  std::optional<std::int64_t> rank_id_;
  std::optional<TokenRange> tokens_;
};

using PrecisionDebugger = BasicPrecisionDebugger<BuiltinTasks>;

}  // namespace torchprobe

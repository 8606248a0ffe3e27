#pragma once
// PrecisionDebugger: msprobe's entry point, driven by a config.json. The task and level come from
// the file at run time, so it picks the matching Debugger<Level, Task> instantiation.
#include <memory>
#include <string>

#include "torchprobe/debugger.hpp"
#include "torchprobe/debugger_interface.hpp"

namespace torchprobe {

class PrecisionDebugger final : public DebuggerInterface {
 public:
  explicit PrecisionDebugger(const std::string& config_path, Options overrides = Options())
      : PrecisionDebugger(overrides.config_file(config_path)) {}
  explicit PrecisionDebugger(const Options& options) : impl_(make(options)) {}

  void start() { impl_->start_with(ModelRef{}, std::nullopt); }
  template <class Model, class = std::enable_if_t<!std::is_arithmetic_v<std::decay_t<Model>>>>
  void start(const Model& model, std::optional<std::int64_t> rank_id = std::nullopt) {
    impl_->start_with(to_model_ref(model), rank_id);
  }
  void start_with(const ModelRef& model, std::optional<std::int64_t> rank_id) override { impl_->start_with(model, rank_id); }
  void stop() noexcept override { impl_->stop(); }
  void step() override { impl_->step(); }
  void set_init_step(std::int64_t step) override { impl_->set_init_step(step); }
  void save(const SaveValue& value, const std::string& name, bool save_backward = true) override {
    impl_->save(value, name, save_backward);
  }
  bool running() const override { return impl_->running(); }
  const Config& config() const override { return impl_->config(); }

 private:
  // Each (level, task) pair that is implemented gets one line here.
  static std::unique_ptr<DebuggerInterface> make(const Options& options) {
    const Config c = options.resolve();
    if (c.task == Task::Statistics) {
      switch (c.level) {
        case Level::L0: return std::make_unique<Debugger<Level::L0, Task::Statistics>>(options);
        case Level::L1: return std::make_unique<Debugger<Level::L1, Task::Statistics>>(options);
        case Level::Mix: return std::make_unique<Debugger<Level::Mix, Task::Statistics>>(options);
        case Level::Debug: return std::make_unique<Debugger<Level::Debug, Task::Statistics>>(options);
        default: break;
      }
    }
    if (c.task == Task::Tensor) {
      switch (c.level) {
        case Level::L0: return std::make_unique<Debugger<Level::L0, Task::Tensor>>(options);
        case Level::L1: return std::make_unique<Debugger<Level::L1, Task::Tensor>>(options);
        case Level::Mix: return std::make_unique<Debugger<Level::Mix, Task::Tensor>>(options);
        case Level::Debug: return std::make_unique<Debugger<Level::Debug, Task::Tensor>>(options);
        default: break;
      }
    }
    if (c.task == Task::OverflowCheck) {
      switch (c.level) {
        case Level::L0: return std::make_unique<Debugger<Level::L0, Task::OverflowCheck>>(options);
        case Level::L1: return std::make_unique<Debugger<Level::L1, Task::OverflowCheck>>(options);
        case Level::Mix: return std::make_unique<Debugger<Level::Mix, Task::OverflowCheck>>(options);
        default: break;
      }
    }
    throw ConfigError("config keys \"level\"/\"task\": level \"" + std::string(level_name(c.level)) + "\" with task \"" +
                      std::string(task_name(c.task)) +
                      "\" is not available in this TorchProbe version (available: levels \"L0\", \"L1\", \"mix\", "
                      "\"debug\" with tasks \"statistics\" and \"tensor\"; levels \"L0\", \"L1\", \"mix\" with task "
                      "\"overflow_check\")");
  }

  std::unique_ptr<DebuggerInterface> impl_;
};

}  // namespace torchprobe

#pragma once
// Debugger<Level, Task, Sink>: the composition of the three policies.
//
//   Level  which calls are captured (capture/: the ATen observer for APIs)
//   Task   what is written for each tensor (task/: statistics, ...)
//   Sink   where a flushed step goes (sink/: msprobe's directory layout, memory, nowhere)
//
// Not started, it registers nothing and costs nothing. start() registers the capture; stop()
// removes it and writes the step's files; step() moves to the next step{N}/ directory.
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "capture/api_observer.hpp"
#include "capture/call_capture.hpp"
#include "capture/model_ref.hpp"
#include "capture/torchscript.hpp"
#include "config/options.hpp"
#include "debugger_interface.hpp"
#include "details/dump_core.hpp"
#include "details/session.hpp"
#include "level/level.hpp"
#include "sink/directory_sink.hpp"
#include "task/task_policy.hpp"

namespace torchprobe {

template <Level L, Task T, class Sink = DirectorySink>
class Debugger final : public DebuggerInterface {
  static_assert(L != Level::L2, "torchprobe: Level::L2 (every nested ATen op) is not available yet");
  using TaskT = typename TaskPolicy<T>::type;
  using Core = details::DumpCore<TaskT>;
  using Capture = capture::CallCapture<TaskT, L>;

 public:
  explicit Debugger(const Options& options = Options())
      : core_(std::make_shared<Core>(options.resolve(L, T))), session_(core_->config) {
    for (const std::string& w : core_->config.warnings) std::cerr << "torchprobe: warning: " << w << "\n";
  }
  // A msprobe config.json; Options(...).config_file(path) also takes overrides.
  explicit Debugger(const std::string& config_path) : Debugger(Options().config_file(config_path)) {}
  explicit Debugger(const char* config_path) : Debugger(std::string(config_path)) {}

  Debugger(const Debugger&) = delete;
  Debugger& operator=(const Debugger&) = delete;
  ~Debugger() override { stop(); }

  void start() { start_with(ModelRef{}, std::nullopt); }
  template <class Model, class = std::enable_if_t<!std::is_arithmetic_v<std::decay_t<Model>>>>
  void start(const Model& model, std::optional<std::int64_t> rank_id = std::nullopt) {
    start_with(to_model_ref(model), rank_id);
  }

  void start_with(const ModelRef& model, std::optional<std::int64_t> rank_id) override {
    if (running_) return;
    if (session_.finished()) {
      if (!told_finished_) std::cerr << "torchprobe: the last configured step has passed; nothing more is dumped\n";
      told_finished_ = true;
      return;
    }
    session_.resolve_rank(rank_id);
    rank_id_ = rank_id;
    model_ = model;
    if (!session_.dumps_now()) return;
    directory_ = session_.step_directory();
    sink_.open(directory_);  // an unwritable dump_path is reported here, with the path and the reason
    core_->errors.set_directory(directory_);
    if (!capture_) capture_ = std::make_shared<Capture>(core_);
    capture_->set_models(model);
    if (LevelTraits<L>::captures_modules && !model.jit.empty()) {
      for (const auto& m : model.jit) capture::instrument_script_module(m);
      script_settings_.enter();
    }
    observer_.attach(capture_);
    core_->capturing = true;
    running_ = true;
    step_has_data_ = true;
  }

  void stop() noexcept override {
    if (!running_) return;
    observer_.detach();
    try {
      capture_->close_open_episodes();
    } catch (const std::exception& e) {
      core_->errors.log("module_forward", "stop", e);
    }
    core_->capturing = false;
    running_ = false;
    script_settings_.leave();
    flush();
  }

  // Writes the step, then numbers the next one; a running capture continues into the new step.
  void step() override {
    const bool was_running = running_;
    stop();  // writes the step's files (a stopped capture wrote them at its stop())
    session_.advance();
    core_->generation.fetch_add(1);
    core_->state.reset();
    core_->errors.reset();
    if (capture_) capture_->on_step();
    step_has_data_ = false;
    if (was_running) start_with(model_, rank_id_);
  }

  void set_init_step(std::int64_t step) override { session_.set_init_step(step); }
  bool running() const override { return running_; }
  const Config& config() const override { return core_->config; }

  std::int64_t current_step() const { return session_.step(); }
  // {dump_path}/step{N}/{rank dir} of the last start().
  const std::string& directory() const { return directory_; }
  Sink& sink() { return sink_; }
  TaskT& task() { return core_->task; }

 private:
  void flush() noexcept {
    if (!step_has_data_) return;
    try {
      if (capture_) capture_->release_pending();
      core_->state.with_records([&](const std::vector<Record>& records) {
        StepDump d;
        d.task = std::string(task_name(T));
        d.level = std::string(level_name(L));
        d.directory = directory_;
        d.step = session_.step();
        d.extra_info = core_->config.extra_info;
        d.records = &records;
        sink_.write_step(d);
      });
    } catch (const std::exception& e) {
      // Never let a full disk or a vanished directory stop training: report and go on.
      core_->errors.log("write_json", directory_, e);
      std::cerr << "torchprobe: could not write the dump of step " << session_.step() << ": " << e.what() << "\n";
    }
  }

  std::shared_ptr<Core> core_;
  details::Session session_;
  Sink sink_;
  capture::ApiObserver observer_;
  std::shared_ptr<Capture> capture_;
  capture::ScriptExecutorSettings script_settings_;
  ModelRef model_;
  std::optional<std::int64_t> rank_id_;
  std::string directory_;
  bool running_ = false;
  bool step_has_data_ = false;
  bool told_finished_ = false;
};

}  // namespace torchprobe

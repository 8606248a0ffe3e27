#pragma once
// PrecisionDebugger: msprobe's entry point, driven by a config.json. The task and level come from
// the file at run time, so it picks the matching BasicDebugger<Level, TaskT> of its task list.
// With "task": "grad_probe" it is a GradMonitor instead: monitor(model) once, then step() right
// before each optimizer.step(); start() and stop() do nothing for that task, as in msprobe.
// With "dump_enable" in the file (msprobe's dynamic start/stop) the file is watched: a change is read
// at the next step() and the following steps use it, numbered on; "dump_enable": false makes start()
// record nothing. A broken edit is reported (stderr and {dump_path}/dump_error_info.log) and the
// configuration in use is kept.
#include <cstddef>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "torchprobe/config/config_watch.hpp"
#include "torchprobe/config/options.hpp"
#include "torchprobe/debugger.hpp"
#include "torchprobe/debugger_interface.hpp"
#include "torchprobe/io/error_log.hpp"
#include "torchprobe/task/grad_probe/monitor.hpp"
#include "torchprobe/task/registry.hpp"
#include "torchprobe/task/task_list.hpp"

namespace torchprobe {

namespace details {

// grad_probe behind the Debugger's interface: it watches gradients, not calls, so start(), stop(),
// save() and the step's files are nothing to it (as in msprobe), and step() is its step, right
// before optimizer.step().
class GradProbeDebugger final : public DebuggerInterface {
 public:
  explicit GradProbeDebugger(Config config) : monitor_(std::move(config)) {}
  void start_with(const ModelRef&, std::optional<std::int64_t>, std::optional<TokenRange>) override {}
  void stop() noexcept override {}
  void step() override { monitor_.step(); }
  void wait_written() override {}
  void set_init_step(std::int64_t) override {}
  void save(const SaveValue&, const std::string&, bool) override {}
  bool running() const override { return false; }
  std::int64_t current_step() const override { return monitor_.current_step(); }
  const Config& config() const override { return monitor_.config(); }
  // One torch::nn model, as msprobe's monitor(model).
  void monitor_model(const ModelRef& model) override {
    if (model.nn.size() == 1 && model.jit.empty())
      monitor_.monitor(*model.nn.front());
    else
      io::tell_user("grad_probe's monitor() takes one torch::nn model; nothing is monitored");
  }

 private:
  GradMonitor monitor_;
};

}  // namespace details

template <class Tasks>
class BasicPrecisionDebugger final : public DebuggerInterface {
 public:
  explicit BasicPrecisionDebugger(const std::string& config_path, Options overrides = Options())
      : BasicPrecisionDebugger(overrides.config_file(config_path)) {}
  explicit BasicPrecisionDebugger(const Options& options)
      : options_(options),
        grad_probe_(is_grad_probe(options)),
        impl_(grad_probe_ ? make_grad(options) : make(options)) {
    if (!grad_probe_ && impl_->config().dump_enable && options.config_path()) watch_.emplace(*options.config_path());
  }

  // start(...) in all its forms is DebuggerInterface's, each a start_with().
  void start_with(const ModelRef& model, std::optional<std::int64_t> rank_id,
                  std::optional<TokenRange> tokens = std::nullopt) override {
    if (tokens && !grad_probe_) check_token_range(*tokens, model);  // also when dump_enable is false
    model_ = model;
    rank_id_ = rank_id;
    tokens_ = tokens;
    if (impl_->config().dump_enable.value_or(true)) impl_->start_with(model, rank_id, tokens);
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
  // The configuration is checked against the list first: a (task, level) pair it lacks is a
  // ConfigError that names what the list has.
  static std::unique_ptr<DebuggerInterface> make(const Options& options) {
    const Config c = options.resolve(std::nullopt, std::nullopt, &Tasks::catalog());
    std::unique_ptr<DebuggerInterface> made;
    Tasks::visit(c.task, [&](auto tag) { made = make_at_level<typename decltype(tag)::type>(c.level, options); });
    return made;
  }

  // The debugger of each level the task supports (kLevels, core/kinds.hpp), chosen at run time.
  template <class TaskT, std::size_t... I>
  static std::unique_ptr<DebuggerInterface> make_at_level(Level level, const Options& options,
                                                          std::index_sequence<I...> = {}) {
    if constexpr (sizeof...(I) == 0) {
      return make_at_level<TaskT>(level, options, std::make_index_sequence<std::size(kLevels)>{});
    } else {
      std::unique_ptr<DebuggerInterface> made;
      auto one = [&](auto constant) {
        constexpr Level l = decltype(constant)::value;
        if constexpr (TaskT::levels.contains(l))
          if (level == l) made = std::make_unique<BasicDebugger<l, TaskT>>(options);
      };
      (one(std::integral_constant<Level, kLevels[I]>{}), ...);
      return made;
    }
  }

  // dump_enable: the edited file replaces the debugger between two steps; the step number goes on,
  // and a running capture goes on under the new configuration.
  void reload() {
    std::unique_ptr<DebuggerInterface> next;
    try {
      next = make(options_);
    } catch (const std::exception& e) {
      std::cerr << "[torchprobe] dump_enable: " << watch_->path() << " was changed but cannot be used (" << e.what()
                << "); the configuration in use is kept\n";
      io::ErrorLog(impl_->config().dump_path).log("config_reload", watch_->path(), e);
      return;
    }
    const bool was_running = impl_->running();
    impl_->stop();
    impl_->wait_written();
    next->set_init_step(impl_->current_step());
    impl_ = std::move(next);
    if (was_running) start_with(model_, rank_id_, tokens_);
  }

  // grad_probe watches gradients, not calls: it is no task of the list, and a task of the list (a
  // user's own) is no name resolve() knows without the list.
  static bool is_grad_probe(const Options& options) {
    return options.named_task() == nlohmann::json(std::string(task_name(Task::GradProbe)));
  }
  static std::unique_ptr<DebuggerInterface> make_grad(const Options& options) {
    return std::make_unique<details::GradProbeDebugger>(options.resolve());
  }

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

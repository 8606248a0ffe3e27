#pragma once
// PrecisionDebugger's implementation: the debugger of each task and level its list has, chosen at
// run time from the configuration. A file that uses the compiled library never includes it for
// the built-in list (torchprobe/compiled.hpp); torchprobe.hpp includes it header-only.
#include <cstddef>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "torchprobe/debugger_impl.hpp"
#include "torchprobe/io/error_log.hpp"
#include "torchprobe/precision_debugger.hpp"
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

// The debugger of each level the task supports (kLevels, core/kinds.hpp), chosen at run time.
template <class TaskT, std::size_t... I>
std::unique_ptr<DebuggerInterface> make_at_level(Level level, const Options& options, std::index_sequence<I...> = {}) {
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

// grad_probe watches gradients, not calls: it is no task of the list, and a task of the list (a
// user's own) is no name resolve() knows without the list.
inline bool is_grad_probe(const Options& options) {
  return options.named_task() == nlohmann::json(std::string(task_name(Task::GradProbe)));
}

}  // namespace details

template <class Tasks>
BasicPrecisionDebugger<Tasks>::BasicPrecisionDebugger(const Options& options)
    : options_(options),
      grad_probe_(details::is_grad_probe(options)),
      impl_(grad_probe_ ? std::make_unique<details::GradProbeDebugger>(options.resolve()) : make(options)) {
  if (!grad_probe_ && impl_->config().dump_enable && options.config_path()) watch_.emplace(*options.config_path());
  details::claim_process_debugger(this);
}

// The configuration is checked against the list first: a (task, level) pair it lacks is a
// ConfigError that names what the list has.
template <class Tasks>
std::unique_ptr<DebuggerInterface> BasicPrecisionDebugger<Tasks>::make(const Options& options) {
  const Config c = options.resolve(std::nullopt, std::nullopt, &Tasks::catalog());
  std::unique_ptr<DebuggerInterface> made;
  Tasks::visit(c.task,
               [&](auto tag) { made = details::make_at_level<typename decltype(tag)::type>(c.level, options); });
  return made;
}

// The step number goes on, and a running capture goes on under the new configuration.
template <class Tasks>
void BasicPrecisionDebugger<Tasks>::reload() {
  std::unique_ptr<DebuggerInterface> next;
  try {
    next = make(options_);
    // A running capture goes on under the new level: L0 and mix need a model (start(model)).
    if (impl_->running()) (void)model_for_start(next->config().level, model_, model_);
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

}  // namespace torchprobe

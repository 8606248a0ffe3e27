#pragma once
// The Debugger's implementation: details::DebuggerImpl<Level, Task, Sink> composes the capture (the
// level), the task and the sink, and BasicDebugger's members that need it are defined here. A file
// that uses the compiled library never includes this header for the built-in debuggers
// (torchprobe/compiled.hpp); a Debugger with a task or sink of your own needs it (torchprobe.hpp
// includes it when TORCHPROBE_COMPILED_LIB is not defined).
//
// Not started, it registers nothing and costs nothing. start() registers the capture; stop()
// removes it and hands the step's files to the writer's thread (DirectorySink: they are written
// in the background; wait_written() waits for them); step() moves to the next step{N}/ directory.
// The destructor writes everything still pending.
// While a step runs, every kept entry is also appended to the step's journal, so a process killed
// mid-step leaves records that tools/recover_dump.py turns into dump.json.
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "torchprobe/capture/api_observer.hpp"
#include "torchprobe/capture/call_capture.hpp"
#include "torchprobe/capture/model_ref.hpp"
#include "torchprobe/capture/save_capture.hpp"
#include "torchprobe/capture/token_window.hpp"
#include "torchprobe/capture/torchscript.hpp"
#include "torchprobe/config/options.hpp"
#include "torchprobe/core/save_value.hpp"
#include "torchprobe/debugger.hpp"
#include "torchprobe/debugger_interface.hpp"
#include "torchprobe/details/recorder.hpp"
#include "torchprobe/details/step_lifecycle.hpp"
#include "torchprobe/io/console.hpp"
#include "torchprobe/level/level.hpp"
#include "torchprobe/seed.hpp"
#include "torchprobe/sink/directory_sink.hpp"
#include "torchprobe/sink/sink_traits.hpp"
#include "torchprobe/task/registry.hpp"
#include "torchprobe/task/task_list.hpp"

namespace torchprobe {

namespace details {

template <Level L, class TaskT, class Sink>
class DebuggerImpl final : public DebuggerInterface {
  static_assert(check_task<TaskT>(), "torchprobe: the task keeps the task contract (task/task_traits.hpp)");
  static_assert(TaskT::levels.contains(L),
                "torchprobe: this task does not support this level (see the task's `levels`)");
  static_assert(check_sink<Sink>(), "torchprobe: the sink keeps the sink contract (sink/sink_traits.hpp)");
  using Core = details::Recorder<TaskT>;
  using Capture = capture::CallCapture<TaskT, L>;

 public:
  explicit DebuggerImpl(const Options& options) : core_(make_core(options)), step_(core_) { init(); }
  DebuggerImpl(const Options& options, Sink sink) : core_(make_core(options)), step_(core_, std::move(sink)) { init(); }
  DebuggerImpl(const DebuggerImpl&) = delete;
  DebuggerImpl& operator=(const DebuggerImpl&) = delete;

  // Writes what the step has, and every step still pending; the journal goes once the files are
  // written. A Debugger with static storage duration does this at exit; a process that ends
  // with std::exit() or std::quick_exit() while a Debugger on the stack is alive does not (its
  // steps not yet written keep their journals, which tools/recover_dump.py turns into files).
  ~DebuggerImpl() override {
    step_.stop_listening_for_end();  // what is left is written below, on this thread
    stop();
    core_->close();  // a backward still running (a retained graph) records nothing from here on
    if (has_unwritten()) flush();
    step_.end_step();
    step_.drain();
  }

  // start(), start(model), start(model, rank), start(model, tokens), start(model, pg):
  // DebuggerInterface's, each a start_with().
  void start_with(const ModelRef& given, std::optional<std::int64_t> rank_id,
                  std::optional<TokenRange> tokens = std::nullopt) override {
    if (tokens) check_token_range(*tokens, given.empty() ? model_ : given);
    if (running_ || !step_.may_start()) return;
    const ModelRef model = model_for_start(L, given, model_);  // L0/mix: an earlier start()'s, else throws
    rank_id_ = rank_id;
    model_ = model;
    tokens_ = tokens;
    if (!step_.open_if_dumped(rank_id)) return;  // an unwritable dump_path throws here, naming it
    tell_where_once();
    if constexpr (!LevelTraits<L>::save_only) {
      if (!capture_) capture_ = std::make_shared<Capture>(core_);
      capture_->set_models(model);
      open_token_window(model, tokens);
      if (!model.jit.empty()) {
        if (LevelTraits<L>::captures_modules)
          for (const auto& m : model.jit) capture::instrument_script_module(m);
        script_settings_.enter();  // L1 too: an optimised graph runs its ops without autograd nodes of their own
      }
      observer_.attach(capture_, LevelTraits<L>::nested_apis);
    }
    core_->set_capturing(true);
    running_ = true;
    step_.capture_started();
  }

  void stop() noexcept override {
    if (!running_) return;
    observer_.detach();
    close_token_window();
    try {
      if (capture_) capture_->close_open_episodes();
    } catch (const std::exception& e) {
      core_->errors().log("module_forward", "stop", e);
    }
    core_->set_capturing(false);
    running_ = false;
    script_settings_.leave();
    flush();
  }

  // Writes the step, then numbers the next one; a running capture continues into the new step.
  void step() override {
    const bool was_running = running_;
    stop();
    if (has_unwritten()) flush();
    step_.end_step();
    step_.next_step();
    save_capture_.reset();
    if (capture_) capture_->on_step();
    if (was_running) start_with(model_, rank_id_, tokens_);
  }

  // msprobe's save(variable, name, save_backward): debug.json entry "{name}.{count}.debug" (and,
  // with save_backward, "{name}_grad.{count}.debug", filled when the gradients arrive); tensor files
  // with the tensor task. Only in dumped steps. A value that cannot be encoded is logged to
  // dump_error_info.log; an unwritable dump_path throws IoError, as start() does.
  void save(const SaveValue& value, const std::string& name, bool save_backward = true) override {
    if (step_.session().finished() || (!step_.is_open() && !step_.open_if_dumped(rank_id_))) return;
    tell_where_once();
    step_.saved();
    try {
      save_capture_.save(core_, value, name, save_backward);
    } catch (const std::exception& e) {
      core_->errors().log("debug_data_collect", name, e);
    }
  }

  // Returns once the files of every step handed over so far (by stop(), step(), or the task
  // ending the dump) are complete on disk, or their failure is reported. stop() and step() do not
  // wait with a sink that writes in the background (DirectorySink); read the files after this.
  void wait_written() override { step_.wait_written(); }

  void set_init_step(std::int64_t step) override { step_.session().set_init_step(step); }
  bool running() const override { return running_; }
  const Config& config() const override { return core_->config(); }
  std::int64_t current_step() const override { return step_.session().step(); }
  // {dump_path}/step{N}/{rank dir} of the last start().
  const std::string& directory() const { return step_.directory(); }
  Sink& sink() { return step_.sink(); }
  TaskT& task() { return core_->task(); }
  // The thread that writes handed-over steps (statistics; pause()/resume() for tests).
  details::StepWriter& background_writer() { return step_.writer(); }

 private:
  static std::shared_ptr<Core> make_core(const Options& options) {
    return std::make_shared<Core>(options.resolve(L, TaskName(TaskT::name), &TaskList<TaskT>::catalog()));
  }
  void init() {
    for (const std::string& w : core_->config().warnings) io::tell_user("warning: " + w);
    const Config& c = core_->config();
    if (c.seed || c.is_deterministic) seed_all(c.seed.value_or(1234), c.is_deterministic);  // as msprobe
  }

  // Did anything reach the step after stop() wrote it? save()s, gradients of saved tensors and
  // backward entries that came later (stop() before backward), or module backward entries and
  // parameter gradients still waiting for their last part.
  bool has_unwritten() { return step_.unflushed() || (capture_ && capture_->has_pending()); }

  // msprobe tells the user where dump.json is; here once per Debugger, when its first step
  // directory is made, and only for a sink that writes there (DirectorySink).
  void tell_where_once() {
    if constexpr (sink_traits::keeps_journal<Sink>::value) {
      if (told_where_) return;
      told_where_ = true;
      io::tell_user("the dump goes to " + step_.session().step_directory() + " (each step in a step{N}/ folder of " +
                    core_->config().dump_path + ")");
    }
  }

  void flush() noexcept {
    step_.flush([this] {
      if (capture_) capture_->release_pending();
    });
  }

  // The token window of start(model, token_range): a TorchScript root's forwards are counted from
  // libtorch's records, a torch::nn root's by its ModuleGuard (through the capture).
  void open_token_window(const ModelRef& model, const std::optional<TokenRange>& tokens) {
    window_.reset();
    if (tokens) {
      if (model.size() > 1)
        io::tell_user("warning: token_range counts the forward calls of the first model of the list only");
      const void* root = !model.nn.empty() ? static_cast<const void*>(model.nn.front().get())
                                           : static_cast<const void*>(model.jit.front()._ivalue().get());
      window_ = std::make_shared<capture::TokenWindow>(*tokens, root);
      if (model.nn.empty()) script_forwards_.attach(window_);
    }
    capture_->set_token_window(window_);
  }

  // A window that never opened is reported: the range lies past the forwards that ran, or (no
  // forward at all) the root of a torch::nn model has no ModuleGuard to show its forwards.
  void close_token_window() noexcept {
    script_forwards_.detach();
    if (!window_ || window_->forwards() > window_->range().start || !window_->saw_calls()) return;
    try {
      const TokenRange& r = window_->range();
      std::string why = "token_range {" + std::to_string(r.start) + ", " + std::to_string(r.end) +
                        "} recorded nothing: " + std::to_string(window_->forwards()) +
                        " forward call(s) of the model were seen since start()";
      if (window_->forwards() == 0 && !model_.nn.empty())
        why +=
            "; torch::nn modules have no forward hooks, so the model's forward needs a "
            "torchprobe::ModuleGuard (`ModuleGuard guard(this, x);` in it, or around each call)";
      io::tell_user(why);
      core_->errors().log("token_range", "start", "token_range", why);
    } catch (...) {
    }
  }

  std::shared_ptr<Core> core_;
  details::StepLifecycle<L, TaskT, Sink> step_;
  capture::ApiObserver observer_;
  std::shared_ptr<Capture> capture_;
  capture::ScriptExecutorSettings script_settings_;
  std::shared_ptr<capture::TokenWindow> window_;  // start(model, token_range)'s, else null
  capture::ScriptForwardObserver script_forwards_;
  capture::SaveCapture<TaskT> save_capture_;
  ModelRef model_;
  std::optional<std::int64_t> rank_id_;
  std::optional<TokenRange> tokens_;
  bool running_ = false;
  bool told_where_ = false;
};

}  // namespace details

// ---- BasicDebugger's members that need the implementation ----------------------------------------

template <Level L, class TaskT, class Sink>
BasicDebugger<L, TaskT, Sink>::BasicDebugger(const Options& options)
    : impl_(std::make_unique<details::DebuggerImpl<L, TaskT, Sink>>(options)) {}
template <Level L, class TaskT, class Sink>
BasicDebugger<L, TaskT, Sink>::BasicDebugger(const Options& options, Sink sink)
    : impl_(std::make_unique<details::DebuggerImpl<L, TaskT, Sink>>(options, std::move(sink))) {}
template <Level L, class TaskT, class Sink>
const std::string& BasicDebugger<L, TaskT, Sink>::directory() const {
  return impl().directory();
}
template <Level L, class TaskT, class Sink>
Sink& BasicDebugger<L, TaskT, Sink>::sink() {
  return impl().sink();
}
template <Level L, class TaskT, class Sink>
TaskT& BasicDebugger<L, TaskT, Sink>::task() {
  return impl().task();
}
template <Level L, class TaskT, class Sink>
details::StepWriter& BasicDebugger<L, TaskT, Sink>::background_writer() {
  return impl().background_writer();
}
template <Level L, class TaskT, class Sink>
details::DebuggerImpl<L, TaskT, Sink>& BasicDebugger<L, TaskT, Sink>::impl() const {
  return static_cast<details::DebuggerImpl<L, TaskT, Sink>&>(*impl_);
}

}  // namespace torchprobe

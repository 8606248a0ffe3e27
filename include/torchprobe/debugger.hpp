#pragma once
// Debugger<Level, Task, Sink>: what is captured (the level), what each tensor becomes (the task)
// and where a step goes (the sink), composed at compile time.
//
// This header is the Debugger's face only: it says what a Debugger does and holds its
// implementation (debugger_impl.hpp) behind a pointer, so that a file using it needs neither the
// capture's nor the tasks' code. With the compiled library (torchprobe::compiled, which defines
// TORCHPROBE_COMPILED_LIB), the built-in debuggers are compiled once there (torchprobe/compiled.hpp);
// header-only, torchprobe.hpp includes the implementation.
//
// Not started, it registers nothing and costs nothing. start() registers the capture; stop()
// removes it and hands the step's files to the writer's thread (DirectorySink: they are written
// in the background; wait_written() waits for them); step() moves to the next step{N}/ directory.
// The destructor writes everything still pending.
// save(value, name) is msprobe's single-point save (debug.json); it needs no start().
// start(model, TokenRange{a, b}) records only the model's forward calls a..b (capture/token_window.hpp).
// While a step runs, every kept entry is also appended to the step's journal, so a process killed
// mid-step leaves records that tools/recover_dump.py turns into dump.json.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "torchprobe/config/options.hpp"
#include "torchprobe/core/kinds.hpp"
#include "torchprobe/debugger_interface.hpp"
#include "torchprobe/task/builtin.hpp"

namespace torchprobe {

class DirectorySink;

namespace details {
class StepWriter;
template <Level L, class TaskT, class Sink>
class DebuggerImpl;
}  // namespace details

// The Debugger of one task class: Debugger<L, Task::X> names a built-in one; a task of your own
// (task/task_traits.hpp says what it declares) runs as BasicDebugger<L, YourTask>.
template <Level L, class TaskT, class Sink = DirectorySink>
class BasicDebugger final : public DebuggerInterface {
 public:
  explicit BasicDebugger(const Options& options = Options());
  // With a sink of your own making (one that holds a path, a callback, a connection): it is moved in.
  BasicDebugger(const Options& options, Sink sink);
  // A msprobe config.json; Options(...).config_file(path) also takes overrides.
  explicit BasicDebugger(const std::string& config_path) : BasicDebugger(Options().config_file(config_path)) {}
  explicit BasicDebugger(const char* config_path) : BasicDebugger(std::string(config_path)) {}
  BasicDebugger(const BasicDebugger&) = delete;
  BasicDebugger& operator=(const BasicDebugger&) = delete;
  // Writes what the step has, and every step still pending; the journal goes once the files are
  // written. A Debugger with static storage duration does this at exit; a process that ends
  // with std::exit() or std::quick_exit() while a Debugger on the stack is alive does not (its
  // steps not yet written keep their journals, which tools/recover_dump.py turns into files).
  ~BasicDebugger() override = default;

  // start(), start(model), start(model, rank), start(model, tokens), start(model, pg):
  // DebuggerInterface's, each a start_with().
  void start_with(const ModelRef& model, std::optional<std::int64_t> rank_id,
                  std::optional<TokenRange> tokens = std::nullopt) override {
    impl_->start_with(model, rank_id, tokens);
  }
  void stop() noexcept override { impl_->stop(); }
  // Writes the step, then numbers the next one; a running capture continues into the new step.
  void step() override { impl_->step(); }
  // msprobe's save(variable, name, save_backward): debug.json entry "{name}.{count}.debug" (and,
  // with save_backward, "{name}_grad.{count}.debug", filled when the gradients arrive); tensor files
  // with the tensor task. Only in dumped steps. A value that cannot be encoded is logged to
  // dump_error_info.log; an unwritable dump_path throws IoError, as start() does.
  void save(const SaveValue& value, const std::string& name, bool save_backward = true) override {
    impl_->save(value, name, save_backward);
  }
  // Returns once the files of every step handed over so far (by stop(), step(), or the task
  // ending the dump) are complete on disk, or their failure is reported. stop() and step() do not
  // wait with a sink that writes in the background (DirectorySink); read the files after this.
  void wait_written() override { impl_->wait_written(); }
  void set_init_step(std::int64_t step) override { impl_->set_init_step(step); }
  bool running() const override { return impl_->running(); }
  const Config& config() const override { return impl_->config(); }
  std::int64_t current_step() const override { return impl_->current_step(); }

  // {dump_path}/step{N}/{rank dir} of the last start().
  const std::string& directory() const;
  Sink& sink();
  TaskT& task();
  // The thread that writes handed-over steps (statistics; pause()/resume() for tests).
  details::StepWriter& background_writer();

 private:
  details::DebuggerImpl<L, TaskT, Sink>& impl() const;
  std::unique_ptr<DebuggerInterface> impl_;  // a details::DebuggerImpl<L, TaskT, Sink>
};

// Debugger<Level::Mix, Task::Statistics>: a built-in task (task/builtin.hpp) by its name.
template <Level L, Task T, class Sink = DirectorySink>
using Debugger = BasicDebugger<L, typename builtin_task<T>::type, Sink>;

}  // namespace torchprobe

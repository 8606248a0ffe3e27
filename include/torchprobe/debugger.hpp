#pragma once
// Debugger<Level, Task, Sink>: the composition of the three policies.
//
//   Level  which calls are captured (capture/: the ATen observer for APIs)
//   Task   what is written for each tensor (task/: statistics, ...)
//   Sink   where a flushed step goes (sink/: msprobe's directory layout, memory, nowhere)
//
// Not started, it registers nothing and costs nothing. start() registers the capture; stop()
// removes it and writes the step's files; step() moves to the next step{N}/ directory.
//
// save(value, name) is msprobe's single-point save: it writes debug.json entries whatever the level
// (beside dump.json; Level::Debug, msprobe's level "debug", captures nothing else and writes only
// debug.json). It needs no start(): the first save() of a dumped step opens the step's directory.
//
// While a step runs, every kept entry is also appended to the step's journal (io/journal.hpp), so
// a process killed mid-step leaves records that tools/recover_dump.py turns into dump.json.
#include <cerrno>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "torchprobe/capture/api_observer.hpp"
#include "torchprobe/capture/call_capture.hpp"
#include "torchprobe/capture/model_ref.hpp"
#include "torchprobe/capture/torchscript.hpp"
#include "torchprobe/config/options.hpp"
#include "torchprobe/core/names.hpp"
#include "torchprobe/debugger_interface.hpp"
#include "torchprobe/details/debug_save.hpp"
#include "torchprobe/details/dump_core.hpp"
#include "torchprobe/details/session.hpp"
#include "torchprobe/level/level.hpp"
#include "torchprobe/save_value.hpp"
#include "torchprobe/sink/directory_sink.hpp"
#include "torchprobe/task/task_policy.hpp"
#include "torchprobe/task/tensor_saver.hpp"

namespace torchprobe {

template <Level L, Task T, class Sink = DirectorySink>
class Debugger final : public DebuggerInterface {
  static_assert(L != Level::L2, "torchprobe: Level::L2 (every nested ATen op) is not available yet");
  using TaskT = typename TaskPolicy<T>::type;
  using Core = details::DumpCore<TaskT>;
  using Capture = capture::CallCapture<TaskT, L>;
  static constexpr bool kSaveOnly = LevelTraits<L>::save_only;

 public:
  explicit Debugger(const Options& options = Options())
      : core_(std::make_shared<Core>(options.resolve(L, T))), session_(core_->config) {
    for (const std::string& w : core_->config.warnings) std::cerr << "torchprobe: warning: " << w << "\n";
    if constexpr (details::task_can_end<TaskT>::value) core_->set_end_hook([this] { end_now(); });
  }
  // A msprobe config.json; Options(...).config_file(path) also takes overrides.
  explicit Debugger(const std::string& config_path) : Debugger(Options().config_file(config_path)) {}
  explicit Debugger(const char* config_path) : Debugger(std::string(config_path)) {}

  Debugger(const Debugger&) = delete;
  Debugger& operator=(const Debugger&) = delete;
  // Writes what the step has (tensor files first, then the JSON files); the journal goes once they are written.
  ~Debugger() override {
    core_->set_end_hook(nullptr);  // an entry committed from now on must not reach this object
    stop();
    if (saves_unflushed()) flush();
    end_step();
  }

  void start() { start_with(ModelRef{}, std::nullopt); }
  template <class Model, class = std::enable_if_t<!std::is_arithmetic_v<std::decay_t<Model>>>>
  void start(const Model& model, std::optional<std::int64_t> rank_id = std::nullopt) {
    start_with(to_model_ref(model), rank_id);
  }

  void start_with(const ModelRef& model, std::optional<std::int64_t> rank_id) override {
    if (running_) return;
    if constexpr (details::task_can_end<TaskT>::value) {
      if (core_->ended()) {  // overflow_check reached overflow_nums: nothing more is dumped
        if (!told_ended_) std::cerr << "torchprobe: " << core_->task.end_reason() << "\n";
        told_ended_ = true;
        return;
      }
    }
    if (session_.finished()) {
      if (!told_finished_) std::cerr << "torchprobe: the last configured step has passed; nothing more is dumped\n";
      told_finished_ = true;
      return;
    }
    session_.resolve_rank(rank_id);
    rank_id_ = rank_id;
    model_ = model;
    if (!session_.dumps_now()) return;
    open_step();  // an unwritable dump_path is reported here, with the path and the reason
    if constexpr (kSaveOnly) {
      core_->capturing = true;
      running_ = true;
      step_has_data_ = true;
      return;
    }
    if (!capture_) capture_ = std::make_shared<Capture>(core_);
    capture_->set_models(model);
    if (!model.jit.empty()) {
      if (LevelTraits<L>::captures_modules)
        for (const auto& m : model.jit) capture::instrument_script_module(m);
      script_settings_.enter();  // L1 too: an optimised graph runs its ops without autograd nodes of their own
    }
    observer_.attach(capture_);
    core_->capturing = true;
    running_ = true;
    step_has_data_ = true;
    started_in_step_ = true;
  }

  void stop() noexcept override {
    if (!running_) return;
    observer_.detach();
    try {
      if (capture_) capture_->close_open_episodes();
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
    if (saves_unflushed()) flush();  // save()s, or gradients of saved tensors, since
    end_step();
    session_.advance();
    core_->generation.fetch_add(1);
    core_->state.reset();
    core_->debug_state.reset();
    core_->errors.reset();
    debug_saver_.reset();
    if (capture_) capture_->on_step();
    step_has_data_ = false;
    started_in_step_ = false;
    if (was_running) start_with(model_, rank_id_);
  }

  // msprobe's save(variable, name, save_backward): debug.json entry "{name}.{count}.debug" (and,
  // with save_backward, "{name}_grad.{count}.debug", filled when the gradients arrive); tensor files
  // with the tensor task. Only in dumped steps (step/rank); scope, list and data_mode do not apply.
  // A failure to encode the value is logged to dump_error_info.log; an unwritable dump_path throws
  // IoError, as start() does.
  void save(const SaveValue& value, const std::string& name, bool save_backward = true) override {
    if (session_.finished()) return;
    if (!step_open_) {
      session_.resolve_rank(rank_id_);
      if (!session_.dumps_now()) return;
      open_step();
    }
    step_has_data_ = true;
    try {
      debug_saver_.save(core_, value, name, save_backward);
    } catch (const std::exception& e) {
      core_->errors.log("debug_data_collect", name, e);
    }
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
  // The step's directory (and dump_tensor_data/, and the journal) exist from the first start()
  // or save() of a dumped step. Throws IoError when the dump path cannot be written.
  void open_step() {
    const std::string directory = session_.step_directory();
    if (step_open_ && directory == directory_) return;
    directory_ = directory;
    sink_.open(directory_);
    if (saves_tensors(core_->config)) {
      const std::string tensors = tensor_data_directory(directory_);
      try {
        io::create_directories(tensors);
      } catch (const io::IoError& e) {
        throw io::IoError("create the tensor directory", tensors, e.error_code());
      }
    }
    core_->errors.set_directory(directory_);
    core_->set_step_directory(directory_);
    if constexpr (sink_keeps_journal<Sink>::value) {
      // The journal is a safety net: a full disk costs the step its recovery, not its dump (nor
      // the training). Other errors (EACCES, EROFS) mean an unwritable dump_path and are thrown.
      try {
        core_->journal.open(directory_ + "/" + io::Journal::kFileName, journal_header());
      } catch (const io::IoError& e) {
        if (e.error_code() != ENOSPC && e.error_code() != EDQUOT) throw;
        core_->errors.log("write_journal", directory_, e);
      }
    }
    step_open_ = true;
  }

  nlohmann::ordered_json dump_data_dir() const {
    if (!saves_tensors(core_->config)) return nullptr;
    return tensor_data_directory(directory_);
  }

  std::string journal_header() const {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    h["journal"] = 1;
    h["task"] = std::string(task_name(T));
    h["level"] = std::string(level_name(L));
    h["framework"] = "pytorch";
    h["dump_data_dir"] = dump_data_dir();
    h["writes_dump"] = !kSaveOnly;
    h["extra_info"] = core_->config.extra_info;
    h["step"] = session_.step();
    return io::to_python_json(h, -1);
  }

  // save() entries (or gradients of saved tensors) committed since the last flush.
  bool saves_unflushed() const { return core_->debug_commits.load() != flushed_debug_commits_; }

  // Tensor files first (dump.json must not name a file that is not there yet), then the JSON files.
  void flush() noexcept {
    flushed_debug_commits_ = core_->debug_commits.load();
    if (!step_has_data_) return;
    last_flush_ok_ = false;
    // The journal catches up first: recovery rebuilds dump.json from it, so it must never hold
    // less than a dump.json already written.
    core_->journal.drain();
    try {
      if (capture_) capture_->release_pending();
      core_->decide_held();
      core_->flush_tensor_files();
      StepDump d = step_dump_header();
      if (!kSaveOnly && started_in_step_) write_dump(d);  // a step with save() calls only has no dump.json
      if constexpr (sink_writes_debug<Sink>::value) {
        if (core_->debug_state.size() > 0) {
          core_->debug_state.with_records([&](const std::vector<Record>& records) {
            d.level = std::string(level_name(Level::Debug));
            d.records = &records;
            sink_.write_debug(d);
          });
        }
      }
      last_flush_ok_ = true;
    } catch (const std::exception& e) {
      // Never let a full disk or a vanished directory stop training: report and go on.
      core_->errors.log("write_json", directory_, e);
      std::cerr << "torchprobe: could not write the dump of step " << session_.step() << ": " << e.what() << "\n";
    }
    core_->errors.retry();  // entries a full disk kept out of dump_error_info.log earlier
  }

  StepDump step_dump_header() const {
    StepDump d;
    d.task = std::string(task_name(T));
    d.directory = directory_;
    d.step = session_.step();
    d.extra_info = core_->config.extra_info;
    d.dump_data_dir = dump_data_dir();
    return d;
  }

  // dump.json, stack.json and construct.json, and the files the task adds (overflow_summary.json).
  void write_dump(StepDump& d) {
    core_->state.with_records([&](const std::vector<Record>& records) {
      d.level = std::string(level_name(L));
      d.records = &records;
      if constexpr (details::task_adds_files<TaskT>::value) d.task_files = core_->task.step_files(records, d.step);
      sink_.write_step(d);
    });
  }

  // The task ended the dump (overflow_check after overflow_nums overflowing calls). Runs on the
  // thread that committed the last entry: capture stops and the files are written now, as msprobe
  // does, not at the next stop() (the run may well crash on the NaN it just met).
  void end_now() noexcept {
    observer_.detach();
    core_->journal.drain();
    try {
      core_->flush_tensor_files();
      StepDump d = step_dump_header();
      write_dump(d);
    } catch (const std::exception& e) {
      core_->errors.log("write_json", directory_, e);
      std::cerr << "torchprobe: could not write the dump of step " << session_.step() << ": " << e.what() << "\n";
    }
  }

  // The step is over: its journal goes once its files are written (a failed write keeps it, for
  // tools/recover_dump.py).
  void end_step() noexcept {
    if (last_flush_ok_) core_->journal.remove();
    else core_->journal.close();
    step_open_ = false;
    last_flush_ok_ = false;
  }

  std::shared_ptr<Core> core_;
  details::Session session_;
  Sink sink_;
  capture::ApiObserver observer_;
  std::shared_ptr<Capture> capture_;
  capture::ScriptExecutorSettings script_settings_;
  details::DebugSaver<TaskT> debug_saver_;
  ModelRef model_;
  std::optional<std::int64_t> rank_id_;
  std::string directory_;
  bool running_ = false;
  bool step_has_data_ = false;
  bool step_open_ = false;      // this step's directory (and journal) are open
  bool started_in_step_ = false;  // capture ran in this step: it has a dump.json
  std::uint64_t flushed_debug_commits_ = 0;  // DumpCore::debug_commits at the last flush
  bool last_flush_ok_ = false;  // the step's files were written by the last flush
  bool told_finished_ = false;
  bool told_ended_ = false;
};

}  // namespace torchprobe

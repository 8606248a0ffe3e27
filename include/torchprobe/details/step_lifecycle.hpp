#pragma once
// One dumped step from its first start() or save() to its end: the step directory (made when the
// step opens), its journal, and writing its files. Owned by the Debugger, used from the training
// thread; an entry committed on another thread reaches it only through Recorder.
//
//   open()       the step's directory, dump_tensor_data/ and the journal exist from here on
//   flush()      tensor files first (dump.json must not name a file that is not there yet), then
//                the JSON files; the journal is drained before, so it never holds less than them
//   end_step()   the journal goes once the files are written (a failed write keeps it, for
//                tools/recover_dump.py)
//   next_step()  numbers the next step and starts it empty
#include <cerrno>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchprobe/core/kinds.hpp"
#include "torchprobe/core/names.hpp"
#include "torchprobe/core/record.hpp"
#include "torchprobe/details/recorder.hpp"
#include "torchprobe/details/session.hpp"
#include "torchprobe/io/console.hpp"
#include "torchprobe/io/journal.hpp"
#include "torchprobe/io/python_json.hpp"
#include "torchprobe/sink/step_dump.hpp"

namespace torchprobe::details {

template <Level L, class TaskT, class Sink>
class StepLifecycle {
  static constexpr bool kSaveOnly = (L == Level::Debug);  // level debug writes debug.json only

 public:
  explicit StepLifecycle(std::shared_ptr<Recorder<TaskT>> core) : core_(std::move(core)), session_(core_->config()) {}

  Session& session() { return session_; }
  const Session& session() const { return session_; }
  Sink& sink() { return sink_; }
  const std::string& directory() const { return directory_; }
  bool is_open() const { return open_; }

  // Past the last configured step, or after the task ended the dump, nothing more is captured;
  // the user hears why once.
  bool may_start() {
    std::string why;
    if constexpr (task_can_end<TaskT>::value) {
      if (core_->ended()) why = core_->task().end_reason();  // overflow_check reached overflow_nums
    }
    if (why.empty() && session_.finished()) why = "the last configured step has passed; nothing more is dumped";
    if (why.empty()) return true;
    if (!told_why_not_) io::tell_user(why);
    told_why_not_ = true;
    return false;
  }

  // Opens the step when this step, on this rank, is dumped; false when it is not.
  bool open_if_dumped(std::optional<std::int64_t> rank_id) {
    session_.resolve_rank(rank_id);
    if (!session_.dumps_now()) return false;
    open();
    return true;
  }

  // The step's directory (and dump_tensor_data/, and the journal) exist from the first start() or
  // save() of a dumped step. Throws IoError when the dump path cannot be written.
  void open() {
    const std::string directory = session_.step_directory();
    if (open_ && directory == directory_) return;
    directory_ = directory;
    sink_.open(directory_, TaskT::saves_tensors(core_->config()));
    core_->errors().set_directory(directory_);
    core_->set_step_directory(directory_);
    if constexpr (sink_keeps_journal<Sink>::value) {
      // The journal is a safety net: a full disk costs the step its recovery, not its dump (nor
      // the training). Other errors (EACCES, EROFS) mean an unwritable dump_path and are thrown.
      try {
        core_->journal().open(directory_ + "/" + io::Journal::kFileName, journal_header());
      } catch (const io::IoError& e) {
        if (e.error_code() != ENOSPC && e.error_code() != EDQUOT) throw;
        core_->errors().log("write_journal", directory_, e);
      }
    }
    open_ = true;
  }

  // The step has something to write: a capture ran in it (and it gets a dump.json) or save() did.
  void capture_started() {
    has_data_ = true;
    captured_ = !kSaveOnly;
  }
  void saved() { has_data_ = true; }

  // save() entries (or gradients of saved tensors) committed since the last flush.
  bool saves_unflushed() const { return core_->debug_commits() != flushed_debug_commits_; }

  // Writes what the step has. `release` runs first, inside the error handling: the capture hands
  // over what it still holds. Never throws: a full disk or a vanished directory must not stop
  // training; it is reported and the step's journal is kept.
  template <class Release>
  void flush(Release&& release) noexcept {
    flushed_debug_commits_ = core_->debug_commits();
    if (!has_data_) return;
    written_ = false;
    core_->journal().drain();
    written_ = write([&](StepDump& d) {
      release();
      core_->decide_held();
      core_->flush_tensor_files();
      if (captured_) write_dump(d);  // a step with save() calls only has no dump.json
      if constexpr (sink_writes_debug<Sink>::value) {
        if (core_->debug_entries().size() > 0) {
          core_->debug_entries().with_records([&](const std::vector<Record>& records) {
            d.level = std::string(level_name(Level::Debug));
            d.records = in_order(records);
            sink_.write_debug(d);
          });
        }
      }
    });
    core_->errors().retry();  // entries a full disk kept out of dump_error_info.log earlier
  }

  // The task ended the dump (overflow_check after overflow_nums overflowing calls): the files are
  // written now, on the thread that committed the last entry, as msprobe does, not at the next
  // stop() (the run may well crash on the NaN it just met).
  void write_now() noexcept {
    core_->journal().drain();
    write([&](StepDump& d) {
      core_->flush_tensor_files();
      write_dump(d);
    });
  }

  void end_step() noexcept {
    if (written_)
      core_->journal().remove();
    else
      core_->journal().close();
    open_ = false;
    written_ = false;
  }

  // After end_step(): the next step, empty.
  void next_step() {
    session_.advance();
    core_->start_next_step();
    has_data_ = false;
    captured_ = false;
  }

 private:
  template <class Body>
  bool write(Body&& body) noexcept {
    try {
      StepDump d;
      d.task = std::string(task_name(TaskT::kind));
      d.directory = directory_;
      d.step = session_.step();
      d.extra_info = core_->config().extra_info;
      d.dump_data_dir = dump_data_dir();
      body(d);
      return true;
    } catch (const std::exception& e) {
      core_->errors().log("write_json", directory_, e);
      io::tell_user("could not write the dump of step " + std::to_string(session_.step()) + ": " + e.what());
      return false;
    }
  }

  // dump.json, stack.json and construct.json, and the files the task adds (overflow_summary.json).
  void write_dump(StepDump& d) {
    core_->entries().with_records([&](const std::vector<Record>& records) {
      d.level = std::string(level_name(L));
      d.records = in_order(records);
      if constexpr (task_adds_files<TaskT>::value) d.task_files = core_->task().step_files(d.records, d.step);
      sink_.write_step(d);
    });
  }

  static std::vector<const Record*> in_order(const std::vector<Record>& records) {
    std::vector<const Record*> out;
    out.reserve(records.size());
    for (const Record& r : records) out.push_back(&r);
    return out;
  }

  nlohmann::ordered_json dump_data_dir() const {
    if (!TaskT::saves_tensors(core_->config())) return nullptr;
    return tensor_data_directory(directory_);
  }

  std::string journal_header() const {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    h["journal"] = 1;
    h["task"] = std::string(task_name(TaskT::kind));
    h["level"] = std::string(level_name(L));
    h["framework"] = "pytorch";
    h["dump_data_dir"] = dump_data_dir();
    h["writes_dump"] = !kSaveOnly;
    h["extra_info"] = core_->config().extra_info;
    h["step"] = session_.step();
    return io::to_python_json(h, -1);
  }

  std::shared_ptr<Recorder<TaskT>> core_;
  Session session_;
  Sink sink_;
  std::string directory_;
  bool open_ = false;                        // this step's directory (and journal) are open
  bool has_data_ = false;                    // a capture or a save() ran in this step
  bool captured_ = false;                    // a capture ran in this step: it has a dump.json
  bool written_ = false;                     // the step's files were written by the last flush
  bool told_why_not_ = false;                // may_start() said once why nothing more is dumped
  std::uint64_t flushed_debug_commits_ = 0;  // Recorder::debug_commits at the last flush
};

}  // namespace torchprobe::details

#pragma once
// One dumped step from its first start() or save() to its end: the step directory (made when the
// step opens), its journal, and writing its files. Owned by the Debugger.
//
// Threads: all on the training thread, but dump_ended() (the task ended the dump), which the
// Recorder calls on the thread that committed the last entry; opening, handing over and ending a
// step take one lock for it. Calls go one way (Debugger -> StepLifecycle -> Recorder -> DumpEnd).
//
//   open()       the step's directory, dump_tensor_data/ and the journal exist from here on
//   flush()      seals the step's records and hands them over; the writer waits for the tensor
//                files (dump.json must not name a file that is not there yet) and the journal
//                lines (it never holds less than the JSON files) handed over before, then writes
//   end_step()   the step is finished: its tensor files and every journal line, ended by the
//                trailer, are written before it returns; the journal goes once the step's files
//                are written (a failed write keeps it, for `torchprobe recover`)
//   next_step()  numbers the next step and starts it empty; wait_written(): every step is on disk
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchprobe/core/kinds.hpp"
#include "torchprobe/core/names.hpp"
#include "torchprobe/core/record.hpp"
#include "torchprobe/details/recorder.hpp"
#include "torchprobe/details/session.hpp"
#include "torchprobe/details/step_state.hpp"
#include "torchprobe/details/step_writer.hpp"
#include "torchprobe/io/console.hpp"
#include "torchprobe/io/dump_header.hpp"
#include "torchprobe/io/files.hpp"
#include "torchprobe/io/journal.hpp"
#include "torchprobe/io/python_json.hpp"
#include "torchprobe/sink/sink_traits.hpp"
#include "torchprobe/sink/step_dump.hpp"

namespace torchprobe::details {

template <Level L, class TaskT, class Sink>
class StepLifecycle final : private DumpEnd {
  static constexpr bool kSaveOnly = (L == Level::Debug);  // level debug writes debug.json only

 public:
  explicit StepLifecycle(std::shared_ptr<Recorder<TaskT>> core)
      : core_(std::move(core)), session_(core_->config()), writer_(pending_budget(*core_)) {
    listen_for_end();
  }
  StepLifecycle(std::shared_ptr<Recorder<TaskT>> core, Sink&& sink)
      : core_(std::move(core)), session_(core_->config()), sink_(std::move(sink)), writer_(pending_budget(*core_)) {
    listen_for_end();
  }
  StepLifecycle(const StepLifecycle&) = delete;
  StepLifecycle& operator=(const StepLifecycle&) = delete;
  // Every step handed over is written first (the writer, declared last, goes first).
  ~StepLifecycle() {
    stop_listening_for_end();
    drain();
  }

  // An entry that ends the dump writes nothing through this from here on (the Debugger's end).
  void stop_listening_for_end() noexcept {
    if constexpr (task_traits::can_end<TaskT>::value) core_->set_dump_end(nullptr);
  }

  Session& session() { return session_; }
  const Session& session() const { return session_; }
  Sink& sink() { return sink_; }
  const std::string& directory() const { return directory_; }
  bool is_open() const { return open_; }

  // Past the last configured step, or after the task ended the dump, nothing more is captured;
  // the user hears why once.
  bool may_start() {
    std::string why;
    if constexpr (task_traits::can_end<TaskT>::value)
      if (core_->ended()) why = core_->task().end_reason();  // overflow_check reached overflow_nums
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
    std::lock_guard<std::recursive_mutex> lock(hand_over_mu_);
    const std::string directory = session_.step_directory();
    if constexpr (task_traits::follows_steps<TaskT>::value) core_->task().set_step(session_.step());
    if (open_ && directory == directory_) return;
    // A directory dumped again (set_init_step()): its earlier write, and the removal of its journal,
    // go first.
    if constexpr (kBackground)
      if (writer_.writes_to(directory)) writer_.wait_all();
    directory_ = directory;
    written_ = std::make_shared<std::atomic<bool>>(false);
    sink_.open(directory_);
    // dump_tensor_data/ whatever the sink (the live check's: before its first file, Recorder::submit).
    if (TaskT::saves_tensors(core_->config()) && core_->config().bench_path.empty())
      io::create_directories_for("create the tensor directory", tensor_data_directory(directory_));
    core_->errors().set_directory(directory_);
    core_->set_step_directory(directory_);
    if constexpr (sink_traits::keeps_journal<Sink>::value) {
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

  void capture_started() {  // the step has something to write: a capture ran (it gets a dump.json)
    has_data_ = true;
    captured_ = !kSaveOnly;
  }
  void saved() { has_data_ = true; }

  // Entries committed since the last flush (save()s, gradients after stop()): step() writes again.
  bool unflushed() const {
    return core_->debug_commits() != flushed_debug_commits_ || core_->dump_commits() != flushed_dump_commits_;
  }

  // Hands what the step has to the writer, after `release` (what the capture still holds). Records
  // are sealed here, files written on the writer's thread (here with a foreground sink). Never
  // throws: a full disk must not stop training; it is reported and the step's journal is kept.
  template <class Release>
  void flush(Release&& release) noexcept {
    flushed_debug_commits_ = core_->debug_commits();
    flushed_dump_commits_ = core_->dump_commits();
    if (!has_data_) return;
    std::lock_guard<std::recursive_mutex> lock(hand_over_mu_);
    Job job = new_job();
    const bool prepared = prepare(job, [&] {
      release();
      core_->decide_held();
      core_->release_held_saves();                                  // async_dump
      flushed_dump_commits_ = core_->dump_commits();                // before the seal: what it holds, at least
      if (captured_) job.dump = dump_of(core_->entries(), L, job);  // a step with save() calls only has no dump.json
      if constexpr (sink_traits::writes_debug<Sink>::value)
        if (core_->debug_entries().size() > 0) job.debug = dump_of(core_->debug_entries(), Level::Debug, job);
    });
    if (prepared) hand_over(std::move(job));
  }

  // DumpEnd: the task ended the dump (overflow_check after overflow_nums overflowing calls). The
  // files are written now, on the thread that committed the last entry, as msprobe does, not at
  // the next stop() (the run may well crash on the NaN it just met). Returns once they are written.
  void dump_ended() noexcept override {
    std::lock_guard<std::recursive_mutex> lock(hand_over_mu_);
    if (!open_) return;  // the step already ended: stop() or step() wrote it
    Job job = new_job();
    if (!prepare(job, [&] {
          core_->release_held_saves();
          job.dump = dump_of(core_->entries(), L, job);
        }))
      return;
    hand_over(std::move(job));
    wait_written();
  }

  // The step's journal is removed once its last hand-over is written, kept when that failed (for
  // `torchprobe recover`); the step's records go with that job, freed on the writer's thread.
  // The step is finished when this returns (crash safety, docs/io.md): its tensor files handed over
  // are written, then its journal's trailer line is queued after its entry lines and every one of
  // them is handed to the operating system (write(2)) before this returns. A process killed from
  // here on leaves a journal that rebuilds the whole step (or the step's files themselves).
  void end_step() noexcept {
    std::lock_guard<std::recursive_mutex> lock(hand_over_mu_);
    std::shared_ptr<io::Journal::File> file;
    if constexpr (sink_traits::keeps_journal<Sink>::value) {
      try {
        if (open_) core_->flush_tensor_files();
      } catch (const std::exception& e) {
        core_->errors().log("save_tensor", directory_, e);
      }
      auto [retired, ticket] = core_->journal().finish();
      if (retired) core_->journal().wait_for(ticket);
      file = std::move(retired);
    }
    try {
      auto records = std::make_shared<std::vector<std::shared_ptr<const RecordBatch>>>(core_->entries().take_sealed());
      for (auto& batch : core_->debug_entries().take_sealed()) records->push_back(std::move(batch));
      if (file || (kBackground && !records->empty()))
        run_or_queue(
            [core = core_, file, ticket = core_->journal().ticket(), written = written_, records] {
              (void)records;  // freed with this job, on the writer's thread
              if (!file) return;
              core->journal().wait_for(ticket);
              if (written->load())
                file->remove();
              else
                file->close();
            },
            0);
    } catch (const std::exception& e) {  // no memory for the job: the journal stays, closed
      if (file) file->close();
      core_->errors().log("write_journal", directory_, e);
    }
    open_ = false;
  }

  void next_step() {  // after end_step(): the next step, empty
    std::lock_guard<std::recursive_mutex> lock(hand_over_mu_);
    session_.advance();
    core_->start_next_step();
    has_data_ = false;
    captured_ = false;
  }

  // Returns once every step handed over so far is written (at once when the sink writes in the
  // foreground).
  void wait_written() noexcept {
    if constexpr (kBackground) writer_.wait_all();
  }
  // The same, even with the writer paused (a test's pause() must not hang the destructor).
  void drain() noexcept {
    if constexpr (kBackground) {
      writer_.resume();
      writer_.wait_all();
    }
  }
  StepWriter& writer() { return writer_; }

 private:
  static constexpr bool kBackground = sink_traits::writes_in_background<Sink>::value;

  static std::size_t pending_budget(const Recorder<TaskT>& core) {
    return static_cast<std::size_t>(core.config().max_pending_mb) << 20;
  }
  void listen_for_end() {
    if constexpr (task_traits::can_end<TaskT>::value) core_->set_dump_end(this);
  }

  struct Job {  // one hand-over: what the writer's thread writes, and what it waits for first
    std::string directory;
    std::int64_t step = 0;
    std::optional<StepDump> dump;                 // dump.json, stack.json, construct.json and the task's files
    std::optional<StepDump> debug;                // debug.json
    typename Recorder<TaskT>::FilesTicket files;  // tensor files handed over before
    io::Journal::Position journal;                // the journal's lines queued before
    std::size_t bytes = 0;                        // what the sealed records take, about
    std::shared_ptr<std::atomic<bool>> written;   // the step's: did its last write succeed?
  };

  Job new_job() const { return Job{directory_, session_.step(), {}, {}, {}, {}, 0, written_}; }

  // Runs `body` (it seals the records), then takes the tickets: everything committed so far is
  // waited for. False when it failed, which is reported.
  template <class Body>
  bool prepare(Job& job, Body&& body) noexcept {
    try {
      body();
      job.files = core_->tensor_files_ticket();
      job.journal = core_->journal().position();
      for (std::optional<StepDump>* d : {&job.dump, &job.debug})  // the sink may make its files from it
        if (*d && !(*d)->lines_made_again) (*d)->journal = job.journal;
      return true;
    } catch (const std::exception& e) {
      written_->store(false);
      report(*core_, job, e);
      return false;
    }
  }

  void hand_over(Job&& job) noexcept {
    try {
      const std::size_t bytes = job.bytes;
      auto shared = std::make_shared<Job>(std::move(job));
      run_or_queue([core = core_, sink = &sink_, shared] { write(*core, *sink, *shared); }, bytes);
    } catch (const std::exception& e) {  // out of memory for the job itself
      core_->errors().log("write_json", directory_, e);
    }
  }

  void run_or_queue(std::function<void()> f, std::size_t bytes) {
    if constexpr (kBackground)
      writer_.submit(std::move(f), bytes, directory_);
    else
      f();
  }

  // On the writer's thread (or the caller's, for a foreground sink): dump.json must not name a
  // tensor file that is not there yet, nor hold more entries than the journal.
  static void write(Recorder<TaskT>& core, Sink& sink, const Job& job) noexcept {
    bool ok = true;
    try {
      Recorder<TaskT>::wait_tensor_files(job.files);
      core.journal().wait_for(job.journal.ticket);
      if (job.dump) sink.write_step(*job.dump);
      if constexpr (sink_traits::writes_debug<Sink>::value)
        if (job.debug) sink.write_debug(*job.debug);
    } catch (const std::exception& e) {
      ok = false;
      report(core, job, e);
    }
    job.written->store(ok);
    core.errors().retry();  // entries a full disk kept out of dump_error_info.log earlier
  }

  // To the step's own dump_error_info.log, whichever step is running now.
  static void report(Recorder<TaskT>& core, const Job& job, const std::exception& e) noexcept {
    core.errors().log_in(job.directory, "write_json", job.directory, e);
    try {
      io::tell_user("could not write the dump of step " + std::to_string(job.step) + ": " + e.what());
    } catch (...) {
    }
  }

  // dump.json's (or debug.json's) part of a hand-over: every record of the step so far.
  StepDump dump_of(StepState& state, Level level, Job& job) {
    StepState::Sealed sealed = state.seal();
    if constexpr (sink_traits::keeps_journal<Sink>::value)
      for (const Record* r : sealed.resolved) core_->journal_again(&state == &core_->entries() ? "dump" : "debug", *r);
    StepDump d;
    d.lines_made_again = !sealed.resolved.empty();
    d.task = std::string(TaskT::name);
    d.level = std::string(level_name(level));
    d.directory = directory_;
    d.step = session_.step();
    d.extra_info = core_->config().extra_info;
    d.rank_digest = level == L && writes_digest();
    d.dump_data_dir = dump_data_dir();
    d.records = std::move(sealed.records);
    d.owner = std::move(sealed.owner);
    if (level == L) d.files = task_files(d);
    if constexpr (sink_traits::keeps_journal<Sink>::value)
      if (!d.files.empty()) core_->journal_task_files(d.files);
    job.bytes += sealed.bytes;
    return d;
  }

  // The task's own files of the step, as text: its JSON files (step_files) first, then its text
  // files (step_text_files). Sinks and the journal see one list, whatever the task.
  std::vector<StepFile> task_files(const StepDump& d) {
    std::vector<StepFile> files;
    if constexpr (task_traits::adds_files<TaskT>::value)
      for (auto& [name, tree] : core_->task().step_files(d.records, d.step))
        files.push_back({std::move(name), io::to_python_json(tree)});
    if constexpr (task_traits::adds_text_files<TaskT>::value)
      for (auto& [name, text] : core_->task().step_text_files(d.step, session_.rank().value_or(0)))
        files.push_back({std::move(name), std::move(text)});
    return files;
  }

  // ranks_digest.bin beside a rank's dump.json (key rank_digest); a proc{pid} has no ranks to compare.
  bool writes_digest() const { return core_->config().rank_digest && session_.rank().has_value(); }
  nlohmann::ordered_json dump_data_dir() const {
    if (!TaskT::saves_tensors(core_->config())) return nullptr;
    return tensor_data_directory(directory_);
  }

  std::string journal_header() const {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    h["journal"] = 1;
    io::DumpHeader{std::string(TaskT::name), std::string(level_name(L)), dump_data_dir()}.put_into(h);
    h["writes_dump"] = !kSaveOnly;
    h["extra_info"] = core_->config().extra_info;
    if (writes_digest()) h["rank_digest"] = true;  // `torchprobe recover` writes it again
    h["step"] = session_.step();
    return io::to_python_json(h, -1);
  }

  std::shared_ptr<Recorder<TaskT>> core_;
  // Held wherever the step is opened, handed over or ended: dump_ended() may come from another
  // thread. Recursive: a flush that releases held entries may itself end the dump.
  std::recursive_mutex hand_over_mu_;
  Session session_;
  Sink sink_;
  std::string directory_;
  bool open_ = false;      // this step's directory (and journal) are open
  bool has_data_ = false;  // a capture or a save() ran in this step
  bool captured_ = false;  // a capture ran in this step: it has a dump.json
  // The step's files were written by its last hand-over (set by the writer).
  std::shared_ptr<std::atomic<bool>> written_ = std::make_shared<std::atomic<bool>>(false);
  bool told_why_not_ = false;  // may_start() said once why nothing more is dumped
  std::uint64_t flushed_debug_commits_ = 0, flushed_dump_commits_ = 0;  // Recorder's counts at the last flush
  StepWriter writer_;                                                   // last: its jobs use the members above
};

}  // namespace torchprobe::details

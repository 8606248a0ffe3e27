#pragma once
// Recorder: where finished entries are recorded, by whichever thread finishes them. Owned jointly
// by the Debugger and by every call in flight: a backward thread may still be finishing a call
// after the Debugger stopped or went away.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "torchprobe/config/types.hpp"
#include "torchprobe/core/names.hpp"
#include "torchprobe/details/block_pool.hpp"
#include "torchprobe/details/step_state.hpp"
#include "torchprobe/io/error_log.hpp"
#include "torchprobe/io/files.hpp"
#include "torchprobe/io/journal.hpp"
#include "torchprobe/io/json_text.hpp"
#include "torchprobe/io/python_json.hpp"
#include "torchprobe/io/record_text.hpp"
#include "torchprobe/io/tensor_writer.hpp"
#include "torchprobe/sink/step_dump.hpp"
#include "torchprobe/task/task_traits.hpp"

namespace torchprobe::details {

// Who writes the step when the task ends the dump (overflow_check after overflow_nums overflowing
// calls): the step lifecycle, which registers itself. Called once, on the thread that committed the
// entry that ended it, after the Recorder has stopped capturing; the Recorder calls nothing else
// upward.
class DumpEnd {
 public:
  virtual void dump_ended() noexcept = 0;

 protected:
  ~DumpEnd() = default;
};

template <class TaskT>
class Recorder {
 public:
  explicit Recorder(Config c)
      : config_(std::move(c)),
        tensor_writer_(task_traits::takes_saver<TaskT>::value
                           ? std::make_shared<io::TensorWriter>(static_cast<std::size_t>(config_.max_pending_mb) << 20)
                           : nullptr),
        task_(make_task(config_, tensor_writer_)),
        state_(config_),
        debug_state_(config_),
        errors_(std::string()) {}

  const Config& config() const { return config_; }
  TaskT& task() { return task_; }
  const TaskT& task() const { return task_; }
  StepState& entries() { return state_; }              // dump.json's entries
  StepState& debug_entries() { return debug_state_; }  // debug.json's entries (save())
  io::ErrorLog& errors() { return errors_; }
  io::Journal& journal() { return journal_; }  // open while a dumped step runs, when the sink keeps files

  // Between start() and stop(): forward calls are captured. A start() also opens the step to the
  // gradients of what it captured, until step() (msprobe's guide: start, forward, stop, backward,
  // step collects the backward of the calls made between start and stop).
  void set_capturing(bool on) {
    if (on) started_generation_ = generation_.load() + 1;
    capturing_ = on;
  }
  bool capturing() const { return capturing_.load(); }
  // Advanced by step(): a backward pass that belongs to an earlier step records nothing.
  std::uint64_t generation() const { return generation_.load(); }
  // Counts commit_debug() calls: a gradient of a saved tensor may arrive after the last flush.
  std::uint64_t debug_commits() const { return debug_commits_.load(); }

  // May a gradient of a call captured in step generation `gen` be recorded? Until step() moves on,
  // unless the task ended the dump or the Debugger went away.
  bool live(std::uint64_t gen) const { return generation_.load() == gen && open_to_gradients(); }
  // May a parameter's gradient be recorded now? When a capture ran in this step (parameters_grad).
  bool gradients_live() const { return started_generation_.load() == generation_.load() + 1 && open_to_gradients(); }
  // The Debugger is going away: nothing arrives in the step any more (a retained graph may still
  // run a backward after it).
  void close() { closed_ = true; }
  // Entries committed to dump.json so far in this process: the step lifecycle writes the step again
  // at step() when some arrived after stop() wrote it.
  std::uint64_t dump_commits() const { return dump_commits_.load(); }

  // step(): what the last step recorded is gone; a backward pass of that step records nothing.
  void start_next_step() {
    generation_.fetch_add(1);
    state_.reset();
    debug_state_.reset();
    errors_.reset();
  }

  // Every finished entry goes through here: the task has the last word on it (a task may keep
  // only some entries, or act on the ones it keeps) before it joins the step. A kept entry's
  // tensor files go to the writer and its JSON to the journal; a dropped one's snapshots are freed.
  void commit(Record&& r) {
    if (task_.keep(r))
      accept(state_, "dump", std::move(r));
    else
      decide_held_if_due();
  }
  // The same, for entries placed in dump order when they complete (backward, modules). The place
  // is taken before keep(), so an entry the task holds back keeps it.
  void commit_last(Record&& r) {
    r.order = state_.next_order();
    if (task_.keep(r))
      accept(state_, "dump", std::move(r));
    else
      decide_held_if_due();
  }

  // Entries the task held back until values still on a device are read (overflow_check) are
  // decided now, in one batch; those it keeps join the step. Called before each flush.
  void decide_held() {
    if constexpr (task_traits::holds_entries<TaskT>::value)
      task_.decide_held([this](Record&& r) { commit(std::move(r)); });
  }
  // Has the task ended the dump (overflow_check after overflow_nums overflowing calls)?
  bool ended() const {
    if constexpr (task_traits::can_end<TaskT>::value)
      return task_.ended();
    else
      return false;
  }
  // Who writes the step when the task ends the dump (see DumpEnd); null: nobody (it is going away).
  void set_dump_end(DumpEnd* end) {
    std::lock_guard<std::mutex> lock(end_mu_);
    end_ = end;
  }
  // save()'s entries, for debug.json. An entry committed again under the same name and order
  // replaces the earlier one (a gradient filling its placeholder).
  void commit_debug(Record&& r) {
    if (!task_.keep(r)) return;
    accept(debug_state_, "debug", std::move(r));
    debug_commits_.fetch_add(1);
  }

  // The rank directory of the dumped step: kept entries' tensor files go to its dump_tensor_data/,
  // their write failures to its dump_error_info.log.
  void set_step_directory(const std::string& rank_directory) {
    std::lock_guard<std::mutex> lock(files_mu_);
    rank_dir_ = rank_directory;
  }

  // async_dump: the tensor files held back while the step ran go to the writer now, each once its
  // device copy is done. Called when the step is written, before the files ticket is taken.
  void release_held_saves() {
    std::vector<HeldSave> held;
    {
      std::lock_guard<std::mutex> lock(files_mu_);
      held.swap(held_);
    }
    for (HeldSave& h : held) {
      try {
        if (h.save.copying) h.save.copying->wait();
      } catch (const std::exception& e) {
        errors_.log_in(h.rank_dir, "save_tensor", h.save.file_name, e);
        continue;
      }
      submit(h.directory, h.rank_dir, h.save);
    }
  }

  // A sealed record's line again, now with the deferred values its first line lacked (a name seen
  // again replaces its earlier body in recovery). `file`: "dump" or "debug".
  void journal_again(const char* file, const Record& r) {
    if (journal_.is_open()) append_to_journal(file, r);
  }

  // The task's own files of the step (free_benchmark.csv, overflow_summary.json, ...) as they stand
  // at this hand-over: one journal line each, {"task_file": NAME, "text": CONTENT}; recovery writes
  // the last one of each name.
  void journal_task_files(const std::vector<StepFile>& files) {
    if (!journal_.is_open()) return;
    for (const StepFile& f : files) journal_.append_later(std::make_unique<TaskFileLine>(f, errors_, journal_));
  }

  // Waits until every tensor file handed over so far is written.
  void flush_tensor_files() { wait_tensor_files(tensor_files_ticket()); }

  // The tensor files handed over so far; wait_tensor_files() waits for them (and no others) on
  // the thread that writes the step's JSON files.
  struct FilesTicket {
    std::shared_ptr<io::TensorWriter> writer;  // null when no file was handed over yet
    std::uint64_t number = 0;
  };
  FilesTicket tensor_files_ticket() const {
    return tensor_writer_ ? FilesTicket{tensor_writer_, tensor_writer_->ticket()} : FilesTicket{};
  }
  static void wait_tensor_files(const FilesTicket& t) {
    if (t.writer) t.writer->flush(t.number);
  }

 private:
  // A task that saves tensors gets a TensorSaver on this Recorder's writer.
  static TaskT make_task(const Config& config, const std::shared_ptr<io::TensorWriter>& writer) {
    if constexpr (task_traits::takes_saver<TaskT>::value)
      return TaskT(config, TensorSaver(writer, config.async_dump));
    else
      return TaskT(config);
  }

  bool open_to_gradients() const { return !closed_.load() && !end_seen_.load(); }

  void accept(StepState& into, const char* file, Record&& r) {
    if (&into == &state_) dump_commits_.fetch_add(1);
    if (!r.saves.empty()) hand_over_saves(r);
    if (journal_.is_open()) append_to_journal(file, r);
    into.commit(std::move(r));
    if (ended() && !end_seen_.exchange(true)) end_dump();
  }

  void decide_held_if_due() {
    if constexpr (task_traits::holds_entries<TaskT>::value)
      if (task_.decision_due()) decide_held();
  }

  // Nothing more is captured from now on (the capture's callbacks ask capturing() first; the
  // observer itself is removed by stop(), on the training thread), and the step is written now.
  void end_dump() {
    capturing_ = false;
    std::lock_guard<std::mutex> lock(end_mu_);
    if (end_) end_->dump_ended();
  }

  void hand_over_saves(Record& r) {
    std::string rank_dir;
    {
      std::lock_guard<std::mutex> lock(files_mu_);
      rank_dir = rank_dir_;
    }
    if (!rank_dir.empty() && tensor_writer_) {  // a task that takes no TensorSaver writes no file
      const std::string dir = tensor_data_directory(rank_dir) + "/";
      for (PendingSave& s : r.saves) {
        if (s.at_flush) {
          std::lock_guard<std::mutex> lock(files_mu_);
          held_.push_back(HeldSave{dir, rank_dir, std::move(s)});
        } else {
          submit(dir, rank_dir, s);
        }
      }
    }
    r.saves.clear();
  }

  void submit(const std::string& dir, const std::string& rank_dir, PendingSave& s) {
    try {  // dump_tensor_data/ of a task that saves seldom (the live check): made for its first file
      tensor_directory_.make("create the tensor directory", dir);
    } catch (const std::exception& e) {  // the file's own write fails next, and is logged too
      errors_.log_in(rank_dir, "save_tensor", dir, e);
    }
    tensor_writer_->submit(dir + s.file_name, rank_dir, std::move(s.data),
                           s.memory ? std::move(*s.memory) : io::Reservation());
  }

  // One line per kept entry; see io/journal.hpp for the format. The line is made on the journal's
  // thread from a copy of what the entry holds (its compact part is shared, it never changes). A
  // failure is logged once per step (through the error log's de-duplication) and the dump goes on
  // from memory.
  // One is made for every kept entry, on the capturing thread: its memory comes from a pool, and a
  // name of up to kInlineName characters (nearly all) is kept inside it, so that queuing a line
  // allocates nothing once the pool holds a queue's worth.
  class EntryLine final : public io::JournalLine {
   public:
    static void* operator new(std::size_t bytes) { return line_pool().take(bytes); }
    static void operator delete(void* p, std::size_t bytes) noexcept { line_pool().give(p, bytes); }

    EntryLine(const char* file, const Record& r, io::ErrorLog& errors, const io::Journal& journal)
        : file_(file),
          name_(r.name),
          order_(r.order),
          parent_(r.parent),
          construct_only_(r.construct_only),
          body_(r.body),
          deferred_(r.deferred),
          errors_(errors),
          journal_(journal) {}

    void write(io::JsonText& out) const override {
      out.raw("{\"file\": \"");
      out.raw(file_);
      out.raw("\", \"name\": ");
      out.string(name_.view());
      out.raw(", \"order\": ");
      out.integer(order_);
      if (parent_) {
        out.raw(", \"parent\": ");
        parent_->empty() ? out.null() : out.string(*parent_);
      }
      if (construct_only_) out.raw(", \"construct_only\": true");
      out.raw(", \"body\": ");
      io::write_body(out, body_, deferred_.get(), 0);
      out.raw("}");
    }

    void failed(int err) const override {
      errors_.log(
          "write_journal", std::string(name_.view()), io::errno_text(err),
          io::IoError("write the journal", journal_.path(), err).what() +
              std::string("\nThe step's records are kept in memory and written to dump.json at stop()/step()."));
    }

   private:
    static constexpr std::size_t kInlineName = 56;
    // A string kept inside the object when short.
    class InlineName {
     public:
      explicit InlineName(const std::string& s) : size_(s.size()) {
        if (size_ <= sizeof chars_)
          std::memcpy(chars_, s.data(), size_);
        else
          long_ = s;
      }
      std::string_view view() const {
        return size_ <= sizeof chars_ ? std::string_view(chars_, size_) : std::string_view(long_);
      }

     private:
      std::size_t size_;
      char chars_[kInlineName];
      std::string long_;
    };

    const char* file_;
    InlineName name_;
    std::uint64_t order_;
    std::optional<std::string> parent_;
    bool construct_only_;
    nlohmann::ordered_json body_;
    std::shared_ptr<const DeferredBody> deferred_;
    io::ErrorLog& errors_;
    const io::Journal& journal_;
  };

  class TaskFileLine final : public io::JournalLine {
   public:
    TaskFileLine(StepFile file, io::ErrorLog& errors, const io::Journal& journal)
        : file_(std::move(file)), errors_(errors), journal_(journal) {}

    void write(io::JsonText& out) const override {
      out.raw("{\"task_file\": ");
      out.string(file_.name);
      out.raw(", \"text\": ");
      out.string(file_.text);
      out.raw("}");
    }

    void failed(int err) const override {
      errors_.log("write_journal", file_.name, io::errno_text(err),
                  io::IoError("write the journal", journal_.path(), err).what() +
                      std::string("\nThe step's files are kept in memory and written at stop()/step()."));
    }

   private:
    StepFile file_;
    io::ErrorLog& errors_;
    const io::Journal& journal_;
  };

  void append_to_journal(const char* file, const Record& r) {
    journal_.append_later(std::make_unique<EntryLine>(file, r, errors_, journal_));
  }

  const Config config_;
  // Where kept entries' tensor files go; null for a task that saves none. Declared before the
  // task, which holds it through its TensorSaver.
  const std::shared_ptr<io::TensorWriter> tensor_writer_;
  TaskT task_;
  StepState state_;
  StepState debug_state_;
  io::ErrorLog errors_;
  io::Journal journal_;
  std::atomic<bool> capturing_{false};
  std::atomic<bool> closed_{false};
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<std::uint64_t> started_generation_{0};  // generation_ + 1 of the last start(); 0: none
  std::atomic<std::uint64_t> dump_commits_{0};
  std::atomic<std::uint64_t> debug_commits_{0};
  std::mutex end_mu_;
  DumpEnd* end_ = nullptr;
  std::atomic<bool> end_seen_{false};
  std::mutex files_mu_;
  std::string rank_dir_;
  io::DirectoryOnce tensor_directory_;
  struct HeldSave {
    std::string directory, rank_dir;  // dump_tensor_data/ (with its '/') and the rank directory
    PendingSave save;
  };
  std::vector<HeldSave> held_;  // async_dump: kept entries' files, until the step is written
};

}  // namespace torchprobe::details

#pragma once
// The step journal, <rank dir>/journal.jsonl: every entry the step keeps is appended as one JSON
// line the moment it is committed, so a process that dies mid-step (SIGKILL, OOM killer, a crash in
// the user's code) leaves its records on disk. dump.json (and debug.json) are written whole when
// the step is handed to the writer (details/step_writer.hpp), laid out from these lines while the
// file is whole (io/journal_dump.hpp: each entry's text is made once, here); the journal is
// removed once the step's files are complete. A journal that is still there marks a step whose files were not
// written, and `torchprobe recover` (io/recovery.hpp; tools/recover_dump.py) rebuilds them from it.
//
// Format (one JSON object per line, written with the Python-compatible writer):
//   line 1: {"journal": 1, "task": ..., "level": ..., "framework": "pytorch", "dump_data_dir": ...,
//            "debug_data_dir": ..., "extra_info": ...}
//   then:   {"file": "dump"|"debug", "name": ..., "order": N, ["parent": ...,] "body": {...}}
//           {"task_file": NAME, "text": CONTENT}   the task's own file as of a hand-over (last wins)
//   last:   {"end": true, "entries": K}   written when the step ended (finish()); K is the number
//            of lines between the header and it. A journal without it is an interrupted step; one with fewer
//            than K entry lines lost some (a full disk).
// Entries are placed by "order"; a name seen again replaces the earlier body in its first place
// (as dump.json does for a repeated name, and as save()'s gradient entry fills its placeholder).
//
// Lines are made and written by the journal's own thread, in commit order, at most kMaxQueued
// behind the capture (lines queued and not yet written: past it the capturing thread waits);
// not fsync'ed: they survive a process crash (but for the ones not yet written, at most
// kMaxQueued, all of the step being recorded: finish() waits for the step's lines), not a power
// loss. The capturing thread only queues a line: it wakes the journal's thread at the
// first line after a pause and then once per kBatchLines lines, and the thread writes what has
// queued up at least every kMaxDelay, so lines are a few milliseconds behind at most. Lines that
// do not fit (a full disk) are lost whole: a write cut short is truncated away, so the journal
// stays whole lines. A last line cut short (the process died mid-write) is ignored by the reader.
//
// The journal of a step outlives the step: retire() hands its file to whoever writes the step's
// files (lines queued before still go to it), and the next open() starts the next step's file.
// ticket() and wait_for() let that writer wait for exactly the lines queued before it took over.
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "torchprobe/core/thread_name.hpp"
#include "torchprobe/io/files.hpp"
#include "torchprobe/io/journal_file.hpp"
#include "torchprobe/io/json_text.hpp"

namespace torchprobe::io {

// A line whose text is made when it is written, on the journal's thread: write() appends it (no
// newline) to the text of the batch being written, one line after the other (indent None).
class JournalLine {
 public:
  virtual ~JournalLine() = default;
  virtual void write(JsonText& out) const = 0;
  // The write failed with `error` (errno).
  virtual void failed(int error) const = 0;
};

class Journal {
 public:
  static constexpr const char* kFileName = "journal.jsonl";
  // Lines queued and not yet written (waiting, or being made and written), at most: past it the
  // capturing thread waits, so that a crash loses at most this many lines (all of the step being
  // recorded) and the queue's memory stays bounded.
  static constexpr std::size_t kMaxQueued = 4096;
  static constexpr std::size_t kBatchLines = 256;
  static constexpr std::chrono::milliseconds kMaxDelay{2};

  using File = JournalFile;

  // The journal's lines as they stand at a hand-over: the file, and how many lines had been
  // queued for it (entry and task-file lines, after its header). Once Journal::wait_for() of the
  // ticket taken with it returns, they are all in the file, unless file->whole() says otherwise.
  struct Position {
    std::shared_ptr<const File> file;
    std::uint64_t lines = 0;
    std::uint64_t ticket = 0;  // ticket() at the same moment
  };

  Journal() = default;
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;
  // Writes what is queued, then stops the thread.
  ~Journal() {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Opens `path` for appending (a step that is started again continues its journal). A new
  // journal appears with its header already in it (write_file_atomic: temporary file, then
  // rename), so a process killed at any moment leaves either no journal or one that the recovery
  // tool can read; it may leave the temporary file (.journal.jsonl.tmp*), which the tool removes.
  // The file open before (if another) is retired: lines queued for it still go to it.
  // Throws IoError.
  void open(const std::string& path, const std::string& header_line) {
    std::lock_guard<std::mutex> lock(mu_);
    if (file_ && file_->is_open() && path == file_->path()) return;
    file_.reset();
    open_.store(false);
    int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    bool created = false;
    if (fd < 0 && errno == ENOENT) {
      write_file_atomic(path, header_line + "\n", 0640, /*sync=*/false);
      fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
      created = true;
    }
    if (fd < 0) throw IoError("open the journal", path, errno);
    struct stat st;
    const bool sized = ::fstat(fd, &st) == 0;
    const bool had_lines = !created && !(sized && st.st_size == 0);
    if (sized && st.st_size == 0) {  // left empty by something else: still readable after this
      const std::string text = header_line + "\n";
      const int err = write_all(fd, text.data(), text.size());
      if (err != 0) {
        ::close(fd);
        throw IoError("write the journal", path, err);
      }
    }
    auto file = std::make_shared<File>(path, fd);
    if (had_lines) file->spoil();  // lines of an earlier run of the step come first: not this step's alone
    {
      std::lock_guard<std::mutex> q(queue_mu_);
      file_entries_ = 0;
      if (!queue_.empty() && !queue_.back().line)
        queue_.back().file = file;  // no line went to the file before: it need not wait for the thread
      else
        queue_.push_back({nullptr, file});  // the lines after this one go to `file`
    }
    file_ = std::move(file);
    open_.store(true);
  }

  bool is_open() const { return open_.load(std::memory_order_relaxed); }
  std::string path() const {
    std::lock_guard<std::mutex> lock(mu_);
    return file_ ? file_->path() : std::string();
  }

  // Queues `line` for the open file: its text is made and written by the journal's thread, in
  // queue order. The serialising (several microseconds an entry) and the write() stay off the
  // capturing thread, which only takes a lock and wakes the thread now and then (see the top).
  void append_later(std::unique_ptr<JournalLine> line) {
    std::unique_lock<std::mutex> lock(queue_mu_);
    if (tickets_ - done_ >= kMaxQueued) {
      ++urgent_;
      work_cv_.notify_one();
      room_cv_.wait(lock, [this] { return tickets_ - done_ < kMaxQueued; });
      --urgent_;
    }
    queue_.push_back({std::move(line), nullptr});
    ++queued_lines_;
    ++tickets_;
    ++file_entries_;
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    if (idle_ || queued_lines_ == kBatchLines) {
      idle_ = false;
      lock.unlock();
      work_cv_.notify_one();
    }
  }

  // Where the open file stands, and the ticket that covers its lines (no file: none is open, or it
  // could not be created).
  Position position() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::lock_guard<std::mutex> q(queue_mu_);
    return Position{file_, file_ ? file_entries_ : 0, tickets_};
  }

  // The number of lines queued so far: wait_for(ticket()) returns once they are written.
  std::uint64_t ticket() const {
    std::lock_guard<std::mutex> lock(queue_mu_);
    return tickets_;
  }
  // Waits until the first `ticket` lines ever queued are written (or failed, or dropped).
  void wait_for(std::uint64_t ticket) {
    std::unique_lock<std::mutex> lock(queue_mu_);
    if (done_ >= ticket) return;
    ++urgent_;
    work_cv_.notify_one();
    done_cv_.wait(lock, [&] { return done_ >= ticket; });
    --urgent_;
  }
  // Waits until every line queued so far is written.
  void drain() { wait_for(ticket()); }

  // The open file leaves the journal (nothing more is appended to it; lines queued for it still
  // go to it) and is returned, or null when none is open.
  std::shared_ptr<File> retire() {
    std::lock_guard<std::mutex> lock(mu_);
    open_.store(false);
    return std::move(file_);
  }

  void close() {
    drain();
    if (auto f = retire()) f->close();
  }

  // The step has ended: its trailer line {"end": true, "entries": K} is queued after its K entry
  // lines, and the open file retired (as retire()). Returns the file (null when none was open) and
  // the ticket that covers the trailer: once wait_for(ticket) returns, every line of the step has
  // been handed to the operating system (write(2)), or failed.
  std::pair<std::shared_ptr<File>, std::uint64_t> finish() {
    std::lock_guard<std::mutex> lock(mu_);
    open_.store(false);
    std::shared_ptr<File> file = std::move(file_);
    std::unique_lock<std::mutex> q(queue_mu_);
    if (file && file->is_open()) {
      queue_.push_back({std::make_unique<Trailer>(file_entries_), nullptr});
      ++queued_lines_;
      ++tickets_;
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
      if (idle_) work_cv_.notify_one();  // wait_for() tells it not to wait for more lines
    }
    return {std::move(file), tickets_};
  }

  // The text of the trailer line for a step of `entries` entry lines.
  static std::string trailer_text(std::uint64_t entries) {
    return "{\"end\": true, \"entries\": " + std::to_string(entries) + "}";
  }

  // The step's files are complete: the journal is no longer needed (lines still queued are dropped).
  void remove() {
    if (auto f = retire()) f->remove();
  }

 private:
  class Trailer final : public JournalLine {
   public:
    explicit Trailer(std::uint64_t entries) : entries_(entries) {}
    void write(JsonText& out) const override { out.raw(trailer_text(entries_)); }
    void failed(int) const override {}  // the journal then reads as incomplete, which it is
   private:
    std::uint64_t entries_;
  };

  struct Item {
    std::unique_ptr<JournalLine> line;  // null for a marker:
    std::shared_ptr<File> file;         // the lines after the marker go to this file
  };

  void run() {
    name_this_thread("tp-journal");
    std::shared_ptr<File> file;  // where lines go
    std::unique_lock<std::mutex> lock(queue_mu_);
    for (;;) {
      if (queue_.empty()) {
        if (stopping_) return;
        idle_ = true;
        work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        idle_ = false;
        continue;
      }
      // A few lines: let more queue up, unless someone waits for them.
      if (queued_lines_ < kBatchLines && urgent_ == 0 && !stopping_)
        work_cv_.wait_for(lock, kMaxDelay, [this] { return queued_lines_ >= kBatchLines || urgent_ > 0 || stopping_; });
      std::deque<Item> batch;
      batch.swap(queue_);
      const std::size_t lines = queued_lines_;
      queued_lines_ = 0;
      lock.unlock();
      write_batch(batch, file);
      batch.clear();
      lock.lock();
      done_ += lines;
      done_cv_.notify_all();
      room_cv_.notify_all();
    }
  }

  // Consecutive lines of one file go out in one write(). Their text is made in one buffer that
  // keeps its room from batch to batch.
  void write_batch(std::deque<Item>& batch, std::shared_ptr<File>& file) {
    JsonText text(batch_text_, -1);
    const JournalLine* first = nullptr;
    auto write_out = [&] {
      if (first && file)
        if (const int err = file->append(text.view())) {
          file->spoil();
          first->failed(err);
        }
      text.clear();
      first = nullptr;
    };
    for (Item& item : batch) {
      if (!item.line) {
        write_out();
        file = std::move(item.file);
        continue;
      }
      if (!file) continue;
      if (!file->is_open()) {  // removed, or closed: nothing more goes to it
        file->spoil();
        continue;
      }
      const std::size_t before = text.size();
      try {
        item.line->write(text);
        text.raw("\n");
        if (!first) first = item.line.get();
      } catch (const std::exception&) {
        text.truncate(before);
        file->spoil();
        item.line->failed(EINVAL);  // the entry could not be serialised: it is still in dump.json
      }
    }
    write_out();
  }

  std::string batch_text_;  // the journal's thread's
  mutable std::mutex mu_;   // file_
  std::shared_ptr<File> file_;
  std::atomic<bool> open_{false};

  mutable std::mutex queue_mu_;
  std::condition_variable work_cv_;  // the thread: lines to write, or someone waits
  std::condition_variable room_cv_;  // capturing threads: the queue has room again
  std::condition_variable done_cv_;  // wait_for(): lines were written
  std::deque<Item> queue_;
  std::size_t queued_lines_ = 0;    // lines in queue_ (markers are not counted)
  std::uint64_t tickets_ = 0;       // lines ever queued
  std::uint64_t done_ = 0;          // lines ever written, failed or dropped
  std::uint64_t file_entries_ = 0;  // entry lines queued for the open file
  int urgent_ = 0;                  // threads waiting for lines to be written, or for room
  bool idle_ = false;               // the thread waits for a first line
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace torchprobe::io

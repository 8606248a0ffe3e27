#pragma once
// The step journal, <rank dir>/journal.jsonl: every entry the step keeps is appended as one JSON
// line the moment it is committed, so a process that dies mid-step (SIGKILL, OOM killer, a crash in
// the user's code) leaves its records on disk. dump.json (and debug.json) are still written whole
// at stop()/step(); the journal is removed once the step's files are complete. A journal that is
// still there marks an interrupted step, and tools/recover_dump.py rebuilds the step's JSON
// files from it.
//
// Format (one JSON object per line, written with the Python-compatible writer):
//   line 1: {"journal": 1, "task": ..., "level": ..., "framework": "pytorch", "dump_data_dir": ...,
//            "debug_data_dir": ..., "extra_info": ...}
//   then:   {"file": "dump"|"debug", "name": ..., "order": N, ["parent": ...,] "body": {...}}
// Entries are placed by "order"; a name seen again replaces the earlier body in its first place
// (as dump.json does for a repeated name, and as save()'s gradient entry fills its placeholder).
// Lines are made and written by the journal's own thread, in commit order, at most kMaxQueued
// behind the capture, the lines waiting at the time in one write(); not fsync'ed: they survive a
// process crash (but for the ones still queued), not a power loss. Lines that do not fit (a full
// disk) are lost whole: a write cut short is truncated away, so the journal stays whole lines. A
// last line cut short (the process died mid-write) is ignored by the reader.
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "torchprobe/io/files.hpp"

namespace torchprobe::io {

// A line whose text is made when it is written, on the journal's thread.
class JournalLine {
 public:
  virtual ~JournalLine() = default;
  virtual std::string text() const = 0;
  // The write failed with `error` (errno).
  virtual void failed(int error) const = 0;
};

class Journal {
 public:
  static constexpr const char* kFileName = "journal.jsonl";
  // Lines queued and not yet written, at most: past it the capturing thread waits, so that a
  // crash loses a bounded number of them and the queue's memory stays bounded.
  static constexpr std::size_t kMaxQueued = 4096;
  static constexpr std::size_t kBatchLines = 256;

  Journal() = default;
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;
  ~Journal() {
    close();
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Opens `path` for appending (a step that is started again continues its journal). A new
  // journal appears with its header already in it (write_file_atomic: temporary file, then
  // rename), so a process killed at any moment leaves either no journal or one that the recovery
  // tool can read; it may leave the temporary file (.journal.jsonl.tmp*), which the tool removes.
  // Throws IoError.
  void open(const std::string& path, const std::string& header_line) {
    drain();  // lines of the previous journal go to it
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_.load() >= 0 && path == path_) return;
    close_locked();
    path_.clear();  // a failed open must not leave remove() the previous step's (kept) journal
    int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
      write_file_atomic(path, header_line + "\n", 0640, /*sync=*/false);
      fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    }
    if (fd < 0) throw IoError("open the journal", path, errno);
    struct stat st;
    if (::fstat(fd, &st) == 0 && st.st_size == 0) {  // left empty by something else: still readable after this
      const std::string text = header_line + "\n";
      const int err = write_all(fd, text.data(), text.size());
      if (err != 0) {
        ::close(fd);
        throw IoError("write the journal", path, err);
      }
    }
    path_ = path;
    fd_.store(fd);
  }

  bool is_open() const { return fd_.load(std::memory_order_relaxed) >= 0; }
  std::string path() const {
    std::lock_guard<std::mutex> lock(mu_);
    return path_;
  }

  // Queues `line`: its text is made and written by the journal's thread, in queue order. The
  // serialising (several microseconds an entry) and the write() stay off the capturing thread.
  void append_later(std::unique_ptr<JournalLine> line) {
    std::unique_lock<std::mutex> lock(queue_mu_);
    queue_cv_.wait(lock, [this] { return queue_.size() < kMaxQueued; });
    queue_.push_back(std::move(line));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    queue_cv_.notify_all();
  }

  // Waits until every line queued so far is written.
  void drain() {
    std::unique_lock<std::mutex> lock(queue_mu_);
    queue_cv_.wait(lock, [this] { return queue_.empty() && !writing_; });
  }

  void close() {
    drain();
    std::lock_guard<std::mutex> lock(mu_);
    close_locked();
  }

  // The step's files are complete: the journal is no longer needed (lines still queued are dropped).
  void remove() {
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_.clear();
      queue_cv_.notify_all();
      queue_cv_.wait(lock, [this] { return !writing_; });
    }
    std::lock_guard<std::mutex> lock(mu_);
    const std::string path = path_;
    close_locked();
    if (!path.empty()) ::unlink(path.c_str());
    path_.clear();
  }

 private:
  // Appends `line` and a newline in one write(). Returns 0 or the errno of the failure.
  int append(const std::string& line) {
    std::string text;
    text.reserve(line.size() + 1);
    text += line;
    text += '\n';
    std::lock_guard<std::mutex> lock(mu_);
    const int fd = fd_.load();
    if (fd < 0) return 0;
    struct stat st;
    const bool sized = ::fstat(fd, &st) == 0;
    const int err = write_all(fd, text.data(), text.size());
    // A write cut short (a full disk) must not leave part of a line: lines appended once there is
    // room again would follow it, and the reader could not go past it.
    if (err != 0 && sized) (void)!::ftruncate(fd, st.st_size);
    return err;
  }

  void run() {
    std::unique_lock<std::mutex> lock(queue_mu_);
    for (;;) {
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      // Whatever has queued up (up to kBatchLines) goes out in one write().
      std::vector<std::unique_ptr<JournalLine>> batch;
      while (!queue_.empty() && batch.size() < kBatchLines) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      writing_ = true;
      queue_cv_.notify_all();  // room in the queue again
      lock.unlock();
      std::string text;
      const JournalLine* first = nullptr;
      for (const auto& line : batch) {
        try {
          std::string t = line->text();
          if (!text.empty()) text += '\n';
          text += t;
          if (!first) first = line.get();
        } catch (const std::exception&) {
          line->failed(EINVAL);  // the entry could not be serialised: it is still in dump.json
        }
      }
      if (first)
        if (const int err = append(text)) first->failed(err);
      batch.clear();
      lock.lock();
      writing_ = false;
      queue_cv_.notify_all();
    }
  }

  void close_locked() {
    const int fd = fd_.exchange(-1);
    if (fd >= 0) ::close(fd);
  }

  mutable std::mutex mu_;
  std::atomic<int> fd_{-1};
  std::string path_;

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::unique_ptr<JournalLine>> queue_;
  bool writing_ = false;  // the thread holds a line taken from the queue
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace torchprobe::io

#pragma once
// The writer threads: tensor files (.pt) are written off the training thread, in the order they
// are handed over, with the memory their snapshots hold capped (io/memory_budget.hpp). A failure
// is logged to dump_error_info.log and the run continues. docs/io.md describes the whole path of
// one tensor, from a task's TensorSaver::stage() to the file.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

#include "torchprobe/core/thread_name.hpp"
#include "torchprobe/core/probe_guard.hpp"
#include "torchprobe/io/error_log.hpp"
#include "torchprobe/io/files.hpp"
#include "torchprobe/io/memory_budget.hpp"
#include "torchprobe/io/pt_file.hpp"

namespace torchprobe::io {

namespace details {

// What the writer's threads share with each other and, through the budget it extends, with every
// outstanding reservation. Guarded by the budget's mutex, but for the log (log_mu).
struct WriterState : BudgetState {
  using BudgetState::BudgetState;

  std::condition_variable work;  // a job was queued, or the writer stops
  bool stopping = false;

  // Statistics (for the benchmark and the tests).
  std::uint64_t files = 0, bytes_written = 0, bytes_direct = 0, failures = 0;
  std::chrono::steady_clock::duration busy{0};  // time with at least one file being written
  std::size_t writing = 0;
  std::chrono::steady_clock::time_point busy_since{};
  std::uint64_t submitted = 0;          // files ever submitted: the next one's number
  std::set<std::uint64_t> outstanding;  // numbers of the files queued or being written

  std::mutex log_mu;
  ErrorLog log;
  std::string log_dir;
};

struct WriteJob {
  std::string path;
  std::string log_dir;  // the rank directory whose dump_error_info.log hears about a failure
  Reservation memory;   // declared before `data`, so the snapshot is freed first
  at::Tensor data;
  std::uint64_t number = 0;
};
}  // namespace details

// The writer threads behind a bounded queue. Memory held by snapshots that are staged, queued or
// being written is capped at max_pending_bytes: reserve() waits while the cap would be passed and
// some file is still queued (so it can only wait for progress the writer is making; a single
// snapshot larger than the cap, or entries still open, go ahead when nothing is queued).
class TensorWriter {
 public:
  struct Stats {
    std::uint64_t files = 0;         // written successfully
    std::uint64_t bytes = 0;         // tensor bytes in those files
    std::uint64_t direct_bytes = 0;  // of them, bytes written to the disk straight from the snapshots
    std::uint64_t failures = 0;
    std::size_t held_bytes = 0;       // snapshot memory alive now
    std::size_t idle_bytes = 0;       // freed snapshot buffers kept for reuse
    std::size_t peak_held_bytes = 0;  // the most snapshot memory alive at once
    std::uint64_t waits = 0;          // reserve() calls that had to wait for the writer
    double wait_seconds = 0;          // time the callers of reserve() spent waiting
    double busy_seconds = 0;          // wall time during which some file was being written
  };

  static constexpr unsigned kDefaultThreads = 2;

  // Two threads by default: while one computes a file's CRC-32 (the zip format needs it) the other
  // is in write(), which is what a single sequential writer cannot overlap.
  explicit TensorWriter(std::size_t max_pending_bytes, unsigned threads = kDefaultThreads)
      : state_(std::make_shared<details::WriterState>(std::max<std::size_t>(max_pending_bytes, 1))),
        thread_count_(std::max(threads, 1u)) {}

  TensorWriter(const TensorWriter&) = delete;
  TensorWriter& operator=(const TensorWriter&) = delete;

  // Writes everything still queued, then stops the threads.
  ~TensorWriter() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->stopping = true;
    }
    state_->work.notify_all();
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }

  std::size_t max_pending_bytes() const { return state_->max_held; }

  // Takes `bytes` from the budget, first waiting while that would pass the cap and a queued file
  // will free memory.
  Reservation reserve(std::size_t bytes) { return details::reserve(state_, bytes); }

  // Queues `data` (contiguous, on the CPU) for `path`; `log_dir` is where a failure is logged.
  void submit(std::string path, std::string log_dir, at::Tensor data, Reservation memory) {
    details::WriterState& s = *state_;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (threads_.empty()) start_threads();
      queue_->push_back({std::move(path), std::move(log_dir), std::move(memory), std::move(data), s.submitted});
      s.outstanding.insert(s.submitted++);
      ++s.in_flight;
    }
    s.work.notify_one();
  }

  // Returns once every submitted file is written (or has failed and been logged).
  void flush() {
    details::WriterState& s = *state_;
    std::unique_lock<std::mutex> lock(s.mu);
    s.changed.wait(lock, [&] { return s.in_flight == 0; });
  }

  // The number of files submitted so far: flush(ticket()) returns once they are written, whatever
  // is submitted after (a step being written while the next one saves tensors).
  std::uint64_t ticket() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->submitted;
  }
  void flush(std::uint64_t ticket) {
    details::WriterState& s = *state_;
    std::unique_lock<std::mutex> lock(s.mu);
    s.changed.wait(lock, [&] { return s.outstanding.empty() || *s.outstanding.begin() >= ticket; });
  }

  Stats stats() const {
    details::WriterState& s = *state_;
    std::lock_guard<std::mutex> lock(s.mu);
    Stats out;
    out.files = s.files;
    out.bytes = s.bytes_written;
    out.direct_bytes = s.bytes_direct;
    out.failures = s.failures;
    out.held_bytes = s.held;
    out.idle_bytes = s.idle_bytes;
    out.peak_held_bytes = s.peak_held;
    out.waits = s.waits;
    out.wait_seconds = std::chrono::duration<double>(s.waited).count();
    out.busy_seconds = std::chrono::duration<double>(s.busy).count();
    return out;
  }

 private:
  // Called with the mutex held, on the first submit: a writer that never gets a file starts no thread.
  void start_threads() {
    for (unsigned i = 0; i < thread_count_; ++i)
      threads_.emplace_back([state = state_, queue = queue_] {
        name_this_thread("tp-tensor-files");
        run(*state, *queue);
      });
  }

  static void run(details::WriterState& s, std::deque<details::WriteJob>& queue) {
    ProbeGuard guard;  // the writer's own tensor work must not reach the op observer
    for (;;) {
      details::WriteJob job;
      {
        std::unique_lock<std::mutex> lock(s.mu);
        s.work.wait(lock, [&] { return s.stopping || !queue.empty(); });
        if (queue.empty()) return;
        job = std::move(queue.front());
        queue.pop_front();
        if (s.writing++ == 0) s.busy_since = std::chrono::steady_clock::now();
      }
      bool ok = true;
      std::uint64_t direct = 0;
      try {
        direct = write_tensor_file(job.path, job.data);
      } catch (const std::exception& e) {
        ok = false;
        report(s, job, e);
      }
      const std::uint64_t bytes = job.memory.bytes();
      job.data = at::Tensor();  // free the snapshot, then give its bytes back to the budget
      job.memory.release();
      {
        std::lock_guard<std::mutex> lock(s.mu);
        if (--s.writing == 0) s.busy += std::chrono::steady_clock::now() - s.busy_since;
        --s.in_flight;
        s.outstanding.erase(job.number);
        if (ok) {
          ++s.files;
          s.bytes_written += bytes;
          s.bytes_direct += direct;
        } else {
          ++s.failures;
        }
      }
      s.changed.notify_all();
    }
  }

  // One entry per kind of failure (the OS error) and step in dump_error_info.log, and the first of
  // each on stderr, so a full disk is noticed without flooding either.
  static void report(details::WriterState& s, const details::WriteJob& job, const std::exception& e) noexcept {
    try {
      std::lock_guard<std::mutex> lock(s.log_mu);
      // Each step (rank directory) has its own log, and the log remembers what it reported per log
      // file: files of two steps may fail in any order now that steps are written in the background,
      // and switching back to an earlier step's directory must not report its failures again.
      if (job.log_dir != s.log_dir) {
        s.log_dir = job.log_dir;
        s.log.set_directory(job.log_dir);
      }
      const auto* io = dynamic_cast<const IoError*>(&e);
      const std::string kind = io ? errno_text(io->error_code()) : std::string("tensor serialization");
      const std::string name = job.path.substr(job.path.rfind('/') + 1);
      const std::string message =
          std::string(e.what()) +
          "\nThis tensor file was not written; the dump continues and the files written before stay valid.";
      if (s.log.log("save_tensor", name, kind, message)) {
        const std::string line = std::string(e.what()) + " (the dump continues; see " + s.log.path() + ")\n";
        (void)!::write(STDERR_FILENO, line.data(), line.size());
      }
    } catch (...) {
    }
  }

  std::shared_ptr<details::WriterState> state_;
  // Guarded by state_->mu; shared with the threads so that they never reach into this object.
  std::shared_ptr<std::deque<details::WriteJob>> queue_ = std::make_shared<std::deque<details::WriteJob>>();
  const unsigned thread_count_;
  std::vector<std::thread> threads_;  // started by the first submit
};

}  // namespace torchprobe::io

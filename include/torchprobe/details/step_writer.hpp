#pragma once
// The thread that writes finished steps, so that stop()/step() hand a step over and return.
//
// Jobs run one at a time, in the order they were handed over (a step flushed twice is written
// twice, the later write last). The records of the steps waiting to be written are counted against
// a budget (max_pending_mb): hand-over waits while the budget would be passed and an earlier step
// is still waiting, so memory stays bounded whatever the trainer does, and it never waits for
// nothing (one step larger than the budget goes ahead when the queue is empty). The destructor
// writes everything still queued.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "torchprobe/core/thread_name.hpp"
#include "torchprobe/core/probe_guard.hpp"

namespace torchprobe {

namespace details {

class StepWriter {
 public:
  struct Stats {
    std::uint64_t jobs = 0;         // run so far
    std::uint64_t waits = 0;        // hand-overs that waited for the budget
    double wait_seconds = 0;        // time those waited
    std::size_t peak_bytes = 0;     // the most bytes of records waiting at once
    std::size_t pending_bytes = 0;  // waiting now (queued or being written)
    std::size_t pending_jobs = 0;
  };

  explicit StepWriter(std::size_t max_pending_bytes) : max_bytes_(max_pending_bytes > 0 ? max_pending_bytes : 1) {}
  StepWriter(const StepWriter&) = delete;
  StepWriter& operator=(const StepWriter&) = delete;
  ~StepWriter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      paused_ = false;
      stopping_ = true;
    }
    work_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Queues `job` (it must not throw) for the writer's thread. `bytes`: what it keeps alive until it
  // has run; `directory`: the step directory it writes (see writes_to()).
  void submit(std::function<void()> job, std::size_t bytes, std::string directory) {
    std::unique_lock<std::mutex> lock(mu_);
    if (bytes > 0 && pending_bytes_ + bytes > max_bytes_ && !queue_.empty()) {
      const auto began = std::chrono::steady_clock::now();
      ++stats_.waits;
      done_.wait(lock, [&] { return pending_bytes_ + bytes <= max_bytes_ || queue_.empty(); });
      stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    }
    queue_.push_back({std::move(job), bytes, std::move(directory)});
    pending_bytes_ += bytes;
    if (pending_bytes_ > stats_.peak_bytes) stats_.peak_bytes = pending_bytes_;
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    lock.unlock();
    work_.notify_one();
  }

  // Returns once every job handed over so far has run.
  void wait_all() {
    std::unique_lock<std::mutex> lock(mu_);
    const std::uint64_t ticket = submitted_ + queue_.size();
    done_.wait(lock, [&] { return finished_ >= ticket; });
  }

  // Is a job for `directory` still to run? (A step directory dumped again must wait for it.)
  bool writes_to(const std::string& directory) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Job& j : queue_)
      if (j.directory == directory) return true;
    return running_ && running_directory_ == directory;
  }

  // For tests: while paused, jobs are queued but none starts (wait_all() would wait for resume()).
  void pause() {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = true;
  }
  void resume() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      paused_ = false;
    }
    work_.notify_all();
  }

  Stats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    Stats s = stats_;
    s.pending_bytes = pending_bytes_;
    s.pending_jobs = queue_.size() + (running_ ? 1 : 0);
    return s;
  }

 private:
  struct Job {
    std::function<void()> run;
    std::size_t bytes = 0;
    std::string directory;
  };

  void run() {
    name_this_thread("tp-step-writer");
    ProbeGuard guard;  // whatever the writing does with tensors must not reach the op observer
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_.wait(lock, [this] { return (!queue_.empty() && !paused_) || (stopping_ && queue_.empty()); });
      if (queue_.empty()) return;  // stopping, and nothing left
      Job job = std::move(queue_.front());
      queue_.pop_front();
      ++submitted_;  // counted as handed to the thread
      running_ = true;
      running_directory_ = job.directory;
      lock.unlock();
      if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
      job.run();
      job.run = nullptr;  // what the job kept (the step's records) goes before the budget is returned
      lock.lock();
      running_ = false;
      pending_bytes_ -= job.bytes;
      ++finished_;
      ++stats_.jobs;
      done_.notify_all();
    }
  }

  // $TORCHPROBE_WRITE_DELAY_MS: every job starts that much later. A testing aid: a program (or
  // test) that reads the files before wait_written() fails with it every time, not now and then.
  static std::chrono::milliseconds delay_from_environment() {
    const char* v = std::getenv("TORCHPROBE_WRITE_DELAY_MS");
    return std::chrono::milliseconds(v ? std::max(0L, std::strtol(v, nullptr, 10)) : 0L);
  }

  const std::size_t max_bytes_;
  const std::chrono::milliseconds delay_ = delay_from_environment();
  mutable std::mutex mu_;
  std::condition_variable work_;  // the thread: a job was queued, or resume(), or stop
  std::condition_variable done_;  // a job finished
  std::deque<Job> queue_;
  std::size_t pending_bytes_ = 0;
  std::uint64_t submitted_ = 0;  // jobs taken by the thread
  std::uint64_t finished_ = 0;   // jobs that have run
  bool running_ = false;
  std::string running_directory_;
  bool paused_ = false;
  bool stopping_ = false;
  Stats stats_;
  std::thread thread_;
};

}  // namespace details
}  // namespace torchprobe

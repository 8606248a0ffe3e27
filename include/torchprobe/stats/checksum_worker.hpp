#pragma once
// summary_mode md5 off the training thread (and, for tensors on a device, without a host
// synchronisation per tensor). A copy is several times faster than zlib's CRC-32 (docs/statistics.md),
// so for a large CPU tensor the training thread takes a contiguous snapshot (the values
// must be read before a later in-place op changes them) and a worker thread hashes it. The entry
// gets its checksum when the step is written (Record::pending_checksums).
//
// Small tensors are hashed at once (handing one over costs more than hashing it), and so is a
// tensor that would take the snapshots waiting for the worker past kMaxPendingBytes: memory stays
// bounded and the training thread is never made to wait for the worker. The xor mode stays on the
// training thread: it runs at memory speed, as fast as the copy would.
#include <ATen/ATen.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "torchprobe/core/thread_name.hpp"
#include "torchprobe/core/probe_guard.hpp"
#include "torchprobe/stats/checksum.hpp"

namespace torchprobe::stats {

class ChecksumWorker {
 public:
  static constexpr std::int64_t kMinOffloadBytes = std::int64_t(1) << 20;
  static constexpr std::int64_t kMaxPendingBytes = std::int64_t(256) << 20;

  ChecksumWorker() = default;
  ChecksumWorker(const ChecksumWorker&) = delete;
  ChecksumWorker& operator=(const ChecksumWorker&) = delete;
  ~ChecksumWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // The CRC-32 of `t` (8 hex digits) computed later, or nullopt when the caller should hash `t`
  // now: it is small, or enough is waiting already.
  //
  // A tensor on a device (or any tensor, with `as_device`: tests) is copied where it lives, which
  // needs no host synchronisation, and read back and hashed when the step is written: the future
  // is deferred and runs in the thread that asks for it.
  std::optional<std::shared_future<std::string>> submit(const at::Tensor& t, bool as_device = false) {
    const std::int64_t bytes = t.numel() * static_cast<std::int64_t>(t.element_size());
    if (as_device || !t.device().is_cpu()) {
      if (!device_budget_->take(bytes)) return std::nullopt;
      at::Tensor copy;
      {
        ProbeGuard guard;
        copy = t.clone();
      }
      // The reservation is returned when the copy is hashed, or when the entry is dropped unread.
      auto held = std::make_shared<DeviceCopy>(device_budget_, std::move(copy), bytes);
      return std::async(std::launch::deferred,
                        [held]() {
                          std::string hex = crc32_hex(held->copy);  // the one synchronisation, at flush
                          held->release();
                          return hex;
                        })
          .share();
    }
    if (bytes < kMinOffloadBytes || !host_budget_.take(bytes)) return std::nullopt;
    at::Tensor snapshot;
    {
      ProbeGuard guard;
      snapshot = host_values(t).clone(at::MemoryFormat::Contiguous);
    }
    std::promise<std::string> promise;
    std::shared_future<std::string> result = promise.get_future().share();
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back({std::move(snapshot), std::move(promise), bytes});
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    }
    cv_.notify_one();
    return result;
  }

  // How many checksums the worker thread computed (tests use it to see that one was offloaded).
  std::uint64_t offloaded() const {
    std::lock_guard<std::mutex> lock(mu_);
    return offloaded_;
  }

 private:
  // Bytes of copies waiting to be hashed, capped at kMaxPendingBytes. The device budget is shared
  // with the copies themselves: a pending checksum may outlive the worker (save()'s gradient
  // entries live as long as the user's tensor).
  struct Budget {
    std::mutex mu;
    std::int64_t pending = 0;
    bool take(std::int64_t bytes) {
      std::lock_guard<std::mutex> lock(mu);
      if (pending + bytes > kMaxPendingBytes) return false;
      pending += bytes;
      return true;
    }
    void give(std::int64_t bytes) {
      std::lock_guard<std::mutex> lock(mu);
      pending -= bytes;
    }
  };

  // A copy on a device waiting for the flush, and the bytes of the budget it holds.
  struct DeviceCopy {
    DeviceCopy(std::shared_ptr<Budget> b, at::Tensor c, std::int64_t n)
        : budget(std::move(b)), copy(std::move(c)), bytes(n) {}
    DeviceCopy(const DeviceCopy&) = delete;
    DeviceCopy& operator=(const DeviceCopy&) = delete;
    ~DeviceCopy() { release(); }
    void release() {
      if (!budget) return;
      copy = at::Tensor();
      budget->give(bytes);
      budget.reset();
    }
    std::shared_ptr<Budget> budget;
    at::Tensor copy;
    std::int64_t bytes;
  };

  struct Job {
    at::Tensor snapshot;
    std::promise<std::string> promise;
    std::int64_t bytes;
  };

  void run() {
    name_this_thread("tp-checksums");
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      std::string hex;
      std::exception_ptr error;
      try {
        hex = crc32_hex(job.snapshot);
      } catch (...) {
        error = std::current_exception();
      }
      job.snapshot = at::Tensor();  // its memory goes before the budget is returned
      host_budget_.give(job.bytes);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++offloaded_;
      }
      // Last: whoever waits on the result sees the counters already updated.
      if (error)
        job.promise.set_exception(error);
      else
        job.promise.set_value(std::move(hex));
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  Budget host_budget_;                                                  // snapshots queued for the worker
  std::shared_ptr<Budget> device_budget_ = std::make_shared<Budget>();  // copies on devices
  std::uint64_t offloaded_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace torchprobe::stats

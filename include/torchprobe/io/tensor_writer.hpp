#pragma once
// Tensor files (.pt) are written off the training thread, with the memory they hold capped.
//
// The path of one tensor, for every task that saves tensors (tensor, statistics with tensor_list,
// and any task that wants the same -- overflow_check, ...):
//
//  1. The task's describe() calls TensorSaver::stage(tensor, site, record, item)
//     (task/tensor_saver.hpp). stage() reserves the tensor's bytes from the writer's budget
//     (TensorWriter::reserve: the training thread waits here while the budget is spent and earlier
//     files are still queued), takes a contiguous CPU snapshot right away (an in-place op may change
//     the tensor a moment later), names the file "{entry}.{file_key}.pt" through safe_component,
//     writes "data_name" into the tensor's JSON item and appends an io::PendingSave to
//     Record::saves. Nothing is written yet.
//  2. The finished entry reaches details::DumpCore::commit()/commit_last(). Only when the task's
//     keep() accepts it are its saves handed to their writer (TensorWriter::submit) with the step's
//     dump_tensor_data directory. A dropped entry's snapshots are just freed, returning their
//     memory to the budget: a task that decides late (overflow_check) never writes files of
//     entries it drops.
//  3. The writer's threads write each file under a temporary name and rename it (mode 0640), so a
//     reader -- or a crash -- never meets half a .pt file under its real name. Large files are
//     written with direct I/O from the snapshot itself (DirectFile): no copy into the page cache,
//     which was most of the writer's work. A failure (full disk, file size limit, a vanished
//     directory) goes to the rank directory's dump_error_info.log, once per kind of failure and
//     step, and the run continues.
//  4. Debugger::stop()/step()/destruction wait until everything handed over is on disk
//     (TensorWriter::flush, through DumpCore::flush_tensor_files) before dump.json is written.
//
// A task that saves tensors therefore needs a TensorSaver member and one stage() call per tensor in
// describe(); keep() decides whether the files are written. The pieces it may also use directly,
// kept stable: io::PendingSave {writer, memory, file_name, data} (data must be a contiguous CPU
// tensor owning its storage by the time the entry is committed), TensorWriter::reserve(bytes)
// (the budget; large reservations carry a reusable buffer), snapshot_for_file(tensor[, memory])
// and saves_tensors(config) in task/tensor_saver.hpp.
#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "torchprobe/core/probe_guard.hpp"
#include "torchprobe/io/direct_file.hpp"
#include "torchprobe/io/error_log.hpp"
#include "torchprobe/io/files.hpp"

namespace torchprobe::io {

// Where a tensor's bytes start in its .pt file: libtorch's writer puts the storage record
// ("archive/data/0") first, and pads its local zip header (30 bytes + the name) to 64 bytes. The
// snapshot buffers of large tensors are placed at this remainder modulo kDirectAlign, so that the
// bytes go to the disk straight from the snapshot (DirectFile). Were a libtorch version to place
// the record elsewhere, the files would be the same, written through DirectFile's staging copy.
inline constexpr std::size_t kTensorPayloadOffset = 64;

// Writes `tensor` to `path` as the bytes torch::pickle_save(tensor) returns, which Python's
// torch.load (weights_only or not) reads back as an equal tensor. The archive is streamed straight
// into the file instead of being assembled in memory first, with direct I/O for large tensors
// (DirectFile). `tensor` should be a contiguous CPU tensor that owns its storage (the whole storage
// is written). The file appears under its name only once complete (temporary file + rename, no
// fsync: a process crash cannot leave a partial file, a power loss can). Throws IoError naming
// `path` and the OS error; the temporary file is removed. Returns the bytes that went to the disk
// straight from the tensor's memory.
inline std::uint64_t write_tensor_file(const std::string& path, const at::Tensor& tensor, mode_t mode = 0640) {
  const std::size_t slash = path.rfind('/');
  const std::string dir_prefix = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  static std::atomic<unsigned> counter{0};
  const std::string tmp = dir_prefix + "." + base.substr(0, 200) + ".tmp" + std::to_string(::getpid()) + "." +
                          std::to_string(counter.fetch_add(1));

  // The pickle part is small (sizes, dtype, a reference to the storage): build it first.
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* bytes, std::size_t n) { pickle.insert(pickle.end(), bytes, bytes + n); });
  pickler.protocol();
  pickler.pushIValue(tensor);
  pickler.stop();

  DirectFile file;
  const bool large = tensor.has_storage() && tensor.storage().nbytes() >= DirectFile::kDirectFrom;
  if (const int err = file.create(tmp.c_str(), mode, large)) throw IoError("write tensor file", path, err);
  // The zip writer is never told about a failed write: in some libtorch versions its destructor
  // would then throw. It goes on into the void and the error is raised below.
  auto sink = [&](const void* data, std::size_t n) -> std::size_t {
    file.write(data, n);
    return n;
  };
  try {
    caffe2::serialize::PyTorchStreamWriter zip(sink);
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), zip);
    zip.writeEndOfFile();
  } catch (...) {
    file.close();
    ::unlink(tmp.c_str());
    throw;
  }
  int err = file.close();
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw IoError("write tensor file", path, err);
  }
  return file.direct_bytes();
}

namespace detail {

// What the writer's threads and every outstanding reservation share. Its mutex also guards the job
// queue, so a finished file leaves the queue and frees its memory under one lock.
struct WriterState {
  explicit WriterState(std::size_t cap) : max_held(cap) {}
  ~WriterState() {
    for (auto& kv : idle) std::free(kv.second);
  }

  std::mutex mu;
  std::condition_variable work;     // a job was queued, or the writer stops
  std::condition_variable changed;  // memory was released, or a job finished
  std::size_t in_flight = 0;        // jobs queued or being written
  std::size_t held = 0;             // bytes of snapshots alive: staged, queued or being written
  const std::size_t max_held;
  bool stopping = false;

  // Statistics (for the benchmark and the tests).
  std::size_t peak_held = 0;
  std::uint64_t files = 0, bytes_written = 0, bytes_direct = 0, failures = 0, waits = 0;
  std::chrono::steady_clock::duration waited{0};
  std::chrono::steady_clock::duration busy{0};  // time with at least one file being written
  std::size_t writing = 0;
  std::chrono::steady_clock::time_point busy_since{};

  void release(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu);
      held -= std::min(held, bytes);
    }
    changed.notify_all();
  }

  // Snapshot buffers of large tensors are reused. A fresh large allocation is mapped and zeroed
  // page by page on first touch, which costs the training thread about twice the copy itself;
  // training repeats the same shapes every step, so a freed buffer of the same size is soon wanted
  // again. Idle buffers count against the cap with the live snapshots and are freed when a new
  // snapshot needs the room.
  static constexpr std::size_t kReuseFrom = std::size_t{1} << 20;
  std::multimap<std::size_t, void*> idle;  // size -> buffer
  std::size_t idle_bytes = 0;

  // A freed snapshot's buffer: kept if live and idle memory stay within the cap (its own bytes
  // are still counted as live here; its reservation is released right after).
  void recycle(void* block, std::size_t size) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (held + idle_bytes <= max_held) {
        idle.emplace(size, block);
        idle_bytes += size;
        return;
      }
    }
    std::free(block);
  }

  // Called with the mutex held, after `bytes` were added to `held`: an idle buffer of that size if
  // there is one, and the idle buffers to free so that live + idle memory fits the cap again.
  void* take_idle_locked(std::size_t bytes, std::vector<void*>& to_free) {
    void* block = nullptr;
    if (auto it = idle.find(bytes); it != idle.end()) {
      block = it->second;
      idle.erase(it);
      idle_bytes -= bytes;
    }
    while (!idle.empty() && held + idle_bytes > max_held) {
      auto largest = std::prev(idle.end());
      idle_bytes -= largest->first;
      to_free.push_back(largest->second);
      idle.erase(largest);
    }
    return block;
  }

  std::mutex log_mu;
  ErrorLog log;
  std::string log_dir;
};

}  // namespace detail

// Bytes of the writer's budget taken by one snapshot; given back when the snapshot is freed
// (written, or dropped with its entry). For a large snapshot it also holds the buffer to copy into
// (reused when possible). Move-only.
class Reservation {
 public:
  Reservation() = default;
  Reservation(std::shared_ptr<detail::WriterState> state, std::size_t bytes, void* block = nullptr)
      : state_(std::move(state)), bytes_(bytes), block_(block) {}
  Reservation(Reservation&& o) noexcept
      : state_(std::move(o.state_)), bytes_(std::exchange(o.bytes_, 0)), block_(std::exchange(o.block_, nullptr)) {}
  Reservation& operator=(Reservation&& o) noexcept {
    if (this != &o) {
      release();
      state_ = std::move(o.state_);
      bytes_ = std::exchange(o.bytes_, 0);
      block_ = std::exchange(o.block_, nullptr);
    }
    return *this;
  }
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation() { release(); }

  std::size_t bytes() const { return bytes_; }

  // A CPU tensor of `sizes` and `dtype` (bytes() bytes, contiguous) in this reservation's buffer,
  // whose buffer goes back to the writer when the tensor is freed; undefined when there is no
  // buffer (small tensors: the ordinary allocator is fast for them). Its data starts
  // kTensorPayloadOffset bytes into a block aligned to kDirectAlign: at the remainder its file
  // offset will have, so that it is written with direct I/O straight from here.
  at::Tensor take_buffer(at::IntArrayRef sizes, at::ScalarType dtype) {
    if (!block_) return at::Tensor();
    void* block = std::exchange(block_, nullptr);
    std::weak_ptr<detail::WriterState> state = state_;
    const std::size_t size = bytes_;
    return at::from_blob(
        static_cast<char*>(block) + kTensorPayloadOffset, sizes,
        [state, size](void* data) {
          void* p = static_cast<char*>(data) - kTensorPayloadOffset;
          if (auto s = state.lock()) s->recycle(p, size);
          else std::free(p);
        },
        at::TensorOptions().dtype(dtype));
  }

  // Must not be called with the writer's mutex held.
  void release() noexcept {
    if (block_) {
      if (state_) state_->recycle(block_, bytes_);
      else std::free(block_);
      block_ = nullptr;
    }
    if (state_ && bytes_ > 0) state_->release(bytes_);
    state_.reset();
    bytes_ = 0;
  }

 private:
  std::shared_ptr<detail::WriterState> state_;
  std::size_t bytes_ = 0;
  void* block_ = nullptr;
};

class TensorWriter;

namespace detail {
struct WriteJob {
  std::string path;
  std::string log_dir;  // the rank directory whose dump_error_info.log hears about a failure
  Reservation memory;   // declared before `data`, so the snapshot is freed first
  at::Tensor data;
};
}  // namespace detail

// The writer threads behind a bounded queue. Memory held by snapshots that are staged, queued or
// being written is capped at max_pending_bytes: reserve() waits while the cap would be passed and
// some file is still queued (so it can only wait for progress the writer is making; a single
// snapshot larger than the cap, or entries still open, go ahead when nothing is queued).
class TensorWriter {
 public:
  struct Stats {
    std::uint64_t files = 0;          // written successfully
    std::uint64_t bytes = 0;          // tensor bytes in those files
    std::uint64_t direct_bytes = 0;   // of them, bytes written to the disk straight from the snapshots
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
      : state_(std::make_shared<detail::WriterState>(std::max<std::size_t>(max_pending_bytes, 1))),
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
  Reservation reserve(std::size_t bytes) {
    detail::WriterState& s = *state_;
    std::unique_lock<std::mutex> lock(s.mu);
    if (s.held + bytes > s.max_held && s.in_flight > 0) {
      const auto t0 = std::chrono::steady_clock::now();
      s.changed.wait(lock, [&] { return s.held + bytes <= s.max_held || s.in_flight == 0; });
      s.waited += std::chrono::steady_clock::now() - t0;
      ++s.waits;
    }
    s.held += bytes;
    s.peak_held = std::max(s.peak_held, s.held);
    if (bytes < detail::WriterState::kReuseFrom) return Reservation(state_, bytes);
    std::vector<void*> to_free;
    void* block = s.take_idle_locked(bytes, to_free);
    lock.unlock();
    for (void* p : to_free) std::free(p);
    // Aligned for direct I/O (see take_buffer); no buffer (and an ordinary copy) if this fails.
    if (!block) block = std::aligned_alloc(kDirectAlign, (bytes + kTensorPayloadOffset + kDirectAlign - 1) / kDirectAlign * kDirectAlign);
    return Reservation(state_, bytes, block);
  }

  // Queues `data` (contiguous, on the CPU) for `path`; `log_dir` is where a failure is logged.
  void submit(std::string path, std::string log_dir, at::Tensor data, Reservation memory) {
    detail::WriterState& s = *state_;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (threads_.empty()) start_threads();
      queue_->push_back({std::move(path), std::move(log_dir), std::move(memory), std::move(data)});
      ++s.in_flight;
    }
    s.work.notify_one();
  }

  // Returns once every submitted file is written (or has failed and been logged).
  void flush() {
    detail::WriterState& s = *state_;
    std::unique_lock<std::mutex> lock(s.mu);
    s.changed.wait(lock, [&] { return s.in_flight == 0; });
  }

  Stats stats() const {
    detail::WriterState& s = *state_;
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
      threads_.emplace_back([state = state_, queue = queue_] { run(*state, *queue); });
  }

  static void run(detail::WriterState& s, std::deque<detail::WriteJob>& queue) {
    ProbeGuard guard;  // the writer's own tensor work must not reach the op observer
    for (;;) {
      detail::WriteJob job;
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
  static void report(detail::WriterState& s, const detail::WriteJob& job, const std::exception& e) noexcept {
    try {
      std::lock_guard<std::mutex> lock(s.log_mu);
      if (job.log_dir != s.log_dir) {  // a new step (or rank directory): report afresh
        s.log_dir = job.log_dir;
        s.log.set_directory(job.log_dir);
        s.log.reset();
      }
      const auto* io = dynamic_cast<const IoError*>(&e);
      const std::string kind = io ? errno_text(io->error_code()) : std::string("tensor serialization");
      const std::string name = job.path.substr(job.path.rfind('/') + 1);
      const std::string message = std::string(e.what()) +
                                  "\nThis tensor file was not written; the dump continues and the files written before stay valid.";
      if (s.log.log("save_tensor", name, kind, message)) {
        const std::string line = std::string(e.what()) + " (the dump continues; see " + s.log.path() + ")\n";
        (void)!::write(STDERR_FILENO, line.data(), line.size());
      }
    } catch (...) {
    }
  }

  std::shared_ptr<detail::WriterState> state_;
  // Guarded by state_->mu; shared with the threads so that they never reach into this object.
  std::shared_ptr<std::deque<detail::WriteJob>> queue_ = std::make_shared<std::deque<detail::WriteJob>>();
  const unsigned thread_count_;
  std::vector<std::thread> threads_;  // started by the first submit
};

}  // namespace torchprobe::io

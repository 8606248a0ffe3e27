#pragma once
// The memory budget of tensor snapshots waiting to be written: every snapshot reserves its bytes
// first, and the training thread waits while the cap would be passed and queued files will free
// memory. Large snapshots get reusable, direct-I/O-aligned buffers. docs/io.md: the whole path.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "torchprobe/io/direct_file.hpp"
#include "torchprobe/io/pt_file.hpp"

namespace torchprobe::io {

namespace details {

// What every outstanding reservation shares with the writer (which extends it: WriterState in
// io/tensor_writer.hpp). Its mutex also guards the writer's job queue, so a finished file leaves
// the queue and frees its memory under one lock.
struct BudgetState {
  explicit BudgetState(std::size_t cap) : max_held(cap) {}
  ~BudgetState() {
    for (auto& kv : idle) std::free(kv.second);
  }

  std::mutex mu;
  std::condition_variable changed;  // memory was released, or a job finished
  std::size_t in_flight = 0;        // jobs queued or being written
  std::size_t held = 0;             // bytes of snapshots alive: staged, queued or being written
  const std::size_t max_held;

  // Statistics (for the benchmark and the tests).
  std::size_t peak_held = 0;
  std::uint64_t waits = 0;
  std::chrono::steady_clock::duration waited{0};

  void release(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu);
      held -= std::min(held, bytes);
    }
    changed.notify_all();
  }

  // Snapshot buffers of large tensors are reused. A fresh large allocation is mapped and zeroed
  // page by page on first touch, which costs the training thread more than the copy itself
  // (docs/tensor.md); training repeats the same shapes every step, so a freed buffer of the same
  // size is soon wanted again. Idle buffers count against the cap with the live snapshots and are freed when a new
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
};

}  // namespace details

// Bytes of the writer's budget taken by one snapshot; given back when the snapshot is freed
// (written, or dropped with its entry). For a large snapshot it also holds the buffer to copy into
// (reused when possible). Move-only.
class Reservation {
 public:
  Reservation() = default;
  Reservation(std::shared_ptr<details::BudgetState> state, std::size_t bytes, void* block = nullptr)
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
    std::weak_ptr<details::BudgetState> state = state_;
    const std::size_t size = bytes_;
    return at::from_blob(
        static_cast<char*>(block) + kTensorPayloadOffset, sizes,
        [state, size](void* data) {
          void* p = static_cast<char*>(data) - kTensorPayloadOffset;
          if (auto s = state.lock())
            s->recycle(p, size);
          else
            std::free(p);
        },
        at::TensorOptions().dtype(dtype));
  }

  // Must not be called with the writer's mutex held.
  void release() noexcept {
    if (block_) {
      if (state_)
        state_->recycle(block_, bytes_);
      else
        std::free(block_);
      block_ = nullptr;
    }
    if (state_ && bytes_ > 0) state_->release(bytes_);
    state_.reset();
    bytes_ = 0;
  }

 private:
  std::shared_ptr<details::BudgetState> state_;
  std::size_t bytes_ = 0;
  void* block_ = nullptr;
};

namespace details {

// Takes `bytes` from the budget, first waiting while that would pass the cap and a queued file
// will free memory (so it only ever waits for progress the writer is making).
inline Reservation reserve(const std::shared_ptr<BudgetState>& state, std::size_t bytes) {
  BudgetState& s = *state;
  std::unique_lock<std::mutex> lock(s.mu);
  if (s.held + bytes > s.max_held && s.in_flight > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    s.changed.wait(lock, [&] { return s.held + bytes <= s.max_held || s.in_flight == 0; });
    s.waited += std::chrono::steady_clock::now() - t0;
    ++s.waits;
  }
  s.held += bytes;
  s.peak_held = std::max(s.peak_held, s.held);
  if (bytes < BudgetState::kReuseFrom) return Reservation(state, bytes);
  std::vector<void*> to_free;
  void* block = s.take_idle_locked(bytes, to_free);
  lock.unlock();
  for (void* p : to_free) std::free(p);
  // Aligned for direct I/O (see take_buffer); no buffer (and an ordinary copy) if this fails.
  if (!block)
    block = std::aligned_alloc(kDirectAlign,
                               (bytes + kTensorPayloadOffset + kDirectAlign - 1) / kDirectAlign * kDirectAlign);
  return Reservation(state, bytes, block);
}

}  // namespace details

}  // namespace torchprobe::io

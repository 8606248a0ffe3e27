#pragma once
// Recycled memory for the compact bodies of API entries (capture/captured_call.hpp).
//
// A statistics step keeps one body object (88 bytes with its control block; its encoded items lie
// beside it) per call until step() frees them all. With
// hundreds alive at once, glibc's per-thread cache (7 blocks of a size) cannot serve them, and
// every call went through malloc's slow path and every step() through free's: together about a
// tenth of a small call's capture cost. The pool keeps freed blocks of its one size for the next
// step (one pool per process, see body_pool()), at the price of one uncontended lock per block.
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

namespace torchprobe::details {

class BlockPool {
 public:
  // Keeps at most `max_free` freed blocks (the rest go back to the heap).
  explicit BlockPool(std::size_t max_free) : max_free_(max_free) { free_.reserve(max_free); }
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool() {
    for (void* p : free_) ::operator delete(p);
  }

  // The pool serves one size: the first one asked for. Others come from the heap.
  void* take(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (block_ == 0) block_ = bytes;
      if (bytes == block_ && !free_.empty()) {
        void* p = free_.back();
        free_.pop_back();
        return p;
      }
    }
    return ::operator new(bytes);
  }

  void give(void* p, std::size_t bytes) noexcept {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (bytes == block_ && free_.size() < max_free_) {
        free_.push_back(p);  // within the reserved capacity: cannot throw
        return;
      }
    }
    ::operator delete(p);
  }

 private:
  std::mutex mu_;
  std::vector<void*> free_;
  std::size_t block_ = 0;
  const std::size_t max_free_;
};

// The process's pool of entry bodies. It is never destroyed: a body may be freed after every
// debugger is gone (a sink's records kept by the user, a journal line being written), and at
// exit. It holds at most kMaxFree blocks of about 1 KB.
inline BlockPool& body_pool() {
  static constexpr std::size_t kMaxFree = 4096;
  static BlockPool* const pool = new BlockPool(kMaxFree);
  return *pool;
}

// The process's pool of journal lines (details/recorder.hpp): one is made on the capturing thread
// for every kept entry and freed on the journal's thread. Never destroyed, as body_pool().
inline BlockPool& line_pool() {
  static constexpr std::size_t kMaxFree = 4096;  // the journal's queue holds at most as many
  static BlockPool* const pool = new BlockPool(kMaxFree);
  return *pool;
}

// For std::allocate_shared of entry bodies. Stateless: copying it (allocate_shared does, several
// times) costs nothing.
template <class T>
struct BodyAllocator {
  using value_type = T;
  BodyAllocator() = default;
  template <class U>
  BodyAllocator(const BodyAllocator<U>&) {}

  T* allocate(std::size_t n) { return static_cast<T*>(body_pool().take(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { body_pool().give(p, n * sizeof(T)); }

  template <class U>
  bool operator==(const BodyAllocator<U>&) const {
    return true;
  }
  template <class U>
  bool operator!=(const BodyAllocator<U>&) const {
    return false;
  }
};

}  // namespace torchprobe::details

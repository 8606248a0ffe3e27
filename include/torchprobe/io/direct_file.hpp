#pragma once
// A file written with direct I/O (O_DIRECT) where the file system allows it: large tensor files go
// from the snapshot's memory to the disk without the kernel's copy into the page cache.
//
// Why: a tensor file is written once and not read back by the training process, yet an ordinary
// write() copies every byte into the page cache first. That copy was most of the writer's time
// (docs/tensor.md, Benchmark), and it fills memory with dirty pages that the disk then drains in
// bursts. With O_DIRECT the disk reads the bytes straight from the snapshot.
//
// O_DIRECT asks for file offsets, lengths and memory addresses aligned to the device's block
// (kDirectAlign covers every common device). A stream of arbitrary pieces is made to fit so:
//  - small pieces (zip headers, the pickle) are gathered in an aligned staging buffer and written
//    in whole blocks;
//  - a large piece whose memory address lines up with its file offset (same remainder modulo
//    kDirectAlign) is written straight from the caller's memory, after its first partial block
//    has gone through the staging buffer; the snapshot buffers of large tensors are placed so
//    that this is the case (Reservation, io/memory_budget.hpp);
//  - a large piece that does not line up is copied through the staging buffer: still no page
//    cache, one copy into a buffer that stays in the CPU's cache;
//  - the last partial block is written with O_DIRECT switched off (an ordinary write of less than
//    the staging buffer), so the file ends at its exact size without padding or truncation.
// A file system that refuses O_DIRECT at open (tmpfs before Linux 6.6, some network file systems)
// or at a write (EINVAL: an unexpected alignment rule) gets ordinary writes from that point on; the
// bytes are the same either way.
#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <string>

#include <fcntl.h>
#include <unistd.h>

#include "torchprobe/io/files.hpp"

namespace torchprobe::io {

// Offsets, lengths and addresses of direct writes are multiples of this (a page: the largest
// logical block size of common disks, and a multiple of every smaller one).
inline constexpr std::size_t kDirectAlign = 4096;

class DirectFile {
 public:
  // Files of fewer bytes are written ordinarily: for them the page cache costs little and the
  // direct path's synchronous writes would cost more.
  static constexpr std::size_t kDirectFrom = std::size_t{1} << 20;

  DirectFile() = default;
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;
  ~DirectFile() {
    if (fd_ >= 0) ::close(fd_);
    std::free(stage_);
  }

  // Creates `path` (O_EXCL) with `mode`; with direct I/O when `direct` is asked for and the file
  // system accepts it. Returns 0 or the errno value.
  int create(const char* path, mode_t mode, bool direct) {
#if defined(__linux__) && defined(O_DIRECT)
    if (direct) {
      stage_ = static_cast<unsigned char*>(std::aligned_alloc(kDirectAlign, kStageBytes));
      if (stage_) {
        fd_ = ::open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, mode);
        if (fd_ >= 0) {
          direct_ = true;
          return 0;
        }
        if (errno != EINVAL) return errno;
        // EINVAL: this file system has no O_DIRECT. Linux may have created the file before
        // refusing the flag; the path is the caller's new, unique name, so it is removed.
        ::unlink(path);
      }
    }
#else
    (void)direct;
#endif
    fd_ = ::open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    return fd_ >= 0 ? 0 : errno;
  }

  // Appends n bytes. After the first error nothing more is written; close() returns that error.
  void write(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    if (err_ != 0 || n == 0) return;
    if (!direct_) {
      write_ordinary(p, n);
      return;
    }
    if (n >= kDirectFrom) {
      // Fill the current block from the front of the piece; then the rest starts on a block
      // boundary of the file, and can go straight from memory if its address does too.
      // (What is already written ends on a block boundary, so the staged bytes decide.)
      const std::size_t head = (kDirectAlign - used_ % kDirectAlign) % kDirectAlign;
      const std::size_t body = (n - head) / kDirectAlign * kDirectAlign;
      if (body > 0 && reinterpret_cast<std::uintptr_t>(p + head) % kDirectAlign == 0) {
        stage(p, head);
        flush_whole_blocks();  // the staged bytes now end on a block boundary: all of them go
        if (err_ == 0 && direct_ && used_ == 0) {
          write_at_end(p + head, body, /*from_caller=*/true);
          stage(p + head + body, n - head - body);
          return;
        }
        p += head;
        n -= head;
      }
    }
    stage(p, n);
  }

  // Writes what is staged, then closes; returns 0 or the first errno value. The file is complete
  // once this returns 0.
  int close() {
    if (fd_ < 0) return err_;
    if (err_ == 0 && direct_ && used_ > 0) {
      // The last partial block, written ordinarily so that the file has its exact length.
      if (clear_direct()) write_ordinary(stage_, used_);
    }
    used_ = 0;
#if defined(__linux__)
    // Starts the writeback of what went through the page cache, without waiting for it: the disk
    // then works while the next files are made, instead of the dirty pages piling up until the
    // kernel's thresholds or a sync.
    if (err_ == 0) (void)::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
#endif
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0 && errno != EINTR && err_ == 0) err_ = errno;
    return err_;
  }

  bool direct() const { return direct_; }  // still writing with O_DIRECT
  // Bytes written straight from the caller's memory, without any copy (for the tests and the
  // benchmark).
  std::uint64_t direct_bytes() const { return direct_bytes_; }

 private:
  static constexpr std::size_t kStageBytes = std::size_t{256} << 10;  // a multiple of kDirectAlign
  // Each direct write() of at most this much (Linux moves at most about 2 GiB per call).
  static constexpr std::size_t kMaxCall = std::size_t{1} << 30;

  // Copies into the staging buffer, writing it out whenever it is full.
  void stage(const unsigned char* p, std::size_t n) {
    while (n > 0 && err_ == 0) {
      if (!direct_) {
        write_ordinary(p, n);
        return;
      }
      const std::size_t take = std::min(n, kStageBytes - used_);
      std::memcpy(stage_ + used_, p, take);
      used_ += take;
      p += take;
      n -= take;
      if (used_ == kStageBytes) flush_whole_blocks();
    }
  }

  // Writes the whole blocks of the staging buffer and keeps the partial one at its front.
  void flush_whole_blocks() {
    const std::size_t whole = used_ / kDirectAlign * kDirectAlign;
    if (whole == 0) return;
    const std::size_t rest = used_ - whole;
    used_ = 0;  // the staged bytes are no longer pending once handed to write_at_end
    write_at_end(stage_, whole, /*from_caller=*/false);
    if (err_ != 0) return;
    if (direct_) {
      std::memmove(stage_, stage_ + whole, rest);
      used_ = rest;
    } else {
      write_ordinary(stage_ + whole, rest);
    }
  }

  // Writes n bytes at the end of the file: directly while direct_ holds, ordinarily once a direct
  // write has been refused. `from_caller`: p is the caller's memory, not the staging buffer.
  void write_at_end(const unsigned char* p, std::size_t n, bool from_caller) {
    while (n > 0 && err_ == 0) {
      if (!direct_) {
        write_ordinary(p, n);
        return;
      }
      const ssize_t w = ::write(fd_, p, std::min(n, kMaxCall));
      if (w < 0 && errno == EINTR) continue;
      if (w > 0) {
        p += w;
        n -= static_cast<std::size_t>(w);
        if (from_caller) direct_bytes_ += static_cast<std::size_t>(w);
        if (static_cast<std::size_t>(w) % kDirectAlign != 0) clear_direct();  // a short write: the rest ordinarily
        continue;
      }
      if (w < 0 && errno == EINVAL && clear_direct()) continue;  // an alignment rule we do not meet
      err_ = w < 0 ? errno : ENOSPC;
    }
  }

  void write_ordinary(const unsigned char* p, std::size_t n) {
    if (err_ == 0) err_ = write_all(fd_, p, n);
  }

  // Switches the file to ordinary writes (anything still staged goes out ordinarily by the caller).
  bool clear_direct() {
#if defined(__linux__) && defined(O_DIRECT)
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) {
      err_ = errno;
      return false;
    }
#endif
    direct_ = false;
    return true;
  }

  int fd_ = -1;
  bool direct_ = false;
  int err_ = 0;
  std::size_t used_ = 0;  // bytes in the staging buffer, which starts where the written bytes end
  unsigned char* stage_ = nullptr;
  std::uint64_t direct_bytes_ = 0;
};

// Whether files created in `dir` get direct I/O from DirectFile (creates and removes a probe file).
inline bool direct_io_supported(const std::string& dir) {
  const std::string probe = dir + "/.torchprobe_direct_io_probe." + std::to_string(::getpid());
  DirectFile file;
  const bool direct = file.create(probe.c_str(), 0600, true) == 0 && file.direct();
  file.close();
  ::unlink(probe.c_str());
  return direct;
}

}  // namespace torchprobe::io

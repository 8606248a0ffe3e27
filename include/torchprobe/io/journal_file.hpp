#pragma once
// One step journal's file (io/journal.hpp): lines appended whole, whether every line queued for it
// arrived, and its end (closed and kept for `torchprobe recover`, or removed).
#include <atomic>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include <sys/stat.h>
#include <unistd.h>

#include "torchprobe/io/files.hpp"

namespace torchprobe::io {

// One journal file. Closed when the last owner lets go of it (the journal's thread holds it
// while lines for it are queued).
class JournalFile {
 public:
  JournalFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  JournalFile(const JournalFile&) = delete;
  JournalFile& operator=(const JournalFile&) = delete;
  ~JournalFile() { close(); }

  const std::string& path() const { return path_; }
  bool is_open() const { return fd_.load(std::memory_order_relaxed) >= 0; }
  // Every line queued for this file since it was opened is in it, in queue order, after its
  // header (once written): the step's JSON files may be made from its text (io/journal_dump.hpp).
  // False from the first line lost (a failed write, a line that could not be made, the file
  // closed) and for a journal that was there before it was opened (its earlier lines come first).
  bool whole() const { return whole_.load(std::memory_order_acquire); }
  void spoil() { whole_.store(false, std::memory_order_release); }

  // The file stays (a step whose files could not be written: tools/recover_dump.py needs it);
  // lines still to come for it are dropped.
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    const int fd = fd_.exchange(-1);
    if (fd >= 0) ::close(fd);
  }
  // The step's files are complete: the journal is no longer needed.
  void remove() {
    std::lock_guard<std::mutex> lock(mu_);
    const int fd = fd_.exchange(-1);
    if (fd >= 0) ::close(fd);
    ::unlink(path_.c_str());
  }

  // Appends `text` (whole lines, each ending in a newline) in one write(). Returns 0 or the
  // errno of the failure.
  int append(std::string_view text) {
    std::lock_guard<std::mutex> lock(mu_);
    const int fd = fd_.load();
    if (fd < 0) return 0;
    struct stat st;
    const bool sized = ::fstat(fd, &st) == 0;
    const int err = write_all(fd, text.data(), text.size());
    // A write cut short (a full disk) must not leave part of a line: lines appended once there
    // is room again would follow it, and the reader could not go past it.
    if (err != 0 && sized) (void)!::ftruncate(fd, st.st_size);
    return err;
  }

 private:
  std::mutex mu_;
  const std::string path_;
  std::atomic<int> fd_;
  std::atomic<bool> whole_{true};
};

}  // namespace torchprobe::io

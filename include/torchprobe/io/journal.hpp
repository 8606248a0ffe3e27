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
// Lines are written with one write() each and not fsync'ed: they survive a process crash, not a
// power loss. A last line cut short (a full disk) is ignored by the reader.
#include <atomic>
#include <cerrno>
#include <mutex>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "files.hpp"

namespace torchprobe::io {

class Journal {
 public:
  static constexpr const char* kFileName = "journal.jsonl";

  Journal() = default;
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;
  ~Journal() { close(); }

  // Opens `path` for appending (a step that is started again continues its journal); a new or
  // empty file first gets `header_line`. Throws IoError.
  void open(const std::string& path, const std::string& header_line) {
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_.load() >= 0 && path == path_) return;
    close_locked();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0) throw IoError("open the journal", path, errno);
    struct stat st;
    if (::fstat(fd, &st) == 0 && st.st_size == 0) {
      const int err = write_all(fd, header_line + "\n");
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

  // Appends `line` and a newline in one write(). Returns 0 or the errno of the failure.
  int append(const std::string& line) {
    std::string text;
    text.reserve(line.size() + 1);
    text += line;
    text += '\n';
    std::lock_guard<std::mutex> lock(mu_);
    const int fd = fd_.load();
    if (fd < 0) return 0;
    return write_all(fd, text);
  }

  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    close_locked();
  }

  // The step's files are complete: the journal is no longer needed.
  void remove() {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string path = path_;
    close_locked();
    if (!path.empty()) ::unlink(path.c_str());
    path_.clear();
  }

 private:
  void close_locked() {
    const int fd = fd_.exchange(-1);
    if (fd >= 0) ::close(fd);
  }

  static int write_all(int fd, const std::string& text) {
    const char* p = text.data();
    std::size_t left = text.size();
    while (left > 0) {
      const ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return n < 0 ? errno : ENOSPC;
      p += n;
      left -= static_cast<std::size_t>(n);
    }
    return 0;
  }

  mutable std::mutex mu_;
  std::atomic<int> fd_{-1};
  std::string path_;
};

}  // namespace torchprobe::io

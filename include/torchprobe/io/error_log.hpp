#pragma once
// <rank_dir>/dump_error_info.log: where a failure to collect one call's data is reported, so that a
// dump keeps going (and the rest of the data is kept) when a single op cannot be analysed.
//
// Each entry follows classic msprobe's layout (its Python traceback replaced by our message):
//   [2025-01-31 14:03:07 +0800] [ERROR] forward_input_data_collect failed: name=Aten.add.0.forward, pid=4242
//   <message>
//   <blank line>
// A failure that repeats on every op would flood the log, so like msprobe each (what, kind) pair is
// written once per log file until reset() (the dumper calls it at every step). Logging must never make things
// worse: nothing here throws, and if the file cannot be written one line goes to stderr instead.
// Such an entry is kept (up to kMaxPending bytes) and written, in its place, before the next entry
// or at retry() (the Debugger's every flush): a full disk has room again once files are freed.
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <cxxabi.h>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <typeinfo>
#include <utility>

#include <fcntl.h>
#include <unistd.h>

#include "torchprobe/io/files.hpp"

namespace torchprobe::io {

class ErrorLog {
 public:
  static constexpr const char* kFileName = "dump_error_info.log";

  explicit ErrorLog(std::string directory = {}) : dir_(std::move(directory)) {}

  // The directory the log goes to (the current rank directory); takes effect for the next entry.
  void set_directory(std::string directory) noexcept {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      dir_ = std::move(directory);
    } catch (...) {
    }
  }
  std::string directory() const {
    std::lock_guard<std::mutex> lock(mu_);
    return dir_;
  }
  std::string path() const {
    std::lock_guard<std::mutex> lock(mu_);
    return file_path_locked();
  }

  // Writes one entry unless this (what, kind) was already written since the last reset().
  // `what` is the failed action (msprobe: "forward_input_data_collect"), `name` the dump name,
  // `kind` what makes failures "the same" (msprobe: the exception class), `message` the text.
  // Returns true when the entry was written (to the file, or to stderr as a fallback).
  bool log(std::string_view what, std::string_view name, std::string_view kind, std::string_view message) noexcept {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      return log_locked(file_path_locked(), what, name, kind, message);
    } catch (...) {  // out of memory or a broken mutex: nothing sensible is left to do
      return false;
    }
  }

  // The same, to the log of `directory` rather than the current one: a step written after the
  // next one began (details/step_writer.hpp) reports to its own log. De-duplicated per directory.
  bool log_in(std::string_view directory, std::string_view what, std::string_view name,
              const std::exception& e) noexcept {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      return log_locked(file_path_of(std::string(directory)), what, name, type_name(e), e.what());
    } catch (...) {
      return false;
    }
  }

  // Convenience for a caught exception: kind = its demangled dynamic type, message = what().
  bool log(std::string_view what, std::string_view name, const std::exception& e) noexcept {
    try {
      return log(what, name, type_name(e), e.what());
    } catch (...) {
      return false;
    }
  }

  // Writes the entries that could not be written before; those that still cannot be stay kept.
  void retry() noexcept {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      (void)write_pending_locked();
    } catch (...) {
    }
  }

  // Forget which failures were reported, so that the next step reports them again.
  void reset() noexcept {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.clear();
    } catch (...) {
    }
  }

 private:
  static constexpr std::size_t kMaxPending = 64 * 1024;

  bool log_locked(const std::string& file, std::string_view what, std::string_view name, std::string_view kind,
                  std::string_view message) {
    if (!seen_.emplace(file, std::string(what), std::string(kind)).second) return false;
    std::string entry = "[" + timestamp() + "] [ERROR] ";
    entry.append(what).append(" failed: name=").append(name);
    entry += ", pid=" + std::to_string(::getpid()) + "\n";
    entry.append(message).append("\n\n");
    int err = write_pending_locked();
    if (err == 0) err = append(file, entry);
    if (err != 0) {
      fallback(file, err, what, name, message);
      if (pending_bytes_ + entry.size() <= kMaxPending) {
        pending_bytes_ += entry.size();
        pending_.emplace_back(file, std::move(entry));
      }
    }
    return true;
  }

  // Writes the kept entries, oldest first, each to the file it was meant for. Returns 0 or the errno
  // of the first that still fails (it and those after it stay kept).
  int write_pending_locked() {
    while (!pending_.empty()) {
      if (const int err = append(pending_.front().first, pending_.front().second)) return err;
      pending_bytes_ -= pending_.front().second.size();
      pending_.pop_front();
    }
    return 0;
  }

  std::string file_path_locked() const { return file_path_of(dir_); }
  static std::string file_path_of(const std::string& dir) {
    if (dir.empty()) return kFileName;
    return dir.back() == '/' ? dir + kFileName : dir + "/" + kFileName;
  }

  // Local time with a numeric UTC offset, e.g. "2025-01-31 14:03:07 +0800".
  static std::string timestamp() {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    char buf[64];
    if (::localtime_r(&now, &tm) == nullptr || std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %z", &tm) == 0)
      return "0000-00-00 00:00:00 +0000";
    return buf;
  }

  static std::string type_name(const std::exception& e) {
    const char* raw = typeid(e).name();
    int status = 0;
    char* demangled = abi::__cxa_demangle(raw, nullptr, nullptr, &status);
    std::string out = (status == 0 && demangled != nullptr) ? demangled : raw;
    std::free(demangled);
    return out;
  }

  // Appends with O_APPEND so entries from several processes sharing a directory do not overwrite
  // each other. Creates the directory if the dumper has not done so yet. Returns 0 or an errno.
  static int append(const std::string& file, const std::string& entry) {
    int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0 && errno == ENOENT) {
      const std::size_t slash = file.rfind('/');
      if (slash != std::string::npos && slash != 0) {
        try {
          create_directories(file.substr(0, slash));
        } catch (const IoError& e) {
          return e.error_code();
        }
        fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
      }
    }
    if (fd < 0) return errno;
    if (const int err = write_all(fd, entry.data(), entry.size())) {
      ::close(fd);
      return err;
    }
    return ::close(fd) == 0 || errno == EINTR ? 0 : errno;
  }

  // One line on stderr, with the message's first line (its reason may differ from the log's);
  // written with ::write so that no stream state or exception gets involved.
  static void fallback(const std::string& file, int err, std::string_view what, std::string_view name,
                       std::string_view message) {
    std::string line = "torchprobe: cannot write '" + file + "' (" + errno_text(err) + "); " + std::string(what) +
                       " failed: name=" + std::string(name) + ": " +
                       std::string(message.substr(0, message.find('\n'))) + "\n";
    (void)!::write(STDERR_FILENO, line.data(), line.size());
  }

  mutable std::mutex mu_;
  std::string dir_;
  std::set<std::tuple<std::string, std::string, std::string>> seen_;  // {file, what, kind}
  std::deque<std::pair<std::string, std::string>> pending_;           // {file, entry} not written yet
  std::size_t pending_bytes_ = 0;
};

}  // namespace torchprobe::io

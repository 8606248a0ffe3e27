#pragma once
// File-system helpers for the dump writer (POSIX).
//
// Dump files are rewritten while the program runs, often on shared or nearly full disks. The rules
// here exist so that a failure is loud and harmless: every error names the path and the OS reason,
// and a file that is being replaced keeps its old content until the new content is fully on disk.
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

namespace torchprobe::io {

namespace details {
// strerror() is not thread-safe and strerror_r has two incompatible signatures (GNU returns the
// text, XSI fills the buffer); overloads on the result type accept either.
inline std::string strerror_text(const char* gnu_result, const char* /*buf*/) {
  return gnu_result != nullptr ? gnu_result : "Unknown error";
}
inline std::string strerror_text(int xsi_rc, const char* buf) { return xsi_rc == 0 ? buf : "Unknown error"; }
}  // namespace details

// The OS's words for an errno value (e.g. "No space left on device").
inline std::string errno_text(int err) {
  char buf[256];
  buf[0] = '\0';
  return details::strerror_text(strerror_r(err, buf, sizeof buf), buf);
}

// A failed file-system operation. what() reads "torchprobe: cannot <action> '<path>': <reason>".
class IoError : public std::runtime_error {
 public:
  IoError(const std::string& action, std::string path, int err)
      : std::runtime_error("torchprobe: cannot " + action + " '" + path + "': " + errno_text(err)),
        path_(std::move(path)),
        err_(err) {}
  const std::string& path() const noexcept { return path_; }
  int error_code() const noexcept { return err_; }  // the errno value

 private:
  std::string path_;
  int err_;
};

// Writes all n bytes to `fd`, retrying on EINTR and after short writes (signals, pipes, a size
// limit or a disk filling up mid-way: the next call then reports the reason). Returns 0 or the
// errno value; a write that makes no progress without an error counts as a full device (ENOSPC).
inline int write_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n < (std::size_t{1} << 30) ? n : (std::size_t{1} << 30));  // Linux: < 2 GiB a call
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : ENOSPC;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return 0;
}

// mkdir -p. New directories get `mode` (minus the umask, as for any mkdir); existing ones, and the
// path itself if it already exists as a directory (or a link to one), are left as they are.
inline void create_directories(const std::string& path, mode_t mode = 0750) {
  if (path.empty()) throw IoError("create directory", path, ENOENT);
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    const std::string prefix = path.substr(0, pos);
    if (prefix.empty() || prefix.back() == '/') continue;  // leading or doubled slashes
    if (::mkdir(prefix.c_str(), mode) == 0) continue;
    const int err = errno;
    struct stat st;
    if (err == EEXIST && ::stat(prefix.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) continue;
      throw IoError("create directory", prefix, ENOTDIR);
    }
    throw IoError("create directory", prefix, err);
  }
}

// create_directories(path), with a failure told as what was being made ("create the dump
// directory") and the whole path, whichever of its parents failed.
inline void create_directories_for(const char* what, const std::string& path) {
  try {
    create_directories(path);
  } catch (const IoError& e) {
    throw IoError(what, path, e.error_code());
  }
}

// A directory made before the first file that goes to it and not again for the next ones: for
// files that come seldom (the live check's), where making it with every step would cost a mkdir a
// step. Thread-safe; throws as create_directories_for.
class DirectoryOnce {
 public:
  void make(const char* what, const std::string& dir) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (made_ == dir) return;
      made_ = dir;
    }
    create_directories_for(what, dir);
  }

 private:
  std::mutex mu_;
  std::string made_;
};

// A file that replaces `path` when committed, so that readers (and a crash at any moment) see
// either the old or the new file, never a prefix: the data goes to a temporary file in the same
// directory, is flushed with fsync (skipped when sync is false: then a process crash is still safe,
// a power loss is not) and is renamed over the target. On any error, or when destroyed without
// commit(), the temporary file is removed and the target is untouched; IoError says which path
// failed and why (ENOSPC, EFBIG, EACCES, ...). A symbolic link at `path` is replaced by a regular
// file. The new file gets `mode` minus the umask. Content may be written in any number of pieces.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path, mode_t mode = 0640) : path_(std::move(path)) {
    const std::size_t slash = path_.rfind('/');
    dir_prefix_ = slash == std::string::npos ? std::string() : path_.substr(0, slash + 1);
    const std::string base = slash == std::string::npos ? path_ : path_.substr(slash + 1);
    if (base.empty() || base == "." || base == "..") throw IoError("write file", path_, EISDIR);
    // Hidden, unique per process and call; the base name is shortened so the temporary name stays
    // under NAME_MAX even when the target's name is near it.
    static std::atomic<unsigned> counter{0};
    tmp_ = dir_prefix_ + "." + base.substr(0, 200) + ".tmp" + std::to_string(::getpid()) + "." +
           std::to_string(counter.fetch_add(1));
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd_ < 0) throw IoError("write file", path_, errno);  // the caller knows `path`, not the temporary
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }

  void write(std::string_view content) {
    if (const int err = write_all(fd_, content.data(), content.size())) fail(err);
  }

  void commit(bool sync = true) {
    if (sync) {
      int rc;
      do rc = ::fsync(fd_);
      while (rc != 0 && errno == EINTR);
      if (rc != 0) fail(errno);
    }
    // close() can report delayed write errors (NFS, quotas). It must not be retried on EINTR: Linux
    // has released the descriptor already.
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0 && errno != EINTR) fail(errno);
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail(errno);
    committed_ = true;
    if (sync) {  // make the rename itself durable; best effort, the data is already safe
      const std::string dir = dir_prefix_.empty() ? std::string(".") : dir_prefix_;
      const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd >= 0) {
        (void)::fsync(dfd);
        ::close(dfd);
      }
    }
  }

 private:
  [[noreturn]] void fail(int err) { throw IoError("write file", path_, err); }

  std::string path_;
  std::string dir_prefix_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Replaces `path` with `content` (AtomicFile says how).
inline void write_file_atomic(const std::string& path, std::string_view content, mode_t mode = 0640, bool sync = true) {
  AtomicFile f(path, mode);
  f.write(content);
  f.commit(sync);
}

// Turns an op- or module-derived name into one safe path component. Ordinary msprobe names such as
// "Aten.add_.0.forward.input.0.pt" or "Module.layers.0.Linear.forward.0.input.0.pt" come back
// unchanged. Otherwise: '/' and NUL become '_' (a name must not reach into another directory or cut
// the C string short), a leading '-' gets a '_' in front (not an option to shell tools), "", "." and
// ".." become "_", "_." and "_..". Names longer than NAME_MAX (255 bytes) are shortened to a prefix
// plus a hash of the whole name, keeping a short extension such as ".pt", so distinct long names
// stay distinct and open() does not fail with ENAMETOOLONG.
inline std::string safe_component(std::string_view name) {
  std::string out;
  out.reserve(name.size() + 1);
  if (name.empty() || name == "." || name == ".." || name.front() == '-') out.push_back('_');
  if (name.empty()) return out;
  if (name == "." || name == "..") {
    out.append(name);  // "_." / "_.."
    return out;
  }
  for (char c : name) out.push_back(c == '/' || c == '\0' ? '_' : c);

  constexpr std::size_t kNameMax = 255;
  if (out.size() > kNameMax) {
    std::uint64_t h = 14695981039346656037ull;  // FNV-1a of the original name
    for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    char tag[20];
    std::snprintf(tag, sizeof tag, "~%016llx", static_cast<unsigned long long>(h));
    std::string ext;
    const std::size_t dot = out.rfind('.');
    if (dot != std::string::npos && out.size() - dot <= 16) ext = out.substr(dot);
    out.resize(kNameMax - ext.size() - 17);
    out += tag;
    out += ext;
  }
  return out;
}

// True when `path` is an existing directory this process may create files in. Otherwise false, with
// the reason in *why (if given), e.g. "'/data/dump' is not a directory".
inline bool path_is_writable_dir(const std::string& path, std::string* why = nullptr) {
  auto no = [&](const std::string& reason) {
    if (why != nullptr) *why = "'" + path + "' " + reason;
    return false;
  };
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return no("cannot be used: " + errno_text(errno));
  if (!S_ISDIR(st.st_mode)) return no("is not a directory");
  // access() checks the real ids, which is what matters for an ordinary (non-setuid) program, and
  // reports EROFS for read-only mounts even to root.
  if (::access(path.c_str(), W_OK | X_OK) != 0) return no("is not writable: " + errno_text(errno));
  if (why != nullptr) why->clear();
  return true;
}

}  // namespace torchprobe::io

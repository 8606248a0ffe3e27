#pragma once
// dump_enable (msprobe's dynamic start/stop, config key "dump_enable"): the config file is watched
// and a change takes effect at the next step(). This is the watching half: whether the file changed
// since the last change reported, by its modification time, size and inode (an editor that saves
// through a new file and a rename changes the inode). PrecisionDebugger asks at every step(): one
// stat() per training step costs less than msprobe's polling thread (0.5 s) and no change is seen
// in the middle of a step.
#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

namespace torchprobe {

class ConfigFileWatch {
 public:
  explicit ConfigFileWatch(std::string path) : path_(std::move(path)), seen_(stamp()) {}

  // True once per change of the file (a file that disappears is a change too).
  bool changed() {
    const Stamp now = stamp();
    if (now == seen_) return false;
    seen_ = now;
    return true;
  }
  const std::string& path() const { return path_; }

 private:
  using Stamp = std::tuple<bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;  // exists, s, ns, size, inode

  Stamp stamp() const {
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0) return {false, 0, 0, 0, 0};
    return {true, static_cast<std::int64_t>(st.st_mtim.tv_sec), static_cast<std::int64_t>(st.st_mtim.tv_nsec),
            static_cast<std::int64_t>(st.st_size), static_cast<std::int64_t>(st.st_ino)};
  }

  std::string path_;
  Stamp seen_;
};

}  // namespace torchprobe

#pragma once
// The progress of a long compare on stderr: on a terminal one bar redrawn in place
// ("\r<what> [#####     ]  50% 2000/4000"), elsewhere (a log file, CI) one plain line per tenth,
// so that a log is not filled with carriage returns.
#include <algorithm>
#include <cstddef>
#include <ostream>
#include <string>
#include <utility>

namespace torchprobe::compare {

class Progress {
 public:
  // `total` steps; nothing is written when `enabled` is false.
  Progress(std::ostream& out, std::string what, std::size_t total, bool tty, bool enabled)
      : out_(out), what_(std::move(what)), total_(total), tty_(tty), enabled_(enabled && total > 0) {}
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress() { finish(); }

  void advance(std::size_t n = 1) {
    done_ = std::min(total_, done_ + n);
    if (!enabled_) return;
    const std::size_t shown = tty_ ? done_ * 100 / total_ : done_ * 10 / total_ * 10;  // percent
    if (shown == shown_) return;
    shown_ = shown;
    draw();
  }

  // Ends the bar's line on a terminal; called by the destructor as well.
  void finish() {
    if (finished_) return;
    finished_ = true;
    if (enabled_ && tty_ && shown_ > 0) out_ << "\n" << std::flush;
  }

 private:
  void draw() {
    if (tty_) {
      constexpr std::size_t kWidth = 30;
      const std::size_t filled = done_ * kWidth / total_;
      out_ << "\r" << what_ << " [" << std::string(filled, '#') << std::string(kWidth - filled, ' ') << "] "
           << (shown_ < 10    ? "  "
               : shown_ < 100 ? " "
                              : "")
           << shown_ << "% " << done_ << "/" << total_ << std::flush;
    } else {
      out_ << what_ << ": " << shown_ << "% (" << done_ << "/" << total_ << ")\n" << std::flush;
    }
  }

  std::ostream& out_;
  std::string what_;
  std::size_t total_, done_ = 0, shown_ = 0;
  bool tty_, enabled_, finished_ = false;
};

}  // namespace torchprobe::compare

#pragma once
// dump.json (or debug.json) made from the step journal's lines instead of from the records: each
// entry's text is made once, by the journal's thread (io/journal.hpp), and the step writer only
// lays it out again (JsonText::relayout), which costs a fraction of making it. The bytes are those
// the records would give: the journal's body is the same writer's text on one line, and the
// entries are placed as StepDump::by_first_place places the records (dump order; a name seen again
// keeps its first place and takes the later body), as recovery (io/recovery.hpp) places them.
//
// Only lines this process wrote are read, and only what the writer needs of them; anything
// unexpected (a line of another shape, a short read) makes read() fail, and the caller writes the
// file from the records instead. Memory: an index entry per line (about 48 bytes and the name)
// and a window of the file; the bodies are read again when written, mostly in file order.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "torchprobe/io/files.hpp"
#include "torchprobe/io/json_text.hpp"

namespace torchprobe::io {

class JournalDump {
 public:
  // The entries of `which` ("dump" or "debug") among the first `lines` lines after the header of
  // the journal at `path`, placed as the file lists them; nullopt when the journal cannot serve.
  static std::optional<JournalDump> read(const std::string& path, std::uint64_t lines, std::string_view which) {
    JournalDump d(path);
    if (d.fd_ < 0 || !d.index(lines, which)) return std::nullopt;
    d.place();
    return d;
  }

  JournalDump(JournalDump&& o) noexcept
      : path_(std::move(o.path_)),
        fd_(o.fd_),
        entries_(std::move(o.entries_)),
        names_(std::move(o.names_)),
        placed_(std::move(o.placed_)),
        listed_lines_(o.listed_lines_) {
    o.fd_ = -1;
  }
  JournalDump(const JournalDump&) = delete;
  JournalDump& operator=(const JournalDump&) = delete;
  JournalDump& operator=(JournalDump&&) = delete;
  ~JournalDump() {
    if (fd_ >= 0) ::close(fd_);
  }

  std::size_t size() const { return placed_.size(); }
  // Entry lines of `which` read, construct-only ones left out, before a repeated name is merged:
  // one per committed record that dump.json lists.
  std::size_t lines() const { return listed_lines_; }

  // The "data" object's items at depth 1 (`"name": body`), as step_text::write_dump writes them
  // from the records. Throws IoError when the journal cannot be read again.
  void write_items(JsonText& out) {
    Window window(fd_);
    for (std::size_t i = 0; i < placed_.size(); ++i) {
      const Entry& e = entries_[placed_[i]];
      const std::string_view line = window.line(e.at, e.length, path_);
      out.item(i, 1);
      out.raw(line.substr(e.name_at, e.name_length));
      out.raw(": ");
      out.relayout(line.substr(e.body_at, e.length - e.body_at - 1), 2);
      out.maybe_drain();
    }
  }

 private:
  struct Entry {
    std::uint64_t at = 0;                                     // the line's offset in the file
    std::uint64_t order = 0;                                  // "order"
    std::uint32_t length = 0;                                 // the line's, without its newline
    std::uint32_t name_at = 0, name_length = 0, body_at = 0;  // within the line; the name with its quotes
    std::uint64_t name = 0;                                   // its copy in names_
  };

  explicit JournalDump(std::string path) : path_(std::move(path)), fd_(::open(path_.c_str(), O_RDONLY | O_CLOEXEC)) {}

  // Reads the file once, front to back, keeping an Entry for each line of `which`.
  bool index(std::uint64_t lines, std::string_view which) {
    Window window(fd_);
    std::uint64_t at = 0, seen = 0;
    std::string_view line;
    if (!window.next(at, line) || line.rfind("{\"journal\": 1", 0) != 0) return false;  // the header
    at += line.size() + 1;
    for (; seen < lines; ++seen) {
      if (!window.next(at, line)) return false;  // fewer lines than queued: not all of them arrived
      if (line.rfind("{\"task_file\": ", 0) == 0) {
        at += line.size() + 1;
        continue;
      }
      Entry e;
      std::string_view file;
      if (!parse(line, e, file)) return false;
      if (file == which) {
        e.at = at;
        e.length = static_cast<std::uint32_t>(line.size());
        e.name = names_.size();
        names_.append(line.substr(e.name_at, e.name_length));
        entries_.push_back(e);
      }
      at += line.size() + 1;
    }
    return true;
  }

  // {"file": F, "name": N, "order": K, ["parent": P,] ["construct_only": true,] "body": B}, as
  // Recorder's entry line writes it.
  static bool parse(std::string_view line, Entry& e, std::string_view& file) {
    std::size_t p = 0;
    auto literal = [&](std::string_view s) {
      if (line.compare(p, s.size(), s) != 0) return false;
      p += s.size();
      return true;
    };
    auto string = [&]() -> bool {  // a JSON string at p, through its closing quote
      if (p >= line.size() || line[p] != '"') return false;
      for (++p; p < line.size(); ++p) {
        if (line[p] == '\\') {
          ++p;
        } else if (line[p] == '"') {
          ++p;
          return true;
        }
      }
      return false;
    };
    if (line.size() < 2 || line.size() > UINT32_MAX || line.back() != '}' || !literal("{\"file\": ")) return false;
    const std::size_t file_at = p;
    if (!string()) return false;
    file = line.substr(file_at + 1, p - file_at - 2);
    if (!literal(", \"name\": ")) return false;
    e.name_at = static_cast<std::uint32_t>(p);
    if (!string()) return false;
    e.name_length = static_cast<std::uint32_t>(p - e.name_at);
    if (!literal(", \"order\": ")) return false;
    const std::size_t digits = p;
    e.order = 0;
    for (; p < line.size() && line[p] >= '0' && line[p] <= '9'; ++p)
      e.order = e.order * 10 + static_cast<std::uint64_t>(line[p] - '0');
    if (p == digits || p - digits > 19) return false;
    if (literal(", \"parent\": ") && !literal("null") && !string()) return false;
    bool construct_only = literal(", \"construct_only\": true");
    if (!literal(", \"body\": ") || p >= line.size() - 1) return false;
    e.body_at = static_cast<std::uint32_t>(p);
    if (construct_only) e.order = kConstructOnly;
    return true;
  }

  // Dump order; a name seen again keeps its first place and takes the later body; construct-only
  // entries (construct.json alone) are left out.
  void place() {
    std::vector<std::uint32_t> by_order(entries_.size());
    for (std::uint32_t i = 0; i < by_order.size(); ++i) by_order[i] = i;
    auto earlier = [this](std::uint32_t a, std::uint32_t b) { return entries_[a].order < entries_[b].order; };
    if (!std::is_sorted(by_order.begin(), by_order.end(), earlier))
      std::stable_sort(by_order.begin(), by_order.end(), earlier);
    std::unordered_map<std::string_view, std::size_t> where;
    where.reserve(entries_.size());
    placed_.reserve(entries_.size());
    for (const std::uint32_t i : by_order) {
      const Entry& e = entries_[i];
      if (e.order == kConstructOnly) continue;
      ++listed_lines_;
      const auto [it, fresh] = where.emplace(std::string_view(names_).substr(e.name, e.name_length), placed_.size());
      if (fresh)
        placed_.push_back(i);
      else
        placed_[it->second] = i;
    }
  }

  // Reads the file through a buffer of about kWindow bytes that moves forward; a line behind it or
  // far ahead (an enclosing module's entry, written after the calls it encloses) is read apart.
  class Window {
   public:
    explicit Window(int fd) : fd_(fd) {}

    // The line starting at `at`, without its newline; false at the end of the file, at a last line
    // without its newline, or when the file cannot be read.
    bool next(std::uint64_t at, std::string_view& line) {
      std::size_t want = kWindow;
      for (;;) {
        if (at >= start_ && at - start_ <= text_.size()) {
          const std::string_view rest = std::string_view(text_).substr(at - start_);
          const std::size_t nl = rest.find('\n');
          if (nl != std::string_view::npos) {
            line = rest.substr(0, nl);
            return true;
          }
          if (at_end_) return false;
          want = std::max(want, 2 * rest.size());
        }
        if (!fill(at, want)) return false;
      }
    }

    // The `length` bytes at `at` (a line next() found before). Throws IoError.
    std::string_view line(std::uint64_t at, std::uint32_t length, const std::string& path) {
      if (at >= start_ && at + length <= start_ + text_.size())
        return std::string_view(text_).substr(at - start_, length);
      if (at >= start_ && at <= start_ + text_.size() + kWindow) {  // just ahead: the window moves on
        if (fill(at, std::max<std::size_t>(kWindow, length)) && length <= text_.size())
          return std::string_view(text_).substr(0, length);
      } else {
        apart_.resize(length);
        if (read_at(apart_.data(), length, at) == length) return apart_;
      }
      throw IoError("read the journal again", path, errno != 0 ? errno : EIO);
    }

   private:
    static constexpr std::size_t kWindow = std::size_t{1} << 20;

    // The window starts at `at` and holds up to `bytes` of the file.
    bool fill(std::uint64_t at, std::size_t bytes) {
      text_.resize(bytes);
      const std::size_t got = read_at(text_.data(), bytes, at);
      if (got == kFailed) return false;
      text_.resize(got);
      start_ = at;
      at_end_ = got < bytes;
      return true;
    }
    static constexpr std::size_t kFailed = static_cast<std::size_t>(-1);
    // Bytes read (fewer at the end of the file), or kFailed.
    std::size_t read_at(char* to, std::size_t bytes, std::uint64_t at) const {
      std::size_t got = 0;
      while (got < bytes) {
        const ssize_t n = ::pread(fd_, to + got, bytes - got, static_cast<off_t>(at + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return kFailed;
        if (n == 0) break;
        got += static_cast<std::size_t>(n);
      }
      return got;
    }

    int fd_;
    std::string text_;  // the file's bytes from start_
    std::uint64_t start_ = 0;
    bool at_end_ = false;  // text_ reaches the end of the file
    std::string apart_;    // a line read outside the window
  };

  static constexpr std::uint64_t kConstructOnly = UINT64_MAX;

  std::string path_;
  int fd_ = -1;
  std::vector<Entry> entries_;
  std::string names_;                  // every entry's name, one after the other
  std::vector<std::uint32_t> placed_;  // indices into entries_, in the file's order
  std::size_t listed_lines_ = 0;
};

}  // namespace torchprobe::io

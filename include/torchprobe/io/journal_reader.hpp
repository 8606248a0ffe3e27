#pragma once
// A step journal (io/journal.hpp) read back for recovery (io/recovery.hpp): its header, entry,
// task-file and trailer lines as spans of the file's text (io/json_spans.hpp), and the entries
// assembled in dump order.
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "torchprobe/io/json_spans.hpp"

namespace torchprobe::io::recovery::details {

struct JournalText {
  std::string text;  // the file: the values below point into it
  std::optional<Value> header;
  std::vector<Value> entries;
  std::vector<std::pair<std::string, std::string>> task_files;  // {"task_file": NAME, "text": CONTENT}
  std::optional<std::int64_t> trailer;
  std::size_t lines() const {
    return entries.size() + task_files.size();
  }  // what the trailer counts  // the entry count of the last line {"end": true, "entries": K}
};

struct ReadError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline bool is_header(const Value& v) {
  if (v.kind != Value::kObject) return false;
  const Value *j = v.find("journal"), *t = v.find("task"), *l = v.find("level");
  return j && j->raw == "1" && t && t->is_string() && l && l->is_string();
}
inline bool is_trailer(const Value& v) {
  if (v.kind != Value::kObject) return false;
  const Value *e = v.find("end"), *n = v.find("entries");
  return e && e->raw == "true" && n && n->is_int();
}
inline bool is_task_file(const Value& v) {
  if (v.kind != Value::kObject) return false;
  const Value *n = v.find("task_file"), *t = v.find("text");
  if (!n || !n->is_string() || !t || !t->is_string()) return false;
  const std::string name = n->text();
  return !name.empty() && name.find('/') == std::string::npos && name[0] != '.';
}
inline bool is_entry(const Value& v) {
  if (v.kind != Value::kObject) return false;
  const Value *f = v.find("file"), *n = v.find("name"), *o = v.find("order"), *b = v.find("body");
  return f && (f->raw == "\"dump\"" || f->raw == "\"debug\"") && n && n->is_string() && o && o->is_int() && b;
}

// Reads `path`; a last line cut short is skipped with a warning on `err` (as recover_dump.py).
inline void read_journal(const std::string& path, JournalText& j, std::ostream& err) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int e = errno;
    throw ReadError("[Errno " + std::to_string(e) + "] " + std::strerror(e) + ": '" + path + "'");
  }
  j.text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  std::vector<std::string_view> lines;
  const std::string_view all(j.text);
  for (std::size_t start = 0;;) {
    const std::size_t nl = all.find('\n', start);
    lines.push_back(all.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start));
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::size_t number = i + 1;
    const std::string_view raw = lines[i];
    if (raw.find_first_not_of(" \t\r\n\v\f") == std::string_view::npos) continue;
    Value v;
    if (!Reader(raw).read(v)) {
      if (number + 1 >= lines.size()) {  // the last line: written in part when the process died
        err << path << ": ignoring the incomplete last line\n";
        continue;
      }
      throw ReadError(path + ":" + std::to_string(number) + ": not a JSON line");
    }
    if (!j.header) {
      if (!is_header(v))
        throw ReadError(path + ": not a TorchProbe journal (first line: " + bytes_repr(raw.substr(0, 80)) + ")");
      j.header = std::move(v);
    } else if (is_trailer(v)) {
      const std::string_view raw_count = v.find("entries")->raw;
      std::int64_t count = 0;
      const auto parsed = std::from_chars(raw_count.data(), raw_count.data() + raw_count.size(), count);
      if (parsed.ec != std::errc() || parsed.ptr != raw_count.data() + raw_count.size())
        throw ReadError(path + ":" + std::to_string(number) + ": the end line's entry count " + std::string(raw_count) +
                        " is not a count");
      j.trailer = count;
    } else if (is_task_file(v)) {
      j.task_files.emplace_back(v.find("task_file")->text(), v.find("text")->text());
      j.trailer.reset();
    } else {
      if (!is_entry(v))
        throw ReadError(path + ":" + std::to_string(number) + ": not a journal entry (no file, name, order or body)");
      j.entries.push_back(std::move(v));
      j.trailer.reset();  // the step went on after an earlier end (started again in the same directory)
    }
  }
}

// {name: body} in dump order, and {name: parent}: a repeated name keeps its first place and takes
// the last body.
struct Assembled {
  std::vector<std::pair<std::string_view, const Value*>> data, parents;
};
inline Assembled assemble(const std::vector<Value>& entries, std::string_view which) {
  std::vector<const Value*> chosen;
  const std::string file = "\"" + std::string(which) + "\"";
  for (const Value& e : entries)
    if (e.find("file")->raw == file) chosen.push_back(&e);
  std::stable_sort(chosen.begin(), chosen.end(), [](const Value* a, const Value* b) {
    return std::stoll(std::string(a->find("order")->raw)) < std::stoll(std::string(b->find("order")->raw));
  });
  Assembled out;
  std::unordered_map<std::string_view, std::size_t> data_at, parent_at;
  auto put = [](auto& list, auto& at, std::string_view name, const Value* v) {
    const auto [it, fresh] = at.emplace(name, list.size());
    if (fresh)
      list.emplace_back(name, v);
    else
      list[it->second].second = v;
  };
  for (const Value* e : chosen) {
    const std::string_view name = e->find("name")->raw;
    const Value* only = e->find("construct_only");
    if (!(only && only->raw == "true")) put(out.data, data_at, name, e->find("body"));
    if (const Value* p = e->find("parent")) put(out.parents, parent_at, name, p);
  }
  return out;
}

}  // namespace torchprobe::io::recovery::details

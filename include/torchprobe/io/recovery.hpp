#pragma once
// `torchprobe recover DUMP [--check] [--keep-journal]`: rebuilds the JSON files of the steps whose
// journal (io/journal.hpp) is still there, and says what it could not recover. The same behaviour,
// messages and exit statuses as tools/recover_dump.py (whose docstring is the user's description;
// a test runs both on the same journals and compares every file and message).
//
// The journal's lines are Python-compatible JSON text made by io::JsonText; dump.json is made from
// that text, re-indented as json.dump(obj, f, indent=1) writes it (numbers, strings and NaN or
// Infinity keep the journal's spelling, which is the writer's), so a step that ended (its trailer
// line says how many entry lines it had, and they are all there) comes back byte for byte as
// TorchProbe writes it. A step without its trailer, with fewer entry lines than the trailer counts,
// or with tensor files missing, is written from what is there with a top-level
// "torchprobe_recovery": {"complete": false, "entries_recovered": N, "missing": "..."} beside
// msprobe's keys, a line in its dump_error_info.log, and exit status 3; a journal with its header
// only is "lost": reported, no dump.json.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <ostream>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "torchprobe/io/error_log.hpp"
#include "torchprobe/io/files.hpp"
#include "torchprobe/io/journal.hpp"
#include "torchprobe/io/json_text.hpp"

namespace torchprobe::io::recovery {

constexpr int kIncomplete = 3;  // exit status: a step recovered incomplete, or lost
constexpr const char* kUsage =
    "usage: torchprobe recover [--check] [--keep-journal] PATH [PATH ...]\n"
    "  rebuilds dump.json, construct.json and debug.json of every interrupted step below each PATH (a dump_path,\n"
    "  step directory or rank directory) from its journal.jsonl, as tools/recover_dump.py does.\n"
    "  --check         report only; change nothing\n"
    "  --keep-journal  leave journal.jsonl in place\n"
    "  exit status: 0 every step recovered whole (or none found), 3 a step incomplete or lost (dump.json says\n"
    "  what is missing in \"torchprobe_recovery\"), 1 a path missing or a journal unreadable, 2 bad arguments\n";

namespace detail {

// A JSON value as spans of the line's text: objects and arrays keep their members, the rest is raw.
struct Value {
  enum Kind { kObject, kArray, kString, kNumber, kLiteral } kind = kLiteral;
  std::string_view raw;                                     // the value's whole text
  std::vector<std::pair<std::string_view, Value>> members;  // objects: (key's raw text, value); arrays: ("", item)

  const Value* find(std::string_view key) const {  // the last member of that name, as Python's json keeps
    const Value* found = nullptr;
    const std::string quoted = "\"" + std::string(key) + "\"";
    for (const auto& [k, v] : members)
      if (k == quoted) found = &v;
    return found;
  }
  bool is_string() const { return kind == kString; }
  bool is_int() const {
    if (kind != kNumber) return false;
    return raw.find_first_of(".eE") == std::string_view::npos;
  }
  std::string text() const {  // a string's value
    try {
      return nlohmann::json::parse(raw).get<std::string>();
    } catch (const std::exception&) {
      return std::string(raw);
    }
  }
};

// A validating reader of one JSON text (Python's json.loads: also NaN, Infinity, -Infinity).
class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  bool read(Value& v) {
    skip();
    if (!value(v, 0)) return false;
    skip();
    return p_ == s_.size();
  }

 private:
  void skip() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\t' || s_[p_] == '\n' || s_[p_] == '\r')) ++p_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(p_, word.size()) != word) return false;
    p_ += word.size();
    return true;
  }
  bool string_token() {
    if (p_ >= s_.size() || s_[p_] != '"') return false;
    for (++p_; p_ < s_.size(); ++p_) {
      const char c = s_[p_];
      if (c == '"') {
        ++p_;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c == '\\') {
        if (++p_ >= s_.size()) return false;
        const char e = s_[p_];
        if (e == 'u') {
          for (int i = 0; i < 4; ++i)
            if (++p_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[p_]))) return false;
        } else if (std::strchr("\"\\/bfnrt", e) == nullptr || e == '\0') {
          return false;
        }
      }
    }
    return false;
  }
  bool number() {
    const std::size_t start = p_;
    if (p_ < s_.size() && s_[p_] == '-') ++p_;
    if (literal("Infinity")) return true;
    const std::size_t digits = p_;
    if (p_ < s_.size() && s_[p_] == '0')
      ++p_;
    else
      while (p_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p_]))) ++p_;
    if (p_ == digits) return false;
    if (p_ < s_.size() && s_[p_] == '.') {
      const std::size_t f = ++p_;
      while (p_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p_]))) ++p_;
      if (p_ == f) return false;
    }
    if (p_ < s_.size() && (s_[p_] == 'e' || s_[p_] == 'E')) {
      ++p_;
      if (p_ < s_.size() && (s_[p_] == '+' || s_[p_] == '-')) ++p_;
      const std::size_t e = p_;
      while (p_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p_]))) ++p_;
      if (p_ == e) return false;
    }
    return p_ > start;
  }
  bool value(Value& v, int depth) {
    if (depth > 512 || p_ >= s_.size()) return false;
    const std::size_t start = p_;
    const char c = s_[p_];
    bool ok = false;
    if (c == '{' || c == '[') {
      v.kind = c == '{' ? Value::kObject : Value::kArray;
      const char close = c == '{' ? '}' : ']';
      ++p_;
      skip();
      if (p_ < s_.size() && s_[p_] == close) {
        ++p_;
        ok = true;
      } else {
        for (;;) {
          skip();
          std::string_view key;
          if (v.kind == Value::kObject) {
            const std::size_t k = p_;
            if (!string_token()) return false;
            key = s_.substr(k, p_ - k);
            skip();
            if (p_ >= s_.size() || s_[p_] != ':') return false;
            ++p_;
            skip();
          }
          Value item;
          if (!value(item, depth + 1)) return false;
          v.members.emplace_back(key, std::move(item));
          skip();
          if (p_ < s_.size() && s_[p_] == ',') {
            ++p_;
            continue;
          }
          if (p_ < s_.size() && s_[p_] == close) {
            ++p_;
            ok = true;
          }
          break;
        }
      }
    } else if (c == '"') {
      v.kind = Value::kString;
      ok = string_token();
    } else if (c == 't' || c == 'f' || c == 'n' || c == 'N') {
      v.kind = Value::kLiteral;
      ok = literal("true") || literal("false") || literal("null") || literal("NaN");
    } else {
      v.kind = Value::kNumber;
      ok = number();
    }
    if (ok) v.raw = s_.substr(start, p_ - start);
    return ok;
  }

  std::string_view s_;
  std::size_t p_ = 0;
};

// `v` as json.dump(v, f, indent=1) writes it at nesting `depth`.
inline void write_indented(std::string& out, const Value& v, int depth) {
  if ((v.kind != Value::kObject && v.kind != Value::kArray) || v.members.empty()) {
    out.append(v.raw);
    return;
  }
  const bool object = v.kind == Value::kObject;
  out += object ? '{' : '[';
  for (std::size_t i = 0; i < v.members.size(); ++i) {
    out += i == 0 ? "\n" : ",\n";
    out.append(static_cast<std::size_t>(depth + 1), ' ');
    if (object) out.append(v.members[i].first).append(": ");
    write_indented(out, v.members[i].second, depth + 1);
  }
  out += '\n';
  out.append(static_cast<std::size_t>(depth), ' ');
  out += object ? '}' : ']';
}

inline std::string python_string(std::string_view s) {  // a JSON string as Python's json.dump writes it
  std::string out;
  JsonText t(out, 1);
  t.string(s);
  t.finish();
  return out;
}

// Python's repr() of a bytes object, as the tool's messages show a bad first line.
inline std::string bytes_repr(std::string_view b) {
  const bool dq = b.find('\'') != std::string_view::npos && b.find('"') == std::string_view::npos;
  const char q = dq ? '"' : '\'';
  std::string out = "b";
  out += q;
  for (const char ch : b) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\' || c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += ch;
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += q;
  return out;
}

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
      j.trailer = std::stoll(std::string(v.find("entries")->raw));
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

inline void referenced_files(const Value& v, std::vector<std::string>& out) {
  if (v.kind == Value::kObject) {
    const Value* name = v.find("data_name");
    if (name && name->is_string()) out.push_back(name->text());
  }
  for (const auto& m : v.members) referenced_files(m.second, out);
}

inline std::string raw_or(const Value& header, std::string_view key, std::string_view fallback) {
  const Value* v = header.find(key);
  if (!v) return std::string(fallback);
  std::string out;
  write_indented(out, *v, 1);
  return out;
}

inline std::string members_text(const std::vector<std::pair<std::string_view, const Value*>>& list, int depth) {
  if (list.empty()) return "{}";
  std::string out = "{";
  for (std::size_t i = 0; i < list.size(); ++i) {
    out += i == 0 ? "\n" : ",\n";
    out.append(static_cast<std::size_t>(depth + 1), ' ');
    out.append(list[i].first).append(": ");
    write_indented(out, *list[i].second, depth + 1);
  }
  out += '\n';
  out.append(static_cast<std::size_t>(depth), ' ');
  out += '}';
  return out;
}

inline std::string top_level(const Value& header, const std::string& level_raw, const Assembled& a,
                             const std::string& missing) {
  std::string out = "{\n \"task\": " + raw_or(header, "task", "null") + ",\n \"level\": " + level_raw +
                    ",\n \"framework\": " + raw_or(header, "framework", "\"pytorch\"") +
                    ",\n \"dump_data_dir\": " + raw_or(header, "dump_data_dir", "null") +
                    ",\n \"data\": " + members_text(a.data, 1);
  if (!missing.empty())
    out += ",\n \"torchprobe_recovery\": {\n  \"complete\": false,\n  \"entries_recovered\": " +
           std::to_string(a.data.size()) + ",\n  \"missing\": " + python_string(missing) + "\n }";
  out += "\n}";
  return out;
}

inline bool flag(const Value& header, std::string_view key) {  // absent: true
  const Value* v = header.find(key);
  if (!v) return true;
  return !(v->raw == "false" || v->raw == "null" || v->raw == "0" || v->raw == "\"\"" || v->raw == "[]" ||
           v->raw == "{}" || v->raw == "0.0");
}

inline bool is_temp_tensor(const std::string& name) {
  static const std::regex re(R"(^\..+\.tmp\d+\.\d+$)");
  return std::regex_match(name, re);
}

inline void log_error(const std::string& rank_dir, const std::string& message) {
  ErrorLog log(rank_dir);
  log.log("recover_dump", rank_dir, "recovery", message);
}

enum class Outcome { kComplete, kIncomplete, kLost, kError };

inline Outcome recover(const std::filesystem::path& rank_path, bool check_only, bool keep_journal, std::ostream& out,
                       std::ostream& err) {
  namespace fs = std::filesystem;
  const std::string rank_dir = rank_path.string();
  const std::string journal_path = (rank_path / Journal::kFileName).string();
  JournalText j;
  try {
    read_journal(journal_path, j, err);
  } catch (const ReadError& e) {
    err << "error: " << e.what() << "\n";
    return Outcome::kError;
  }
  std::error_code ec;
  if (!j.header) {
    if (!check_only && !keep_journal) fs::remove(journal_path, ec);
    out << rank_dir << ": the journal is empty; nothing was recorded before the process stopped\n";
    return Outcome::kComplete;
  }
  const Value& header = *j.header;
  const fs::path tensor_dir = rank_path / "dump_tensor_data";
  auto clear_tensor_temporaries = [&] {
    if (!fs::is_directory(tensor_dir, ec)) return;
    std::vector<fs::path> temps;
    for (const auto& e : fs::directory_iterator(tensor_dir, ec))
      if (is_temp_tensor(e.path().filename().string())) temps.push_back(e.path());
    for (const auto& t : temps) fs::remove(t, ec);
  };
  if (j.lines() == 0 && !j.trailer) {
    const std::string message = "lost: the step was interrupted before any entry line reached its journal (at most " +
                                std::to_string(Journal::kMaxQueued) +
                                " were still queued); no dump.json is written for it";
    if (!check_only) {
      log_error(rank_dir, "torchprobe recover: " + rank_dir + ": " + message);
      clear_tensor_temporaries();
      if (!keep_journal) fs::remove(journal_path, ec);
    }
    out << rank_dir << ": " << message << "\n";
    return Outcome::kLost;
  }

  const Assembled dump = assemble(j.entries, "dump"), debug = assemble(j.entries, "debug");
  std::vector<std::string> missing_files;
  if (fs::is_directory(tensor_dir, ec)) {
    std::vector<std::string> names;
    for (const auto& [name, body] : dump.data) referenced_files(*body, names);
    for (const auto& [name, body] : debug.data) referenced_files(*body, names);
    std::set<std::string> absent;
    for (const std::string& n : names)
      if (!fs::exists(tensor_dir / n, ec)) absent.insert(n);
    missing_files.assign(absent.begin(), absent.end());
  }
  std::vector<std::string> missing;
  const std::size_t count = j.lines();
  if (!j.trailer)
    missing.push_back("the step was interrupted: the entry lines after the " + std::to_string(count) +
                      " written (at most " + std::to_string(Journal::kMaxQueued) +
                      ", still queued when the process stopped)");
  else if (static_cast<std::int64_t>(count) != *j.trailer)
    missing.push_back(std::to_string(*j.trailer - static_cast<std::int64_t>(count)) + " of the step's " +
                      std::to_string(*j.trailer) + " journal lines (not written: see " + ErrorLog::kFileName + ")");
  if (!missing_files.empty())
    missing.push_back(std::to_string(missing_files.size()) +
                      " tensor files (still queued when the process stopped), e.g. " + missing_files.front());
  std::string missing_text;
  for (const std::string& m : missing) missing_text += (missing_text.empty() ? "" : "; ") + m;

  std::vector<std::string> written;
  if (!check_only) {
    try {
      if (flag(header, "writes_dump")) {
        write_file_atomic((rank_path / "dump.json").string(),
                          top_level(header, raw_or(header, "level", "null"), dump, missing_text), 0640, false);
        written.push_back("dump.json");
        if (flag(header, "extra_info")) {
          write_file_atomic((rank_path / "construct.json").string(), members_text(dump.parents, 0), 0640, false);
          written.push_back("construct.json");
        }
      }
      if (!debug.data.empty()) {
        write_file_atomic((rank_path / "debug.json").string(), top_level(header, "\"debug\"", debug, missing_text),
                          0640, false);
        written.push_back("debug.json");
      }
      std::vector<std::pair<std::string, std::string>> task_files;  // the last hand-over's, first-seen order
      for (const auto& [name, text] : j.task_files) {
        auto it = std::find_if(task_files.begin(), task_files.end(), [&](const auto& f) { return f.first == name; });
        if (it == task_files.end())
          task_files.emplace_back(name, text);
        else
          it->second = text;
      }
      for (const auto& [name, text] : task_files) {
        write_file_atomic((rank_path / name).string(), text, 0640, false);
        written.push_back(name);
      }
    } catch (const IoError& e) {
      err << "error: " << e.what() << "\n";
      return Outcome::kError;
    }
    if (!missing_text.empty())
      log_error(rank_dir, "torchprobe recover: " + rank_dir + ": incomplete: recovered " +
                              std::to_string(dump.data.size()) + " dump entries and " +
                              std::to_string(debug.data.size()) + " debug entries; missing: " + missing_text);
    clear_tensor_temporaries();
    if (!keep_journal) fs::remove(journal_path, ec);
  }
  std::string what;
  for (const std::string& w : written) what += (what.empty() ? "" : ", ") + w;
  out << rank_dir << ": " << (check_only ? "would recover " : "recovered ") << dump.data.size() << " dump entries and "
      << debug.data.size() << " debug entries (" << (what.empty() ? "nothing written" : what) << ")\n";
  if (!missing_text.empty()) {
    out << rank_dir << ": incomplete: missing " << missing_text << "\n";
    return Outcome::kIncomplete;
  }
  return Outcome::kComplete;
}

// Python's pathlib spelling of a path given on the command line ("./a/" -> "a").
inline std::filesystem::path as_given(const std::string& arg) {
  std::filesystem::path p = std::filesystem::path(arg).lexically_normal();
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s.empty() ? std::filesystem::path(".") : std::filesystem::path(s);
}

// Files below `root` (root itself included when it is one) whose name `match` accepts, sorted as
// Python sorts paths.
template <class Match>
std::vector<std::filesystem::path> find_below(const std::filesystem::path& root, Match match, bool files_only) {
  namespace fs = std::filesystem;
  std::vector<fs::path> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (match(it->path().filename().string()) && (!files_only || it->is_regular_file(ec))) out.push_back(it->path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace detail

// The command: `args` without "recover". Returns the exit status.
inline int run_recover(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  namespace fs = std::filesystem;
  bool check = false, keep = false;
  std::vector<std::string> paths;
  for (const std::string& a : args) {
    if (a == "-h" || a == "--help") {
      out << kUsage;
      return 0;
    }
    if (a == "--check")
      check = true;
    else if (a == "--keep-journal")
      keep = true;
    else if (!a.empty() && a[0] == '-') {
      err << "torchprobe recover: unknown option '" << a << "'\n" << kUsage;
      return 2;
    } else
      paths.push_back(a);
  }
  if (paths.empty()) {
    err << "torchprobe recover: no PATH given\n" << kUsage;
    return 2;
  }
  static const std::regex temp_json(R"(^\..+\.json\.tmp\d+\.\d+$)");
  bool ok = true;
  int incomplete = 0, found = 0;
  std::error_code ec;
  for (const std::string& arg : paths) {
    const fs::path root = detail::as_given(arg);
    if (!fs::exists(root, ec)) {
      err << "error: " << root.string() << " does not exist\n";
      ok = false;
      continue;
    }
    std::vector<fs::path> journals;
    if (fs::is_regular_file(root / Journal::kFileName, ec))
      journals.push_back(root / Journal::kFileName);
    else
      journals = detail::find_below(
          root, [](const std::string& n) { return n == Journal::kFileName; }, false);
    if (!check) {
      const std::string prefix = std::string(".") + Journal::kFileName + ".tmp";
      for (const fs::path& p : detail::find_below(
               root, [&](const std::string& n) { return n.rfind(prefix, 0) == 0; }, false))
        fs::remove(p, ec);  // a journal being created: its step had recorded nothing yet
    }
    for (const fs::path& p : detail::find_below(
             root, [](const std::string& n) { return std::regex_match(n, temp_json); }, true)) {
      if (check) {
        out << p.string() << ": would remove (a JSON file that was being replaced)\n";
      } else {
        fs::remove(p, ec);
        out << p.string() << ": removed (a JSON file that was being replaced)\n";
      }
    }
    for (const fs::path& j : journals) {
      ++found;
      const detail::Outcome o = detail::recover(j.parent_path(), check, keep, out, err);
      if (o == detail::Outcome::kError) ok = false;
      if (o == detail::Outcome::kIncomplete || o == detail::Outcome::kLost) ++incomplete;
    }
  }
  if (found == 0) out << "no interrupted step found (no journal.jsonl)\n";
  if (incomplete) err << incomplete << " step(s) incomplete or lost (see above)\n";
  out.flush();
  return !ok ? 1 : incomplete ? kIncomplete : 0;
}

}  // namespace torchprobe::io::recovery

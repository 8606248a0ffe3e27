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

#include "torchprobe/io/dump_header.hpp"
#include "torchprobe/io/error_log.hpp"
#include "torchprobe/io/files.hpp"
#include "torchprobe/io/journal.hpp"
#include "torchprobe/io/journal_reader.hpp"
#include "torchprobe/io/json_spans.hpp"
#include "torchprobe/io/json_text.hpp"
#include "torchprobe/io/rank_digest_spans.hpp"

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

namespace details {

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
  // The journal's header holds dump.json's own members (io/dump_header.hpp); the level is given.
  std::string out = "{";
  for (std::string_view key : DumpHeader::kKeys) {
    out.append("\n \"").append(key).append("\": ");
    if (key == "level")
      out += level_raw;
    else if (key == "framework")
      out += raw_or(header, key, "\"" + std::string(DumpHeader::kFramework) + "\"");
    else
      out += raw_or(header, key, "null");
    out += ',';
  }
  out += "\n \"data\": " + members_text(a.data, 1);
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
        if (const Value* digest = header.find("rank_digest"); digest && digest->raw == "true") {
          write_file_atomic((rank_path / kRankDigestFile).string(), digest_of_recovered(dump, missing_text), 0640,
                            false);
          written.push_back(kRankDigestFile);
        }
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
        const std::string& file = name;  // clang before 16 cannot capture a structured binding
        auto it = std::find_if(task_files.begin(), task_files.end(), [&](const auto& f) { return f.first == file; });
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

}  // namespace details

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
  // write_file_atomic's temporaries of the JSON files and of ranks_digest.bin.
  static const std::regex temp_file(R"(^\.(.+\.json|ranks_digest\.bin)\.tmp\d+\.\d+$)");
  bool ok = true;
  int incomplete = 0, found = 0;
  std::error_code ec;
  for (const std::string& arg : paths) {
    const fs::path root = details::as_given(arg);
    if (!fs::exists(root, ec)) {
      err << "error: " << root.string() << " does not exist\n";
      ok = false;
      continue;
    }
    std::vector<fs::path> journals;
    if (fs::is_regular_file(root / Journal::kFileName, ec))
      journals.push_back(root / Journal::kFileName);
    else
      journals = details::find_below(
          root, [](const std::string& n) { return n == Journal::kFileName; }, false);
    if (!check) {
      const std::string prefix = std::string(".") + Journal::kFileName + ".tmp";
      for (const fs::path& p : details::find_below(
               root, [&](const std::string& n) { return n.rfind(prefix, 0) == 0; }, false))
        fs::remove(p, ec);  // a journal being created: its step had recorded nothing yet
    }
    for (const fs::path& p : details::find_below(
             root, [](const std::string& n) { return std::regex_match(n, temp_file); }, true)) {
      const char* what =
          p.filename().string().rfind(".ranks_digest.bin.", 0) == 0 ? "the rank's digest" : "a JSON file";
      if (check) {
        out << p.string() << ": would remove (" << what << " that was being replaced)\n";
      } else {
        fs::remove(p, ec);
        out << p.string() << ": removed (" << what << " that was being replaced)\n";
      }
    }
    for (const fs::path& j : journals) {
      ++found;
      const details::Outcome o = details::recover(j.parent_path(), check, keep, out, err);
      if (o == details::Outcome::kError) ok = false;
      if (o == details::Outcome::kIncomplete || o == details::Outcome::kLost) ++incomplete;
    }
  }
  if (found == 0) out << "no interrupted step found (no journal.jsonl)\n";
  if (incomplete) err << incomplete << " step(s) incomplete or lost (see above)\n";
  out.flush();
  return !ok ? 1 : incomplete ? kIncomplete : 0;
}

}  // namespace torchprobe::io::recovery

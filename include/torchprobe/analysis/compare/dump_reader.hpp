#pragma once
// Reading one dump (dump.json with its stack.json and construct.json) for `torchprobe compare`,
// and finding the dump.json files that a TARGET/BENCH argument names: the file itself, a rank
// directory, a step directory (its ranks) or a dump root (its steps). Every problem is an
// InputError whose message names the file.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <unordered_map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "torchprobe/analysis/compare/json_reader.hpp"
#include "torchprobe/analysis/compare/parents.hpp"

namespace torchprobe::compare {

// Bad input: the CLI reports what() and exits with status 2.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Dump {
  std::filesystem::path file;  // the dump.json
  std::string task, level;
  nlohmann::ordered_json data;  // entry name -> entry, in dump order
  bool has_stack_file = false;  // stack.json beside dump.json (msprobe then adds NPU_Stack_Info)
  std::map<std::string, nlohmann::ordered_json> stacks;  // entry name -> list of frames
  Parents parents;                                       // construct.json: entry -> parent module (non-null ones)
  bool has_md5 = false;                                  // some item carries "md5" (msprobe's md5 mode when both do)
  // A step recovered incomplete after a crash (`torchprobe recover`: "torchprobe_recovery" with
  // "complete": false): what it says is missing. Empty for a whole step.
  std::string incomplete;
};

// What the "torchprobe_recovery" key of a dump.json says is missing; empty when the step is whole.
inline std::string recovery_missing(const nlohmann::ordered_json& doc) {
  if (!doc.is_object() || !doc.contains("torchprobe_recovery")) return {};
  const auto& r = doc["torchprobe_recovery"];
  if (!r.is_object() || r.value("complete", true) != false) return {};
  const auto m = r.find("missing");
  return m != r.end() && m->is_string() && !m->get<std::string>().empty() ? m->get<std::string>()
                                                                          : std::string("(not said)");
}

// The whole file as text, in one read of its size (a stream iterator reads it byte by byte), with
// room for `spare` more bytes (a parser's padding: growing the text later would copy it).
inline std::string read_text_file(const std::filesystem::path& path, std::size_t spare = 0) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path.string() + ": cannot be opened (missing or unreadable)");
  std::string text;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec) {
    text.reserve(static_cast<std::size_t>(size) + spare);
    text.resize(static_cast<std::size_t>(size));
    in.read(text.data(), static_cast<std::streamsize>(size));
    text.resize(static_cast<std::size_t>(in.gcount()));
  }
  if (in) text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());  // it grew meanwhile
  return text;
}

inline nlohmann::ordered_json read_json_file(const std::filesystem::path& path) {
  const std::string text = read_text_file(path);
  try {
    return parse_json_text(text);
  } catch (const JsonSyntaxError& e) {
    throw InputError(path.string() + ": not valid JSON (truncated or corrupt): " + e.what());
  }
}

namespace details {
inline bool any_md5(const nlohmann::ordered_json& j) {
  if (j.is_object()) {
    if (j.contains("md5")) return true;
    for (const auto& v : j) {
      if (any_md5(v)) return true;
    }
  } else if (j.is_array()) {
    for (const auto& v : j) {
      if (any_md5(v)) return true;
    }
  }
  return false;
}
}  // namespace details

namespace details {
inline std::filesystem::path dump_dir(const Dump& d) {
  return d.file.parent_path().empty() ? std::filesystem::path(".") : d.file.parent_path();
}

// construct.json beside the dump.json, into the dump.
inline void load_construct_file(Dump& d) {
  const std::filesystem::path construct = dump_dir(d) / "construct.json";
  if (!std::filesystem::exists(construct)) return;
  const auto c = read_json_file(construct);
  if (!c.is_object()) throw InputError(construct.string() + ": construct.json must be an object");
  for (auto it = c.begin(); it != c.end(); ++it) {
    if (it.value().is_string()) d.parents.set(it.key(), it.value().get_ref<const std::string&>());
  }
}

// stack.json beside the dump.json, into the dump.
inline void load_stack_file(Dump& d) {
  namespace fs = std::filesystem;
  const fs::path stack = dump_dir(d) / "stack.json";
  if (fs::exists(stack)) {
    d.has_stack_file = true;
    const auto s = read_json_file(stack);
    if (!s.is_object()) throw InputError(stack.string() + ": stack.json must be an object");
    if (s.contains("0") && s["0"].is_array()) {  // msprobe's newer layout: {"0": [[names], [frames]], ...}
      for (const auto& item : s) {
        if (!item.is_array() || item.size() != 2 || !item[0].is_array()) continue;
        for (const auto& name : item[0]) {
          if (name.is_string()) d.stacks[name.get<std::string>()] = item[1];
        }
      }
    } else {
      for (auto it = s.begin(); it != s.end(); ++it) d.stacks[it.key()] = it.value();
    }
  }
}

// The dump whose dump.json at `dump_json` holds `text`.
inline Dump dump_from_text(const std::filesystem::path& dump_json, const std::string& text) {
  Dump d;
  d.file = dump_json;
  nlohmann::ordered_json j;
  try {
    j = parse_json_text(text);
  } catch (const JsonSyntaxError& e) {
    throw InputError(dump_json.string() + ": not valid JSON (truncated or corrupt): " + e.what());
  }
  if (!j.is_object() || !j.contains("task") || !j["task"].is_string() || !j.contains("data") || !j["data"].is_object())
    throw InputError(dump_json.string() + ": not a dump.json (needs a \"task\" string and a \"data\" object)");
  d.task = j["task"].get<std::string>();
  if (j.contains("level") && j["level"].is_string()) d.level = j["level"].get<std::string>();
  d.incomplete = recovery_missing(j);
  d.data = std::move(j["data"]);
  if (d.data.empty()) throw InputError(dump_json.string() + ": the dump holds no entries (\"data\" is empty)");
  for (auto it = d.data.begin(); it != d.data.end(); ++it) {
    if (!it.value().is_object()) throw InputError(dump_json.string() + ": entry " + it.key() + " is not an object");
  }
  d.has_md5 = any_md5(d.data);
  load_stack_file(d);
  load_construct_file(d);
  return d;
}
}  // namespace details

inline Dump load_dump(const std::filesystem::path& dump_json) {
  if (!std::filesystem::is_regular_file(dump_json)) throw InputError(dump_json.string() + ": no such file");
  return details::dump_from_text(dump_json, read_text_file(dump_json));
}

// Once its rows are made, a dump's entries are needed by name only (stats_origin): their values,
// most of the memory of a large dump (a million entries: gigabytes of JSON nodes), become nulls.
inline void drop_entry_values(Dump& d) {
  for (auto& kv : d.data.get_ref<nlohmann::ordered_json::object_t&>()) kv.second = nullptr;
}

// One dump.json of each side to compare, and the rank suffix of its output ("" for one pair).
struct DumpPair {
  std::filesystem::path target, bench;
  std::string suffix;
};

namespace details {
// Numbered subdirectories "<prefix>N" (a bare "<prefix>" counts as -1), sorted by number.
inline std::vector<std::pair<long, std::filesystem::path>> numbered_dirs(const std::filesystem::path& dir,
                                                                         const std::string& pattern) {
  std::vector<std::pair<long, std::filesystem::path>> out;
  const std::regex re(pattern);
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (e.is_directory() && std::regex_match(name, m, re))
      out.emplace_back(m[1].length() ? std::stol(m[1].str()) : -1L, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A step directory's rank directories: rank, rankN, or msprobe 26's proc{pid}.
inline std::vector<std::pair<long, std::filesystem::path>> rank_dirs(const std::filesystem::path& step) {
  auto ranks = numbered_dirs(step, "rank([0-9]*)");
  if (ranks.empty()) ranks = numbered_dirs(step, "proc([0-9]+)");
  return ranks;
}

// What an argument names, as a list of (rank, dump.json); one entry with rank -2 for a plain dump.
inline std::vector<std::pair<long, std::filesystem::path>> resolve(const std::filesystem::path& arg,
                                                                   std::optional<long> step, std::optional<long> rank) {
  namespace fs = std::filesystem;
  if (!fs::exists(arg)) throw InputError(arg.string() + ": no such file or directory");
  if (fs::is_regular_file(arg)) return {{-2L, arg}};
  if (fs::exists(arg / "dump.json")) return {{-2L, arg / "dump.json"}};
  fs::path step_dir = arg;
  auto ranks = rank_dirs(arg);
  if (ranks.empty()) {  // a dump root: pick the step
    const auto steps = numbered_dirs(arg, "step([0-9]+)");
    if (steps.empty()) throw InputError(arg.string() + ": holds no dump.json, rank*/proc* or step* directory");
    const auto it = step ? std::find_if(steps.begin(), steps.end(), [&](const auto& s) { return s.first == *step; })
                         : steps.begin();
    if (it == steps.end()) throw InputError(arg.string() + ": has no step" + std::to_string(*step));
    step_dir = it->second;
    ranks = rank_dirs(step_dir);
    if (ranks.empty()) throw InputError(step_dir.string() + ": holds no rank*/proc* directory");
  }
  std::vector<std::pair<long, fs::path>> out;
  for (const auto& [r, dir] : ranks) {
    if (rank && r != *rank && ranks.size() > 1) continue;
    out.emplace_back(r, dir / "dump.json");
  }
  if (out.empty()) throw InputError(step_dir.string() + ": has no rank" + std::to_string(*rank));
  return out;
}
}  // namespace details

// Pairs the dump.json files of TARGET and BENCH; ranks pair in sorted order, as msprobe does.
inline std::vector<DumpPair> pair_inputs(const std::filesystem::path& target, const std::filesystem::path& bench,
                                         std::optional<long> step = std::nullopt,
                                         std::optional<long> rank = std::nullopt) {
  const auto t = details::resolve(target, step, rank);
  const auto b = details::resolve(bench, step, rank);
  if (t.size() != b.size())
    throw InputError(target.string() + " has " + std::to_string(t.size()) + " rank(s) but " + bench.string() + " has " +
                     std::to_string(b.size()));
  std::vector<DumpPair> out;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const bool ranked = t.size() > 1 && t[i].first >= 0;
    out.push_back({t[i].second, b[i].second, ranked ? "_rank" + std::to_string(t[i].first) : ""});
  }
  return out;
}

}  // namespace torchprobe::compare

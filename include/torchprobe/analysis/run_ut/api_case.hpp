#pragma once
// The APIs of a dump.json, as msprobe's run_ut reads them (parse_json.py; spec B.2): names holding
// "Module" are dropped, "X.forward" and "X.backward" are paired under X in dump order, and X splits
// into {Type}.{api}.{n} ({Type}.{a}.{b}.{n} for dotted APIs such as linalg.inv).
#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "torchprobe/analysis/compare/dump_reader.hpp"

namespace torchprobe::run_ut {

using Json = nlohmann::ordered_json;

// A problem with the input files (not with one API): the message names the file and what is wrong.
struct RunUtError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ApiCase {
  std::string name;  // "Functional.linear.0"
  std::string type;  // "Functional", "Torch", "Tensor", "Aten", ...
  std::string api;   // "linear", "linalg.inv"; empty when the name does not split
  Json forward;      // the "X.forward" entry (input_args, input_kwargs, output)
  Json backward;     // the "X.backward" entry (input, output), or null
};

struct Dump {
  std::string path;      // dump.json
  std::string data_dir;  // dump_tensor_data next to it when the dump holds tensors, else empty
  std::string task;
  std::vector<ApiCase> cases;
};

inline std::string dirname_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

// Splits "Type.api.n" / "Type.a.b.n"; false when msprobe would not run the name.
inline bool split_api_name(const std::string& name, std::string& type, std::string& api) {
  std::vector<std::string> parts;
  std::stringstream ss(name);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  if (parts.size() != 3 && parts.size() != 4) return false;
  for (const auto& p : parts)
    if (p.empty()) return false;
  type = parts[0];
  api = parts[1] + (parts.size() == 4 ? "." + parts[2] : "");
  return true;
}

inline Dump parse_dump(const Json& root, const std::string& path) {
  if (!root.is_object() || !root.contains("data") || !root["data"].is_object())
    throw RunUtError(path + ": not a dump.json (no \"data\" object)");
  Dump dump;
  dump.path = path;
  dump.task = root.value("task", "");
  if (root.contains("dump_data_dir") && !root["dump_data_dir"].is_null())
    dump.data_dir = dirname_of(path) + "/dump_tensor_data";
  std::unordered_map<std::string, std::size_t> index;
  for (const auto& [key, entry] : root["data"].items()) {
    if (key.find("Module") != std::string::npos) continue;
    std::string base, direction;
    for (const char* d : {".forward", ".backward"}) {
      const std::string suffix = d;
      if (key.size() > suffix.size() && key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0) {
        base = key.substr(0, key.size() - suffix.size());
        direction = suffix;
      }
    }
    if (base.empty()) continue;  // parameters_grad and other non-API entries
    auto it = index.find(base);
    if (it == index.end()) {
      ApiCase c;
      c.name = base;
      if (!split_api_name(base, c.type, c.api)) c.api.clear();
      it = index.emplace(base, dump.cases.size()).first;
      dump.cases.push_back(std::move(c));
    }
    ApiCase& c = dump.cases[it->second];
    (direction == ".forward" ? c.forward : c.backward) = entry;
  }
  return dump;
}

// msprobe's dump.json comes from Python's json: NaN and Infinity are bare tokens there.
inline Dump read_dump(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RunUtError(path + ": cannot open the dump.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Json root;
  try {
    root = compare::parse_json_text(text);
  } catch (const compare::JsonSyntaxError& e) {
    throw RunUtError(path + ": malformed JSON (" + std::string(e.what()) + ")");
  }
  return parse_dump(root, path);
}

}  // namespace torchprobe::run_ut

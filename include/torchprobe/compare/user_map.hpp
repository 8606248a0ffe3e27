#pragma once
// The user's mapping file (--map FILE.yaml): msprobe's data_mapping items, one `TARGET: BENCH` per
// line, where both are row names (`Functional.linear.0.forward.input.0: Aten.addmm.0.forward.input.1`)
// or both entry names (`Functional.gelu.0.forward: Aten.gelu.0.forward`, rows then link by their
// suffix). Only this flat subset of YAML is read (comments, blank lines, optional quotes); anything
// else is an InputError naming the file and line.
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "torchprobe/compare/dump_reader.hpp"

namespace torchprobe::compare {

struct UserMap {
  std::vector<std::pair<std::string, std::string>> items;  // target name -> bench name, in file order
};

inline UserMap read_user_map(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path.string() + ": cannot be opened (missing or unreadable)");
  const auto trim = [](std::string s) {
    const auto b = s.find_first_not_of(" \t\r");
    const auto e = s.find_last_not_of(" \t\r");
    s = b == std::string::npos ? "" : s.substr(b, e - b + 1);
    if (s.size() >= 2 && (s.front() == '\'' || s.front() == '"') && s.back() == s.front())
      s = s.substr(1, s.size() - 2);
    return s;
  };
  UserMap m;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.erase(hash);
    if (trim(line).empty()) continue;
    const auto colon = line.find(": ");
    const std::string key = colon == std::string::npos ? "" : trim(line.substr(0, colon));
    const std::string value = colon == std::string::npos ? "" : trim(line.substr(colon + 2));
    if (key.empty() || value.empty() || value.front() == '[' || value.front() == '{')
      throw InputError(path.string() + ":" + std::to_string(n) + ": expected 'TARGET_NAME: BENCH_NAME', got '" +
                       trim(line) + "'");
    m.items.emplace_back(key, value);
  }
  return m;
}

}  // namespace torchprobe::compare

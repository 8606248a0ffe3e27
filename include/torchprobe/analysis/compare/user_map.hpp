#pragma once
// The user's mapping file (--map FILE.yaml): msprobe's data_mapping items, one `TARGET: BENCH` per
// line, where both are row names (`Functional.linear.0.forward.input.0: Aten.addmm.0.forward.input.1`)
// or both entry names (`Functional.gelu.0.forward: Aten.gelu.0.forward`, rows then link by their
// suffix); and TorchProbe's group form, API names without call numbers, either side a list, with an
// optional argument map (group_map.hpp):
//   Functional.linear: [Aten.t, Aten.addmm] {input.0: 1.input.1, input.1: 0.input.0, output.0: 1.output.0}
// Only this flat subset of YAML is read (comments, blank lines, optional quotes); anything else is an
// InputError naming the file and line.
#include <cctype>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "torchprobe/analysis/compare/dump_reader.hpp"

namespace torchprobe::compare {

struct UserMap {
  std::vector<std::pair<std::string, std::string>> items;  // target name -> bench name, in file order
  struct Group {
    std::vector<std::string> target, bench;                 // API names ("Aten.addmm"), in call order
    std::vector<std::pair<std::string, std::string>> args;  // "[k.]input.N" -> "[k.]output.M"
  };
  std::vector<Group> groups;
};

namespace details {
// "[Aten.t, Aten.addmm]" or "Aten.gelu" -> API names; empty when a name is not `Prefix.api`.
inline std::vector<std::string> group_side(const std::string& text) {
  std::string body = text;
  if (!body.empty() && body.front() == '[') {
    if (body.back() != ']') return {};
    body = body.substr(1, body.size() - 2);
  }
  std::vector<std::string> names;
  std::string cur;
  for (const char c : body + ",") {
    if (c == ',') {
      const auto b = cur.find_first_not_of(" \t"), e = cur.find_last_not_of(" \t");
      const std::string name = b == std::string::npos ? "" : cur.substr(b, e - b + 1);
      const auto dot = name.find('.');
      if (dot == std::string::npos || dot == 0 || dot + 1 == name.size() ||
          name.find('.', dot + 1) != std::string::npos)
        return {};
      names.push_back(name);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return names;
}

// "[k.]input.N" / "[k.]output.N" with k below `members`.
inline bool group_arg_ok(const std::string& a, std::size_t members) {
  std::size_t i = 0, k = 0;
  while (i < a.size() && std::isdigit(static_cast<unsigned char>(a[i]))) k = k * 10 + std::size_t(a[i++] - '0');
  if (i > 0) {
    if (i >= a.size() || a[i] != '.' || k >= members) return false;
    ++i;
  }
  const std::string rest = a.substr(i);
  for (const char* w : {"input.", "output."}) {
    const std::string word = w;
    if (rest.rfind(word, 0) == 0 && rest.size() > word.size() &&
        rest.find_first_not_of("0123456789", word.size()) == std::string::npos)
      return true;
  }
  return false;
}
}  // namespace details

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
    const std::string where = path.string() + ":" + std::to_string(n) + ": ";
    if (key.empty() || value.empty() || value.front() == '{')
      throw InputError(where + "expected 'TARGET_NAME: BENCH_NAME', got '" + trim(line) + "'");
    // The group form: API names (one dot) or lists of them, then an optional {argument map}.
    const auto brace = value.find('{');
    const std::string bench_text = trim(value.substr(0, brace));
    const auto t_apis = details::group_side(key), b_apis = details::group_side(bench_text);
    const bool group = key.front() == '[' || bench_text.front() == '[' || (!t_apis.empty() && !b_apis.empty());
    if (!group) {
      m.items.emplace_back(key, value);
      continue;
    }
    if (t_apis.empty() || b_apis.empty() || (t_apis.size() > 1 && b_apis.size() > 1))
      throw InputError(where +
                       "a group item is 'Prefix.api: [Prefix.api, ...]' (API names without call numbers, "
                       "a list on one side at most), got '" +
                       trim(line) + "'");
    UserMap::Group g{t_apis, b_apis, {}};
    if (brace != std::string::npos) {
      if (value.back() != '}') throw InputError(where + "the argument map must end with '}', got '" + trim(line) + "'");
      std::string cur;
      for (const char c : value.substr(brace + 1, value.size() - brace - 2) + ",") {
        if (c != ',') {
          cur += c;
          continue;
        }
        const auto colon2 = cur.find(':');
        const std::string a = colon2 == std::string::npos ? "" : trim(cur.substr(0, colon2));
        const std::string b = colon2 == std::string::npos ? "" : trim(cur.substr(colon2 + 1));
        if (!details::group_arg_ok(a, t_apis.size()) || !details::group_arg_ok(b, b_apis.size()))
          throw InputError(where + "argument '" + trim(cur) +
                           "' is not '[k.]input.N: [k.]output.M' (k: a position in the list)");
        g.args.emplace_back(a, b);
        cur.clear();
      }
    }
    m.groups.push_back(std::move(g));
  }
  return m;
}

}  // namespace torchprobe::compare

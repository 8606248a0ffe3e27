#pragma once
// The "run_ut" section ("task": "run_ut"): the configuration of `torchprobe run_ut -config`
// (msprobe's run_ut config, msprobe-grad-probe-run-ut.md B.8), each violation named by key, value
// and what is allowed. msprobe's online mode (is_online, nfs_path, host, port, rank_list, tls_path:
// run_ut between an NPU and a GPU machine over the network) is accepted and reported as not
// supported.
#include <string>
#include <vector>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "torchprobe/config/readers.hpp"
#include "torchprobe/config/types.hpp"

namespace torchprobe {

namespace details {

// An identifier, or two joined by one dot ("linalg.inv"). Written out rather than with <regex>:
// this header is parsed by every file that includes torchprobe.hpp.
inline bool is_bare_api_name(const std::string& n) {
  const auto letter = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  std::size_t dots = 0;
  bool at_start = true;  // of an identifier
  for (char c : n) {
    if (c == '.') {
      if (at_start || ++dots > 1) return false;
      at_start = true;
    } else if (letter(c) || (!at_start && digit(c))) {
      at_start = false;
    } else {
      return false;
    }
  }
  return !at_start;
}

inline std::vector<std::string> parse_api_names(const json& section, const char* key, const std::string& label) {
  const std::string allowed = "a list of bare API names such as [\"linear\", \"__add__\", \"linalg.inv\"]";
  std::vector<std::string> names = read_string_list(section, key, label, allowed);
  for (const auto& n : names)
    if (!is_bare_api_name(n))
      reject(label, n, "it is not an API name (a full name like \"Functional.linear.0\" is not one either)", allowed);
  return names;
}

// `section_name` spells the keys in messages ("run_ut.white_list"); notes about ignored keys are
// appended to `warnings`.
inline RunUtConfig parse_run_ut(const json& section, const std::string& section_name,
                                std::vector<std::string>& warnings) {
  RunUtConfig r;
  const auto label = [&](const char* key) { return section_name + "." + key; };
  r.white_list = parse_api_names(section, "white_list", label("white_list"));
  r.black_list = parse_api_names(section, "black_list", label("black_list"));
  if (const json* v = find(section, "error_data_path")) {
    const std::string allowed = "the path of an existing directory";
    if (!v->is_string()) reject(label("error_data_path"), *v, "it should be a string", allowed);
    r.error_data_path = v->get<std::string>();
    struct stat st {};
    if (::stat(r.error_data_path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      reject(label("error_data_path"), *v, "it is not an existing directory", allowed);
  }
  for (const char* k : {"is_online", "nfs_path", "host", "port", "rank_list", "tls_path"}) {
    const json* v = find(section, k);
    const bool asked = v && !(v->is_boolean() && !v->get<bool>()) &&
                       !(v->is_string() && v->get<std::string>().empty()) && !(v->is_array() && v->empty());
    if (asked)
      warnings.push_back("config key " + quote(label(k)) +
                         " is not supported: it belongs to msprobe's online run_ut between an NPU and a GPU machine, "
                         "which TorchProbe does not have; ignored (run_ut replays the dump on this machine)");
  }
  return r;
}

}  // namespace details

}  // namespace torchprobe

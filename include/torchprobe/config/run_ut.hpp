#pragma once
// The "run_ut" section ("task": "run_ut"): the configuration of `torchprobe run_ut -config`
// (msprobe's run_ut config, msprobe-grad-probe-run-ut.md B.8), each violation named by key, value
// and what is allowed. msprobe's online mode (is_online, nfs_path, host, port, rank_list, tls_path:
// run_ut between an NPU and a GPU machine over the network) is accepted and reported as not
// supported.
#include <regex>
#include <string>
#include <vector>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "torchprobe/config/readers.hpp"
#include "torchprobe/config/types.hpp"

namespace torchprobe {

namespace details {

inline std::vector<std::string> parse_api_names(const json& section, const char* key, const std::string& label) {
  const std::string allowed = "a list of bare API names such as [\"linear\", \"__add__\", \"linalg.inv\"]";
  std::vector<std::string> names = read_string_list(section, key, label, allowed);
  static const std::regex api(R"(^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$)");
  for (const auto& n : names)
    if (!std::regex_match(n, api))
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

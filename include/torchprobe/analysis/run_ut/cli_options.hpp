#pragma once
// The command line of `torchprobe run_ut` and the "run_ut" section of a config file (-config),
// checked with named errors. Free of libtorch, so the unit tests check it quickly.
//   torchprobe run_ut -api_info DUMP.json [-o OUT] [-save_error_data] [-csv_path RESULT.csv] [-f]
//                     [-j N] [-config CFG.json] [--float64-bench]
#include <nlohmann/json.hpp>

#include "torchprobe/config/parser.hpp"
#include "torchprobe/analysis/run_ut/run_settings.hpp"

#include <fstream>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/stat.h>

namespace torchprobe::run_ut {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct CliOptions : RunSettings {
  std::string config;              // -config
  bool float64_bench = false;      // --float64-bench
  std::string device = "cpu";      // where the recorded dtypes run: "cpu", "cuda", "cuda:N" (-d N: "cuda:N")
  std::vector<std::string> notes;  // accepted keys that do nothing here (the online mode)
};

// The run_ut section's lists and path, as the config parser checked them.
inline void take_run_ut_section(const RunUtConfig& r, CliOptions& o) {
  o.white_list = r.white_list;
  o.black_list = r.black_list;
  o.error_data_path = r.error_data_path;
}

inline const char* run_ut_usage() {
  return "usage: torchprobe run_ut -api_info DUMP.json [-o OUT] [-save_error_data] [-csv_path RESULT.csv]\n"
         "                         [-f] [-j N] [-config CFG.json] [--float64-bench] [-d N | --device DEV]\n"
         "  replays every API of a dump (L1, task tensor or statistics) on the CPU in its own dtypes and\n"
         "  as an up-cast benchmark, and writes msprobe's accuracy_checking_{result,details}_{ts}.csv\n"
         "  -f               skip a call whose arguments repeat an earlier call's\n"
         "  -j N             replay N APIs at once\n"
         "  --float64-bench  every float benchmark in float64 (msprobe: fp16/bf16 -> fp32)\n"
         "  -d N, --device DEV  run the recorded dtypes on cuda:N / DEV (cpu, cuda, cuda:N; default cpu);\n"
         "                   the benchmark runs on the CPU\n";
}

inline bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The "run_ut" section (or the whole object, when it is the section itself), checked by the config
// parser's own rules (config/run_ut.hpp); `where` (the file) prefixes its messages.
inline void apply_run_ut_config(const nlohmann::json& root, CliOptions& o, const std::string& where) {
  const nlohmann::json& s = root.contains("run_ut") ? root["run_ut"] : root;
  if (!s.is_object()) throw UsageError(where + ": \"run_ut\" must be an object");
  try {
    take_run_ut_section(torchprobe::details::parse_run_ut(s, "run_ut", o.notes), o);
  } catch (const ConfigError& e) {
    throw UsageError(where + ": " + e.what());
  }
}

inline CliOptions parse_run_ut_args(const std::vector<std::string>& args) {
  CliOptions o;
  const auto value = [&](std::size_t& i) -> const std::string& {
    if (i + 1 >= args.size()) throw UsageError(args[i] + " needs a value");
    return args[++i];
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-api_info" || a == "--api_info")
      o.api_info = value(i);
    else if (a == "-o" || a == "--out_path")
      o.out_dir = value(i);
    else if (a == "-csv_path" || a == "--result_csv_path")
      o.continue_csv = value(i);
    else if (a == "-config" || a == "--config_path")
      o.config = value(i);
    else if (a == "-save_error_data")
      o.save_error_data = true;
    else if (a == "-f" || a == "--filter_api")
      o.filter_duplicates = true;
    else if (a == "--float64-bench")
      o.float64_bench = true;
    else if (a == "-d" || a == "--device_id")
      o.device = "cuda:" + value(i);
    else if (a == "--device")
      o.device = value(i);
    else if (a == "-j" || a == "--jobs") {
      const std::string& v = value(i);
      try {
        o.jobs = std::stoi(v);
      } catch (const std::exception&) {
        o.jobs = 0;
      }
      if (o.jobs < 1 || o.jobs > 1024) throw UsageError("-j needs a count from 1 to 1024, not '" + v + "'");
    } else {
      throw UsageError("unknown argument '" + a + "'");
    }
  }
  if (o.api_info.empty()) throw UsageError("-api_info DUMP.json is required");
  if (!o.continue_csv.empty()) {
    static const std::regex name(R"((^|.*/)accuracy_checking_result_\d{14}\.csv$)");
    if (!std::regex_match(o.continue_csv, name))
      throw UsageError("-csv_path must name an accuracy_checking_result_{YYYYmmddHHMMSS}.csv, not '" + o.continue_csv +
                       "'");
  }
  if (!o.config.empty()) {
    std::ifstream in(o.config);
    if (!in) throw UsageError("cannot open the config " + o.config);
    nlohmann::json root;
    try {
      root = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw UsageError(o.config + ": malformed JSON (" + e.what() + ")");
    }
    if (!root.is_object()) throw UsageError(o.config + ": a configuration must be a JSON object");
    if (root.contains("task") && root["task"] != "run_ut")
      throw UsageError(o.config + ": \"task\" is " + root["task"].dump() + ", run_ut needs \"run_ut\"");
    root["task"] = "run_ut";  // a file of only the run_ut section's keys is a run_ut config too
    Config c;
    try {
      c = parse_config(root);  // the same checks as every TorchProbe config
    } catch (const ConfigError& e) {
      throw UsageError(o.config + ": " + e.what());
    }
    take_run_ut_section(c.run_ut, o);
    for (const auto& w : c.warnings) o.notes.push_back(o.config + ": " + w);
  }
  return o;
}

}  // namespace torchprobe::run_ut

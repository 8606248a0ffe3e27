// `torchprobe run_ut`'s command line and the "run_ut" section of its -config file
// (run_ut/cli_options.hpp): values reach the options, every mistake is a named error, and the
// online mode's keys are accepted and reported as not supported.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "torchprobe/analysis/run_ut/cli_options.hpp"

namespace ru = torchprobe::run_ut;
using json = nlohmann::json;

namespace {

std::string rejection(const std::vector<std::string>& args) {
  try {
    ru::parse_run_ut_args(args);
  } catch (const ru::UsageError& e) {
    return e.what();
  }
  return "(accepted)";
}

std::string config_rejection(const json& doc) {
  ru::CliOptions o;
  try {
    ru::apply_run_ut_config(doc, o, "cfg.json");
  } catch (const ru::UsageError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("run_ut arguments: msprobe's spellings reach the options") {
  const auto o =
      ru::parse_run_ut_args({"-api_info", "d/dump.json", "-o", "out", "-save_error_data", "-f", "-j", "4",
                             "--float64-bench", "-csv_path", "r/accuracy_checking_result_20261201111907.csv"});
  CHECK(o.api_info == "d/dump.json");
  CHECK(o.out_dir == "out");
  CHECK(o.save_error_data);
  CHECK(o.filter_duplicates);
  CHECK(o.jobs == 4);
  CHECK(o.float64_bench);
  CHECK(o.continue_csv == "r/accuracy_checking_result_20261201111907.csv");
  CHECK(ru::parse_run_ut_args({"-api_info", "x.json"}).out_dir == ".");
  CHECK(ru::parse_run_ut_args({"-api_info", "x.json"}).device == "cpu");
  CHECK(ru::parse_run_ut_args({"-api_info", "x.json", "-d", "1"}).device == "cuda:1");  // msprobe's device id
  CHECK(ru::parse_run_ut_args({"-api_info", "x.json", "--device", "cuda"}).device == "cuda");
}

TEST_CASE("run_ut arguments: each mistake is named") {
  CHECK(rejection({"-o", "out"}) == "-api_info DUMP.json is required");
  CHECK(rejection({"-api_info"}) == "-api_info needs a value");
  CHECK(rejection({"-api_info", "x.json", "-j", "zero"}) == "-j needs a count from 1 to 1024, not 'zero'");
  CHECK(rejection({"-api_info", "x.json", "-j", "0"}) == "-j needs a count from 1 to 1024, not '0'");
  CHECK(rejection({"-api_info", "x.json", "--bogus"}) == "unknown argument '--bogus'");
  CHECK(rejection({"-api_info", "x.json", "-csv_path", "old.csv"})
            .find("accuracy_checking_result_{YYYYmmddHHMMSS}.csv") != std::string::npos);
  CHECK(rejection({"-api_info", "x.json", "-config", "/nonexistent/cfg.json"}) ==
        "cannot open the config /nonexistent/cfg.json");
}

TEST_CASE("run_ut config: white_list, black_list and error_data_path, checked with named errors") {
  ru::CliOptions o;
  ru::apply_run_ut_config(
      {{"run_ut",
        {{"white_list", {"linear", "linalg.inv"}}, {"black_list", {"__add__"}}, {"error_data_path", "/tmp"}}}},
      o, "cfg.json");
  CHECK(o.white_list == std::vector<std::string>{"linear", "linalg.inv"});
  CHECK(o.black_list == std::vector<std::string>{"__add__"});
  CHECK(o.error_data_path == "/tmp");
  CHECK(o.notes.empty());
  // The config parser's rules and messages (config/run_ut.hpp), prefixed with the file.
  CHECK(config_rejection({{"run_ut", {{"white_list", "linear"}}}})
            .rfind("cfg.json: config key \"run_ut.white_list\": \"linear\" is invalid: it should be a list", 0) == 0);
  CHECK(config_rejection({{"run_ut", {{"black_list", {"Functional.linear.0"}}}}})
            .rfind("cfg.json: config key \"run_ut.black_list\": \"Functional.linear.0\" is invalid: it is not an API "
                   "name",
                   0) == 0);
  CHECK(config_rejection({{"run_ut", {{"white_list", {3}}}}}).find("\"run_ut.white_list\": [3] is invalid") !=
        std::string::npos);
  CHECK(config_rejection({{"run_ut", {{"error_data_path", "/nonexistent/dir"}}}})
            .find("\"run_ut.error_data_path\": \"/nonexistent/dir\" is invalid: it is not an existing directory") !=
        std::string::npos);
  CHECK(config_rejection({{"run_ut", 5}}) == "cfg.json: \"run_ut\" must be an object");
}

TEST_CASE("an API name is an identifier, or two joined by one dot") {
  using torchprobe::details::is_bare_api_name;
  for (const char* good : {"linear", "__add__", "linalg.inv", "_", "a1", "conv2d", "nn.functional_x"})
    CHECK_MESSAGE(is_bare_api_name(good), good);
  for (const char* bad : {"", ".", "a.", ".a", "1a", "a.1b", "a.b.c", "a..b", "a-b", "a b", "Functional.linear.0"})
    CHECK_MESSAGE(!is_bare_api_name(bad), bad);
}

TEST_CASE("run_ut config: the online mode's keys are accepted and reported as not supported") {
  ru::CliOptions o;
  ru::apply_run_ut_config(
      {{"run_ut", {{"is_online", true}, {"nfs_path", "/nfs"}, {"host", "1.2.3.4"}, {"port", 8080}}}}, o, "c");
  REQUIRE(o.notes.size() == 4);
  CHECK(o.notes[0].rfind("config key \"run_ut.is_online\" is not supported: it belongs to msprobe's online run_ut",
                         0) == 0);
  CHECK(o.notes[3].rfind("config key \"run_ut.port\" is not supported", 0) == 0);
  ru::CliOptions off;
  ru::apply_run_ut_config({{"run_ut", {{"is_online", false}}}}, off, "c");
  CHECK(off.notes.empty());
}

TEST_CASE("run_ut -config: a file of another task is refused, a run_ut file applied") {
  const std::string path = "/tmp/tp_run_ut_cfg_" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << R"({"task": "statistics", "run_ut": {}})";
  CHECK(rejection({"-api_info", "x.json", "-config", path}) ==
        path + ": \"task\" is \"statistics\", run_ut needs \"run_ut\"");
  std::ofstream(path) << R"({"task": "run_ut", "run_ut": {"white_list": ["relu"]}})";
  CHECK(ru::parse_run_ut_args({"-api_info", "x.json", "-config", path}).white_list == std::vector<std::string>{"relu"});
  std::ofstream(path) << R"({"task": "run_ut", )";
  CHECK(rejection({"-api_info", "x.json", "-config", path}).find(path + ": malformed JSON") == 0);
  std::remove(path.c_str());
}

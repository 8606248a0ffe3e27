// "task": "run_ut" in the config parser (config/run_ut.hpp): msprobe's run_ut config files load,
// white_list/black_list/error_data_path are checked with named errors, the online mode's keys are
// accepted and reported as not supported, and the Debugger refuses the task by naming the command.
#include <doctest/doctest.h>

#include "../skip.hpp"

#include <filesystem>
#include <fstream>
#include <string>

#include "config_support.hpp"

using json = nlohmann::json;
using namespace torchprobe;
using tptest::rejection;

namespace {

bool has_warning(const Config& c, const std::string& part) {
  for (const auto& w : c.warnings)
    if (w.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("msprobe's run_ut config files load as task run_ut") {
  const std::string configs = std::string(TORCHPROBE_REFERENCE_DUMPS) + "/run_ut/configs/";
  REQUIRE_MESSAGE(std::filesystem::exists(configs), "no msprobe reference dumps at " << configs);
  for (const char* name : {"cfg_run_ut_whitelist.json", "cfg_run_ut_bf16.json"}) {
    CAPTURE(name);
    std::ifstream in(std::string(TORCHPROBE_REFERENCE_DUMPS) + "/run_ut/configs/" + name);
    REQUIRE(in.good());
    json doc = json::parse(in);
    // Its error_data_path is relative to msprobe's working directory; ours is the build's.
    doc["run_ut"]["error_data_path"] = "/tmp";
    const Config c = parse_config(doc);
    CHECK(c.task == Task::RunUt);
    CHECK(c.run_ut.error_data_path == "/tmp");
    CHECK(c.warnings.empty());
    if (std::string(name) == "cfg_run_ut_whitelist.json")
      CHECK(c.run_ut.white_list == std::vector<std::string>{"linear", "relu"});
  }
  // No dump_path needed: run_ut writes under -o.
  const Config bare = parse_config(json{{"task", "run_ut"}, {"run_ut", {{"black_list", {"__add__", "linalg.inv"}}}}});
  CHECK(bare.run_ut.black_list == std::vector<std::string>{"__add__", "linalg.inv"});
  CHECK(bare.run_ut.error_data_path == "./");
}

TEST_CASE("run_ut config keys are checked with named errors") {
  const auto doc = [](json section) { return tptest::doc_with({{"task", "run_ut"}, {"run_ut", section}}); };
  const std::string not_list = rejection(doc({{"white_list", "linear"}}));
  CHECK(not_list.find("\"run_ut.white_list\": \"linear\" is invalid: it should be a list of strings") !=
        std::string::npos);
  const std::string full_name = rejection(doc({{"black_list", {"relu", "Torch.relu.0"}}}));
  CHECK(full_name.find("\"run_ut.black_list\": \"Torch.relu.0\" is invalid: it is not an API name") !=
        std::string::npos);
  CHECK(rejection(doc({{"white_list", {"a b"}}})).find("\"a b\" is invalid") != std::string::npos);
  const std::string no_dir = rejection(doc({{"error_data_path", "/nonexistent/tp_dir"}}));
  CHECK(no_dir.find("\"run_ut.error_data_path\": \"/nonexistent/tp_dir\" is invalid: it is not an existing "
                    "directory") != std::string::npos);
  CHECK(rejection(doc({{"error_data_path", 3}})).find("it should be a string") != std::string::npos);
  CHECK(
      rejection(tptest::doc_with({{"task", "run_ut"}, {"run_ut", 5}})).find("a task section should be a JSON object") !=
      std::string::npos);
}

TEST_CASE("run_ut's online mode keys are accepted and reported as not supported") {
  const Config c = parse_config(json{{"task", "run_ut"},
                                     {"run_ut",
                                      {{"is_online", true},
                                       {"nfs_path", "/nfs"},
                                       {"host", "10.0.0.1"},
                                       {"port", 8080},
                                       {"rank_list", {0}},
                                       {"tls_path", ""}}}});
  CHECK(c.warnings.size() == 5);  // an empty tls_path asks for nothing
  for (const char* k : {"is_online", "nfs_path", "host", "port", "rank_list"}) {
    CAPTURE(k);
    CHECK(has_warning(
        c, "config key \"run_ut." + std::string(k) + "\" is not supported: it belongs to msprobe's online run_ut"));
  }
  CHECK(parse_config(json{{"task", "run_ut"}, {"run_ut", {{"is_online", false}}}}).warnings.empty());
  // Unknown keys are still named.
  CHECK(has_warning(parse_config(json{{"task", "run_ut"}, {"run_ut", {{"whitelist", json::array()}}}}),
                    "unknown config key \"run_ut.whitelist\" ignored"));
}

TEST_CASE("a Debugger given task run_ut refuses it by naming the run_ut command") {
  const TaskCatalog implemented{{Task::Tensor, {Level::L1}, {"summary_mode"}}};
  const std::string why = rejection(tptest::doc_with({{"task", "run_ut"}}), &implemented);
  CHECK(why.find("configures the `torchprobe run_ut` command") != std::string::npos);
}

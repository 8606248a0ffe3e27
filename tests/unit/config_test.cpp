// Configuration: msprobe's config.json keys, their validation, defaults, and Options overrides.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "torchprobe/config/config.hpp"
#include "torchprobe/config/options.hpp"
#include "config_support.hpp"

using nlohmann::json;
using namespace torchprobe;

namespace {

using tptest::doc_with;
using tptest::rejection;

// Every part must occur in the message (key, value, allowed set, reason).
void check_mentions(const std::string& message, std::initializer_list<std::string> parts) {
  INFO("message: " << message);
  for (const std::string& part : parts) CHECK(message.find(part) != std::string::npos);
}

bool has_warning(const Config& c, const std::string& part) {
  for (const std::string& w : c.warnings)
    if (w.find(part) != std::string::npos) return true;
  return false;
}

// A private directory for config files, removed afterwards.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("torchprobe_config_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

}  // namespace

TEST_CASE("a document with only a dump_path gets msprobe's defaults, except risk_level ALL") {
  const Config c = parse_config({{"dump_path", "./dump"}});
  CHECK(c.task == Task::Statistics);
  CHECK(c.level == Level::L1);
  CHECK(c.dump_path == "./dump");
  CHECK(c.step.all());
  CHECK(c.rank.all());
  CHECK(c.step.contains(12345));
  CHECK_FALSE(c.step.max().has_value());
  CHECK_FALSE(c.async_dump);
  CHECK(c.extra_info);
  CHECK(c.precision == "low");
  CHECK(c.risk_level == RiskLevel::All);
  CHECK(c.scope.empty());
  CHECK(c.list.empty());
  CHECK(c.tensor_list.empty());
  CHECK(c.summary_mode == SummaryMode::Statistics);
  CHECK(c.overflow_nums == 1);
  CHECK(c.data_mode.forward_inputs());
  CHECK(c.data_mode.backward_outputs());
  CHECK(c.warnings.empty());
}

TEST_CASE("Options without a config file start from msprobe's shipped config.json") {
  const Config c = Options().resolve();
  CHECK(c.dump_path == "./dump_path");
  CHECK(c.task == Task::Statistics);
  CHECK(c.level == Level::L1);
  CHECK(c.risk_level == RiskLevel::All);
  CHECK(c.warnings.empty());
}

TEST_CASE("every option of the builder reaches the configuration") {
  const Config c = Options()
                       .dump_path("./out")
                       .step({0, "4-6"})
                       .rank({1})
                       .scope({"Aten.t.0.forward", "Aten.relu.0.forward"})
                       .list({"relu"})
                       .data_mode({"forward"})
                       .summary_mode("xor")
                       .tensor_list({"addmm"})
                       .risk_level("FOCUS")
                       .extra_info(false)
                       .async_dump(true)
                       .precision("high")
                       .resolve();
  CHECK(c.dump_path == "./out");
  CHECK(c.step.values() == std::vector<int64_t>{0, 4, 5, 6});
  CHECK(c.rank.values() == std::vector<int64_t>{1});
  CHECK(c.scope == std::vector<std::string>{"Aten.t.0.forward", "Aten.relu.0.forward"});
  CHECK(c.list == std::vector<std::string>{"relu"});
  CHECK(c.tensor_list == std::vector<std::string>{"addmm"});
  CHECK(c.summary_mode == SummaryMode::Xor);
  CHECK(c.risk_level == RiskLevel::Focus);
  CHECK_FALSE(c.extra_info);
  CHECK(c.async_dump);
  CHECK(c.precision == "high");
  CHECK(c.data_mode.forward);
  CHECK_FALSE(c.data_mode.backward);
  CHECK(c.warnings.empty());
}

TEST_CASE("overflow_nums set through Options lands in the overflow_check section") {
  const Config c = Options().overflow_nums(3).resolve(Level::L1, Task::OverflowCheck);
  CHECK(c.task == Task::OverflowCheck);
  CHECK(c.overflow_nums == 3);
}

// ---- step and rank ----

TEST_CASE("step ranges expand, and step lists are deduplicated and sorted") {
  const Config c = parse_config(doc_with({{"step", {9, "4-6", 5, "0", "005"}}, {"rank", {"3-3", 1, 1}}}));
  CHECK(c.step.values() == std::vector<int64_t>{0, 4, 5, 6, 9});
  CHECK(c.step.contains(5));
  CHECK_FALSE(c.step.contains(7));
  CHECK(c.step.max() == 9);
  CHECK(c.rank.values() == std::vector<int64_t>{1, 3});
}

TEST_CASE("null and empty step lists mean every step") {
  CHECK(parse_config(doc_with({{"step", nullptr}})).step.all());
  CHECK(parse_config(doc_with({{"step", json::array()}})).step.all());
}

TEST_CASE("the largest allowed step range is accepted") {
  const Config c = parse_config(doc_with({{"step", {"999999-1000000"}}}));
  CHECK(c.step.values() == std::vector<int64_t>{999999, 1000000});
}

TEST_CASE("a step range whose left boundary exceeds the right is rejected, naming the key and value") {
  const std::string message = rejection(doc_with({{"step", {"6-4"}}}));
  CHECK(message ==
        "config key \"step\": \"6-4\" is invalid: the left boundary 6 is greater than the right boundary 4 "
        "(allowed: integers or \"a-b\" ranges with 0 <= a <= b <= 1000000)");
}

TEST_CASE("malformed step and rank elements are rejected with the element and the allowed forms") {
  const std::string allowed = "0 <= a <= b <= 1000000";
  check_mentions(rejection(doc_with({{"step", {true}}})), {"\"step\"", "true", "booleans", allowed});
  check_mentions(rejection(doc_with({{"step", {1.5}}})),
                 {"\"step\"", "1.5", "neither an integer nor a string", allowed});
  check_mentions(rejection(doc_with({{"step", {-1}}})), {"\"step\"", "-1", "outside [0, 1000000]", allowed});
  check_mentions(rejection(doc_with({{"step", {1000001}}})), {"\"step\"", "1000001", "outside", allowed});
  check_mentions(rejection(doc_with({{"step", {"0-1000001"}}})), {"\"step\"", "\"0-1000001\"", "1000001", allowed});
  check_mentions(rejection(doc_with({{"step", {"99999999999999999999"}}})), {"\"step\"", "outside", allowed});
  check_mentions(rejection(doc_with({{"rank", {"-3"}}})), {"\"rank\"", "\"-3\"", "hyphen", allowed});
  check_mentions(rejection(doc_with({{"rank", {"3-"}}})), {"\"rank\"", "\"3-\"", "hyphen", allowed});
  check_mentions(rejection(doc_with({{"rank", {"1-2-3"}}})), {"\"rank\"", "\"1-2-3\"", allowed});
  check_mentions(rejection(doc_with({{"rank", {"two"}}})), {"\"rank\"", "\"two\"", "not a decimal number", allowed});
  check_mentions(rejection(doc_with({{"rank", {" 2"}}})), {"\"rank\"", "\" 2\"", allowed});
}

TEST_CASE("a step or rank that is not a list is rejected") {
  check_mentions(rejection(doc_with({{"rank", 0}})),
                 {"\"rank\"", ": 0 is invalid", "should be a list", "0 <= a <= b <= 1000000"});
}

// ---- common keys ----

TEST_CASE("an unknown task is rejected with the list of tasks") {
  check_mentions(
      rejection(doc_with({{"task", "stats"}})),
      {"\"task\"", "\"stats\"", "\"statistics\", \"tensor\", \"overflow_check\", \"free_benchmark\", \"structure\""});
  check_mentions(rejection(doc_with({{"task", 3}})), {"\"task\"", "3", "should be a string", "\"structure\""});
}

TEST_CASE("msprobe tasks that TorchProbe lacks are rejected as unsupported") {
  for (const char* task : {"acc_check", "diff_check", "nan_check", "exception_dump"}) {
    check_mentions(rejection(doc_with({{"task", task}})),
                   {"\"task\"", std::string("\"") + task + "\"", "TorchProbe does not support", "\"statistics\""});
  }
}

TEST_CASE("an unknown level is rejected, and level debug (save()) is accepted") {
  check_mentions(rejection(doc_with({{"level", "L3"}})),
                 {"\"level\"", "\"L3\"", "\"L0\", \"L1\", \"mix\", \"L2\", \"debug\""});
  check_mentions(rejection(doc_with({{"level", "MIX"}})), {"\"level\"", "\"MIX\"", "case-sensitive", "\"mix\""});
  CHECK(parse_config(doc_with({{"level", "debug"}})).level == Level::Debug);
}

TEST_CASE("every level is accepted by its msprobe spelling") {
  CHECK(parse_config(doc_with({{"level", "L0"}})).level == Level::L0);
  CHECK(parse_config(doc_with({{"level", "L1"}})).level == Level::L1);
  CHECK(parse_config(doc_with({{"level", "mix"}})).level == Level::Mix);
  CHECK(parse_config(doc_with({{"level", "L2"}, {"task", "tensor"}, {"tensor", {{"list", {"Aten.mm.0.forward"}}}}}))
            .level == Level::L2);
}

TEST_CASE("dump_path is required and must be a non-empty string") {
  check_mentions(rejection(json::object()), {"\"dump_path\"", "missing", "required", "non-empty string"});
  check_mentions(rejection({{"dump_path", nullptr}}), {"\"dump_path\"", "missing"});
  check_mentions(rejection({{"dump_path", ""}}), {"\"dump_path\"", "\"\"", "empty", "non-empty string"});
  check_mentions(rejection({{"dump_path", 7}}), {"\"dump_path\"", "7", "should be a string", "non-empty string"});
}

TEST_CASE("async_dump and extra_info must be booleans") {
  check_mentions(rejection(doc_with({{"async_dump", "false"}})), {"\"async_dump\"", "\"false\"", "true or false"});
  check_mentions(rejection(doc_with({{"extra_info", 1}})), {"\"extra_info\"", "1", "true or false"});
}

TEST_CASE("precision and risk_level accept only their spelled values") {
  check_mentions(rejection(doc_with({{"precision", "medium"}})), {"\"precision\"", "\"medium\"", "\"low\", \"high\""});
  check_mentions(rejection(doc_with({{"risk_level", "focus"}})),
                 {"\"risk_level\"", "\"focus\"", "\"ALL\", \"FOCUS\", \"CORE\""});
  CHECK(parse_config(doc_with({{"risk_level", "CORE"}})).risk_level == RiskLevel::Core);
  CHECK(parse_config(doc_with({{"precision", "high"}})).precision == "high");
}

TEST_CASE("a task section that is not an object is rejected") {
  check_mentions(rejection(doc_with({{"statistics", {1, 2}}})), {"\"statistics\"", "[1,2]", "object"});
}

// ---- task section keys ----

TEST_CASE("scope, list and tensor_list must be lists of strings") {
  check_mentions(rejection(doc_with({{"statistics", {{"scope", "Aten.t.0.forward"}}}})),
                 {"\"statistics.scope\"", "\"Aten.t.0.forward\"", "list of strings"});
  check_mentions(rejection(doc_with({{"statistics", {{"list", {"relu", 3}}}}})),
                 {"\"statistics.list\"", "[\"relu\",3]", "list of strings"});
  check_mentions(rejection(doc_with({{"statistics", {{"tensor_list", true}}}})),
                 {"\"statistics.tensor_list\"", "true", "list of strings"});
}

TEST_CASE("a scope must have exactly two names") {
  check_mentions(rejection(doc_with({{"statistics", {{"scope", {"Aten.t.0.forward"}}}}})),
                 {"\"statistics.scope\"", "[\"Aten.t.0.forward\"]", "1 names", "exactly 2 names"});
  check_mentions(
      rejection(doc_with({{"statistics", {{"scope", {"Aten.t.0.forward", "Aten.t.1.forward", "Aten.t.2.forward"}}}}})),
      {"\"statistics.scope\"", "3 names", "exactly 2 names"});
}

TEST_CASE("an L1 scope must consist of API names") {
  const json doc = doc_with({{"statistics", {{"scope", {"Aten.t.0.forward", "Module.fc.Linear.forward.0"}}}}});
  check_mentions(rejection(doc),
                 {"\"statistics.scope\"", "\"Module.fc.Linear.forward.0\"", "API names", "Aten.relu.0.forward"});
  check_mentions(rejection(doc_with({{"statistics", {{"scope", {"Aten.t.0.forward", "Aten.relu.forward"}}}}})),
                 {"\"statistics.scope\"", "\"Aten.relu.forward\""});
  check_mentions(rejection(doc_with({{"statistics", {{"scope", {"Foo.t.0.forward", "Aten.t.1.forward"}}}}})),
                 {"\"Foo.t.0.forward\""});
  CHECK(parse_config(doc_with({{"statistics", {{"scope", {"Functional.linear.0.forward", "Tensor.sum.3.backward"}}}}}))
            .scope.size() == 2);
}

TEST_CASE("an L0 scope must consist of module names") {
  const json doc =
      doc_with({{"level", "L0"}, {"statistics", {{"scope", {"Module.fc.Linear.forward.0", "Aten.t.0.forward"}}}}});
  check_mentions(rejection(doc),
                 {"\"statistics.scope\"", "\"Aten.t.0.forward\"", "module names", "Module.fc.Linear.forward.0"});
  check_mentions(
      rejection(doc_with({{"level", "L0"},
                          {"statistics", {{"scope", {"Module.fc.Linear.forward.0", "Module.fc.Linear.0.forward"}}}}})),
      {"\"Module.fc.Linear.0.forward\""});
  CHECK(parse_config(
            doc_with({{"level", "L0"}, {"statistics", {{"scope", {"Module.a.A.forward.0", "Cell.b.B.backward.2"}}}}}))
            .scope.size() == 2);
}

TEST_CASE("a mix scope may combine an API name and a module name") {
  const Config c = parse_config(
      doc_with({{"level", "mix"}, {"statistics", {{"scope", {"Module.fc.Linear.forward.0", "Aten.t.0.forward"}}}}}));
  CHECK(c.scope.size() == 2);
  check_mentions(
      rejection(doc_with({{"level", "mix"}, {"statistics", {{"scope", {"Module.fc.Linear.forward.0", "fc"}}}}})),
      {"\"statistics.scope\"", "\"fc\"", "neither an API nor a module name"});
}

TEST_CASE("data_mode rejects combining all, unknown modes, too many modes and non-lists") {
  const std::string allowed = "\"all\", \"input\", \"output\", \"forward\", \"backward\"";
  check_mentions(rejection(doc_with({{"statistics", {{"data_mode", {"all", "input"}}}}})),
                 {"\"statistics.data_mode\"", "[\"all\",\"input\"]", "cannot be combined", allowed});
  check_mentions(rejection(doc_with({{"statistics", {{"data_mode", {"both"}}}}})),
                 {"\"statistics.data_mode\"", "\"both\" is not a data mode", allowed});
  check_mentions(
      rejection(doc_with({{"statistics", {{"data_mode", {"input", "output", "forward", "backward", "input"}}}}})),
      {"\"statistics.data_mode\"", "5 modes", "up to 4"});
  check_mentions(rejection(doc_with({{"statistics", {{"data_mode", "all"}}}})),
                 {"\"statistics.data_mode\"", "\"all\"", "list of strings", allowed});
  CHECK_THROWS_AS(DataMode::parse({"sideways"}), ConfigError);
}

TEST_CASE("data_mode backward allows only backward entries, both sides") {
  const DataMode m = DataMode::parse({"backward"});
  CHECK_FALSE(m.forward_inputs());
  CHECK_FALSE(m.forward_outputs());
  CHECK(m.backward_inputs());
  CHECK(m.backward_outputs());
  CHECK(m.any_backward());
  CHECK(m.allows_parameter_grads());
  CHECK_FALSE(m.allows_parameters());
}

TEST_CASE("data_mode forward plus input allows only the inputs of forward entries") {
  const DataMode m = DataMode::parse({"forward", "input"});
  CHECK(m.forward_inputs());
  CHECK_FALSE(m.forward_outputs());
  CHECK_FALSE(m.backward_inputs());
  CHECK_FALSE(m.backward_outputs());
  CHECK_FALSE(m.any_backward());  // no gradient hooks at all
  CHECK_FALSE(m.allows_parameters());
  CHECK_FALSE(m.allows_parameter_grads());
}

TEST_CASE("data_mode input allows forward inputs and backward inputs") {
  const DataMode m = DataMode::parse({"input"});
  CHECK(m.forward_inputs());
  CHECK_FALSE(m.forward_outputs());
  CHECK(m.backward_inputs());
  CHECK_FALSE(m.backward_outputs());
  CHECK(m.any_backward());  // the hooks run, for the inputs' gradients
}

TEST_CASE("data_mode all and an empty data_mode allow everything") {
  for (const auto& modes : {std::vector<std::string>{"all"}, std::vector<std::string>{}}) {
    const DataMode m = DataMode::parse(modes);
    CHECK(m.forward_inputs());
    CHECK(m.forward_outputs());
    CHECK(m.backward_inputs());
    CHECK(m.backward_outputs());
  }
}

TEST_CASE("summary_mode accepts statistics, md5 and xor only") {
  check_mentions(rejection(doc_with({{"statistics", {{"summary_mode", "sha1"}}}})),
                 {"\"statistics.summary_mode\"", "\"sha1\"", "\"statistics\", \"md5\", \"xor\""});
  CHECK(parse_config(doc_with({{"statistics", {{"summary_mode", "md5"}}}})).summary_mode == SummaryMode::Md5);
  CHECK(parse_config(doc_with({{"statistics", {{"summary_mode", "xor"}}}})).summary_mode == SummaryMode::Xor);
  CHECK(parse_config(doc_with({{"task", "tensor"}, {"tensor", {{"summary_mode", "md5"}}}})).summary_mode ==
        SummaryMode::Md5);
}

TEST_CASE("overflow_nums must be -1 or a positive integer") {
  const std::string allowed = "-1 (no limit) or an integer greater than 0";
  auto overflow = [](json n) {
    return doc_with({{"task", "overflow_check"}, {"overflow_check", {{"overflow_nums", n}}}});
  };
  check_mentions(rejection(overflow(0)), {"\"overflow_check.overflow_nums\"", ": 0 is invalid", allowed});
  check_mentions(rejection(overflow(-2)), {"\"overflow_check.overflow_nums\"", "-2", allowed});
  check_mentions(rejection(overflow("3")), {"\"overflow_check.overflow_nums\"", "\"3\"", "integer", allowed});
  check_mentions(rejection(overflow(2.5)), {"\"overflow_check.overflow_nums\"", "2.5", allowed});
  check_mentions(rejection(overflow(true)), {"\"overflow_check.overflow_nums\"", "true", allowed});
  CHECK(parse_config(overflow(-1)).overflow_nums == -1);
  CHECK(parse_config(overflow(5)).overflow_nums == 5);
}

TEST_CASE("bench_path is a non-empty path and diff_nums -1 or a positive integer, in statistics and tensor") {
  const auto live = [](const char* task, const json& path, const json& n) {
    return doc_with({{"task", task}, {task, {{"bench_path", path}, {"diff_nums", n}}}});
  };
  const Config c = parse_config(live("statistics", "./ref/step0/rank0", 3));
  CHECK(c.bench_path == "./ref/step0/rank0");
  CHECK(c.diff_nums == 3);
  CHECK(parse_config(live("tensor", "ref.json", -1)).diff_nums == -1);
  CHECK(parse_config(doc_with({{"task", "statistics"}, {"statistics", {{"bench_path", "r"}}}})).diff_nums == 1);
  CHECK(parse_config(doc_with(json::object())).bench_path.empty());
  const std::string allowed = "-1 (no limit) or an integer greater than 0";
  check_mentions(rejection(live("statistics", "r", 0)), {"\"statistics.diff_nums\"", ": 0 is invalid", allowed});
  check_mentions(rejection(live("tensor", "r", "2")), {"\"tensor.diff_nums\"", "\"2\"", allowed});
  check_mentions(rejection(live("statistics", 5, 1)), {"\"statistics.bench_path\"", "5", "string"});
  check_mentions(rejection(live("statistics", "", 1)), {"\"statistics.bench_path\"", "empty"});
  const Config o = Options().bench_path("ref.json").diff_nums(4).resolve(Level::Mix, Task::Statistics);
  CHECK(o.bench_path == "ref.json");
  CHECK(o.diff_nums == 4);
}

// ---- rules across keys ----

TEST_CASE("bench_path with async_dump is rejected: the live check reads each entry as it ends") {
  check_mentions(rejection(doc_with({{"async_dump", true}, {"statistics", {{"bench_path", "ref.json"}}}})),
                 {"\"statistics.bench_path\"", "ref.json", "async_dump"});
}

TEST_CASE("async_dump with summary_mode md5 is rejected") {
  check_mentions(rejection(doc_with({{"async_dump", true}, {"statistics", {{"summary_mode", "md5"}}}})),
                 {"\"statistics.summary_mode\"", "\"md5\"", "async_dump", "\"statistics\" or \"xor\""});
  CHECK(parse_config(doc_with({{"async_dump", true}, {"statistics", {{"summary_mode", "xor"}}}})).async_dump);
}

TEST_CASE("async_dump with task tensor needs a list, as in msprobe") {
  check_mentions(rejection(doc_with({{"async_dump", true}, {"task", "tensor"}})),
                 {"\"tensor.list\"", "[]", "async_dump", "non-empty list"});
  CHECK(
      parse_config(doc_with({{"async_dump", true}, {"task", "tensor"}, {"tensor", {{"list", {"relu"}}}}})).async_dump);
}

TEST_CASE("task structure forces level mix with a warning unless the level is L0 or mix") {
  const Config forced = parse_config(doc_with({{"task", "structure"}, {"level", "L1"}}));
  CHECK(forced.level == Level::Mix);
  CHECK(has_warning(forced, "\"structure\""));
  CHECK(has_warning(forced, "\"L1\""));
  CHECK(has_warning(forced, "\"mix\""));
  const Config kept = parse_config(doc_with({{"task", "structure"}, {"level", "L0"}}));
  CHECK(kept.level == Level::L0);
  CHECK(kept.warnings.empty());
}

TEST_CASE("free_benchmark takes scope or list but not both") {
  const json both =
      doc_with({{"task", "free_benchmark"}, {"free_benchmark", {{"scope", {"Aten.t.0.forward"}}, {"list", {"relu"}}}}});
  check_mentions(rejection(both), {"\"free_benchmark.scope\"", "either scope or list"});
  const Config names =
      parse_config(doc_with({{"task", "free_benchmark"}, {"free_benchmark", {{"scope", {"Aten.t.0.forward"}}}}}));
  CHECK(names.scope.size() == 1);
}

// ---- unknown and unsupported keys ----

TEST_CASE("unknown top-level keys produce a warning, not silence") {
  const Config c = parse_config(doc_with({{"foo", 1}}));
  REQUIRE(c.warnings.size() == 1);
  CHECK(c.warnings[0] == "unknown config key \"foo\" ignored");
}

TEST_CASE("unknown keys inside the task section produce a warning") {
  const Config c = parse_config(doc_with({{"statistics", {{"lst", {"relu"}}}}}));
  CHECK(has_warning(c, "unknown config key \"statistics.lst\" ignored"));
}

TEST_CASE("keys TorchProbe knows but does not implement yet produce a not-supported warning") {
  const Config c = parse_config(doc_with({{"enable_dataloader", true},
                                          {"acc_check", {{"white_list", json::array()}}},
                                          {"statistics", {{"slice", json::array()}}}}));
  CHECK(has_warning(c, "\"enable_dataloader\" is not supported by TorchProbe yet"));
  CHECK(has_warning(c, "\"acc_check\" is not supported by TorchProbe yet"));
  CHECK(has_warning(c, "\"statistics.slice\" is not supported by TorchProbe yet"));
}

TEST_CASE("a disabled unsupported feature needs no warning") {
  CHECK(parse_config(doc_with({{"enable_dataloader", false}})).warnings.empty());
}

TEST_CASE("section keys the running task does not declare are reported as ignored, and not read") {
  // What a task list (task/task_list.hpp) hands parse_config: here a tensor task reading summary_mode only.
  const torchprobe::TaskCatalog implemented{{torchprobe::Task::Tensor, {torchprobe::Level::L1}, {"summary_mode"}}};
  const json doc = doc_with({{"task", "tensor"}, {"tensor", {{"tensor_list", {"relu"}}, {"summary_mode", "md5"}}}});
  const Config c = parse_config(doc, &implemented);
  CHECK(has_warning(c, "\"tensor.tensor_list\" is ignored: task \"tensor\" does not use it"));
  CHECK(c.tensor_list.empty());
  CHECK(c.summary_mode == torchprobe::SummaryMode::Md5);
  // Without a task list only msprobe's schema is checked: every key TorchProbe knows is read.
  const Config schema_only = parse_config(doc);
  CHECK(schema_only.tensor_list == std::vector<std::string>{"relu"});
  CHECK_FALSE(has_warning(schema_only, "does not use it"));
}

TEST_CASE("a task list rejects the task and level pairs it lacks, naming what it has") {
  const torchprobe::TaskCatalog implemented{
      {torchprobe::Task::Statistics, {torchprobe::Level::L0, torchprobe::Level::L1}, {}},
      {torchprobe::Task::Tensor, {torchprobe::Level::L0, torchprobe::Level::L1}, {}},
      {torchprobe::Task::OverflowCheck, {torchprobe::Level::Mix}, {"overflow_nums"}}};
  CHECK_NOTHROW(parse_config(doc_with({{"task", "tensor"}, {"level", "L0"}}), &implemented));
  const std::string why = rejection(doc_with({{"task", "overflow_check"}, {"level", "L1"}}), &implemented);
  CHECK(why ==
        "config keys \"level\"/\"task\": level \"L1\" with task \"overflow_check\" is not available in this "
        "TorchProbe version (available: levels \"L0\", \"L1\" with tasks \"statistics\" and \"tensor\"; "
        "level \"mix\" with task \"overflow_check\")");
  check_mentions(rejection(doc_with({{"task", "free_benchmark"}}), &implemented),
                 {"\"free_benchmark\" is not available"});
}

TEST_CASE("sections of other tasks are ignored silently, even when they hold nonsense") {
  const Config c =
      parse_config(doc_with({{"tensor", {{"scope", 5}, {"whatever", 1}}}, {"overflow_check", {{"overflow_nums", 0}}}}));
  CHECK(c.warnings.empty());
}

TEST_CASE("msprobe's shipped config.json loads with one warning, for its acc_check section") {
  const Config c = parse_config(json::parse(R"({"task":"statistics","dump_path":"./dump_path","rank":[],"step":[],
    "level":"L1","extra_info":true,"async_dump":false,
    "statistics":{"scope":[],"list":[],"data_mode":["all"],"summary_mode":"statistics"},
    "tensor":{"scope":[],"list":[],"data_mode":["all"]},
    "acc_check":{"white_list":[],"black_list":[],"error_data_path":"./"}})"));
  REQUIRE(c.warnings.size() == 1);
  CHECK(has_warning(c, "\"acc_check\""));
}

// ---- files ----

TEST_CASE("a missing config file is reported with its path") {
  TempDir dir;
  const std::string path = (dir.path / "absent.json").string();
  try {
    load_config_file(path);
    FAIL("no error");
  } catch (const ConfigError& e) {
    check_mentions(e.what(), {path, "does not exist"});
  }
}

TEST_CASE("a directory given as config file is reported with its path") {
  TempDir dir;
  try {
    load_config_file(dir.path.string());
    FAIL("no error");
  } catch (const ConfigError& e) {
    check_mentions(e.what(), {dir.path.string(), "directory"});
  }
}

TEST_CASE("a config file with bad JSON is reported with its path and the parser's message") {
  TempDir dir;
  const std::string path = dir.write("config.json", "{\"dump_path\": \"./d\",}");
  try {
    load_config_file(path);
    FAIL("no error");
  } catch (const ConfigError& e) {
    check_mentions(e.what(), {path, "not valid JSON", "parse error"});
  }
}

TEST_CASE("an invalid value in a config file is reported with the file's path and the key") {
  TempDir dir;
  const std::string path = dir.write("config.json", R"({"dump_path": "./d", "step": ["6-4"]})");
  try {
    load_config_file(path);
    FAIL("no error");
  } catch (const ConfigError& e) {
    check_mentions(e.what(), {path, "\"step\"", "\"6-4\""});
  }
}

TEST_CASE("a valid config file loads") {
  TempDir dir;
  const std::string path = dir.write("config.json", R"({"task": "tensor", "dump_path": "./d", "level": "mix",
      "tensor": {"list": ["relu"], "data_mode": ["backward"]}})");
  const Config c = load_config_file(path);
  CHECK(c.task == Task::Tensor);
  CHECK(c.level == Level::Mix);
  CHECK(c.list == std::vector<std::string>{"relu"});
  CHECK_FALSE(c.data_mode.forward);
}

TEST_CASE("Options overrides win over the config file, and the file's other keys stay") {
  TempDir dir;
  const std::string path = dir.write("config.json", R"({"task": "statistics", "dump_path": "./from_file",
      "step": [1], "extra_info": false, "statistics": {"list": ["matmul"], "summary_mode": "md5"}})");
  const Config c = Options().config_file(path).dump_path("./from_options").step({0, "4-6"}).list({"relu"}).resolve();
  CHECK(c.dump_path == "./from_options");
  CHECK(c.step.values() == std::vector<int64_t>{0, 4, 5, 6});
  CHECK(c.list == std::vector<std::string>{"relu"});
  CHECK_FALSE(c.extra_info);                  // from the file
  CHECK(c.summary_mode == SummaryMode::Md5);  // from the file's section
  CHECK(c.warnings.empty());
}

TEST_CASE("section overrides go into the section of the task the file names") {
  TempDir dir;
  const std::string path = dir.write("config.json", R"({"task": "tensor", "dump_path": "./d"})");
  const Config c = Options().config_file(path).scope({"Aten.t.0.forward", "Aten.relu.0.forward"}).resolve();
  CHECK(c.task == Task::Tensor);
  CHECK(c.scope.size() == 2);
}

TEST_CASE("the Debugger's level and task win over the file, with a warning naming both") {
  TempDir dir;
  const std::string path = dir.write("config.json", R"({"task": "tensor", "level": "L0", "dump_path": "./d",
      "tensor": {"list": ["relu"]}})");
  const Config c = Options().config_file(path).list({"addmm"}).resolve(Level::L1, Task::Statistics);
  CHECK(c.level == Level::L1);
  CHECK(c.task == Task::Statistics);
  CHECK(c.list == std::vector<std::string>{"addmm"});  // the override follows the Debugger's task
  CHECK(has_warning(c, path));
  CHECK(has_warning(c, "says level \"L0\", this Debugger is \"L1\": using \"L1\""));
  CHECK(has_warning(c, "says task \"tensor\", this Debugger is \"statistics\": using \"statistics\""));
  CHECK(has_warning(c, "\"tensor\" section is ignored"));
}

TEST_CASE("a Debugger that agrees with the file, or a run without a file, gets no warning") {
  TempDir dir;
  const std::string path = dir.write("config.json", R"({"level": "mix", "dump_path": "./d"})");
  CHECK(Options().config_file(path).resolve(Level::Mix, Task::Statistics).warnings.empty());
  const Config c = Options().resolve(Level::L0, Task::Tensor);
  CHECK(c.level == Level::L0);
  CHECK(c.task == Task::Tensor);
  CHECK(c.warnings.empty());
}

TEST_CASE("a level set with Options::set also yields to the Debugger, with a warning") {
  const Config c = Options().set("level", "L0").resolve(Level::Mix);
  CHECK(c.level == Level::Mix);
  CHECK(has_warning(c, "Options says level \"L0\", this Debugger is \"mix\""));
}

TEST_CASE("Options::set records any key, and unknown keys reach the warnings") {
  const Config c = Options().set("extra_info", false).set("foo", 1).set("statistics", {{"list", {"relu"}}}).resolve();
  CHECK_FALSE(c.extra_info);
  CHECK(c.list == std::vector<std::string>{"relu"});
  CHECK(c.summary_mode == SummaryMode::Statistics);  // merged into the default section, not replacing it
  CHECK(has_warning(c, "unknown config key \"foo\" ignored"));
}

TEST_CASE("an invalid value given through Options is rejected like one in a file") {
  try {
    Options().summary_mode("sha1").resolve();
    FAIL("no error");
  } catch (const ConfigError& e) {
    check_mentions(e.what(), {"\"statistics.summary_mode\"", "\"sha1\"", "\"md5\""});
  }
  CHECK_THROWS_AS(Options().overflow_nums(0).resolve(Level::L1, Task::OverflowCheck), ConfigError);
}

TEST_CASE("a missing config file named in Options fails at resolve with its path") {
  CHECK_THROWS_WITH_AS(Options().config_file("/nonexistent/torchprobe.json").resolve(),
                       doctest::Contains("/nonexistent/torchprobe.json"), ConfigError);
}

TEST_CASE("enum names use config.json's spellings") {
  CHECK(summary_mode_name(SummaryMode::Statistics) == "statistics");
  CHECK(summary_mode_name(SummaryMode::Md5) == "md5");
  CHECK(summary_mode_name(SummaryMode::Xor) == "xor");
  CHECK(risk_level_name(RiskLevel::All) == "ALL");
  CHECK(risk_level_name(RiskLevel::Focus) == "FOCUS");
  CHECK(risk_level_name(RiskLevel::Core) == "CORE");
}

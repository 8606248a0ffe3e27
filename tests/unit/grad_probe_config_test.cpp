// The "grad_probe" section (config/grad_probe.hpp): msprobe's defaults, the bound labels as Python's
// str() writes them, and every value msprobe's GradToolConfig refuses, named by key, value and what
// is allowed (msprobe-grad-probe-run-ut.md §A.1).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "torchprobe/config/config.hpp"
#include "torchprobe/config/options.hpp"
#include "config_support.hpp"

using torchprobe::Config;
using torchprobe::GradLevel;
using torchprobe::parse_config;
using tptest::doc_with;
using tptest::rejection;
using json = nlohmann::json;

namespace {

json gp(json section) { return doc_with({{"task", "grad_probe"}, {"grad_probe", std::move(section)}}); }

void check_rejected(const json& doc, const std::vector<std::string>& parts) {
  const std::string why = rejection(doc);
  INFO(why);
  CHECK(why != "(accepted)");
  for (const std::string& p : parts) CHECK(why.find(p) != std::string::npos);
}

std::vector<std::string> labels(const Config& c) {
  std::vector<std::string> out;
  for (const auto& b : c.grad_probe.bounds) out.push_back(b.text);
  return out;
}

}  // namespace

TEST_CASE("grad_probe defaults are msprobe's: level L1, every parameter, bounds [-1, 0, 1]") {
  const Config c = parse_config(doc_with({{"task", "grad_probe"}}));
  CHECK(c.task == torchprobe::Task::GradProbe);
  CHECK(c.grad_probe.grad_level == GradLevel::L1);
  CHECK(c.grad_probe.param_list.empty());
  CHECK(labels(c) == std::vector<std::string>{"-1", "0", "1"});
  CHECK(c.grad_probe.bounds[0].value == -1.0);
  CHECK(c.warnings.empty());
}

TEST_CASE("grad_probe reads the reference configs' sections as msprobe does") {
  const Config c = parse_config(doc_with(
      {{"task", "grad_probe"},
       {"step", {1}},
       {"grad_probe",
        {{"grad_level", "L2"}, {"param_list", {"fc.weight"}}, {"bounds", json::parse("[-0.5, -0.1, 0, 0.1, 0.5]")}}}}));
  CHECK(c.grad_probe.grad_level == GradLevel::L2);
  CHECK(c.grad_probe.param_list == std::vector<std::string>{"fc.weight"});
  CHECK(labels(c) == std::vector<std::string>{"-0.5", "-0.1", "0", "0.1", "0.5"});
  CHECK(c.step.values() == std::vector<int64_t>{1});
  CHECK(c.warnings.empty());  // grad_level, param_list and bounds are known keys of this section
  CHECK(parse_config(gp({{"grad_level", "L0"}})).grad_probe.grad_level == GradLevel::L0);
}

TEST_CASE("bound labels keep the JSON number's int or float spelling, as Python's str()") {
  CHECK(labels(parse_config(gp({{"bounds", json::parse("[-1, 1.0, 2]")}}))) ==
        std::vector<std::string>{"-1", "1.0", "2"});
  CHECK(labels(parse_config(gp({{"bounds", json::parse("[1e-5, 0.001, 9007199254740993, 1e16]")}}))) ==
        std::vector<std::string>{"1e-05", "0.001", "9007199254740993", "1e+16"});
  CHECK(parse_config(gp({{"bounds", json::array()}})).grad_probe.bounds.empty());  // allowed, as in msprobe
}

TEST_CASE("a grad_level msprobe lacks is named with the allowed levels") {
  check_rejected(gp({{"grad_level", "L3"}}), {"\"grad_probe.grad_level\"", "\"L3\"", "\"L0\", \"L1\", \"L2\""});
  check_rejected(gp({{"grad_level", "l1"}}), {"\"grad_probe.grad_level\"", "case-sensitive"});
  check_rejected(gp({{"grad_level", 1}}), {"\"grad_probe.grad_level\"", "should be a string"});
}

TEST_CASE("param_list must be a list of names") {
  check_rejected(gp({{"param_list", "fc.weight"}}), {"\"grad_probe.param_list\"", "\"fc.weight\"", "list"});
  check_rejected(gp({{"param_list", {1, 2}}}), {"\"grad_probe.param_list\"", "[1,2]", "list of strings"});
}

TEST_CASE("bounds must be a list of ascending int or float numbers in int64 range") {
  check_rejected(gp({{"bounds", 1}}), {"\"grad_probe.bounds\"", "should be a list", "strictly ascending"});
  check_rejected(gp({{"bounds", json::parse("[0, true]")}}),
                 {"\"grad_probe.bounds\"", "true", "not an int or a float"});
  check_rejected(gp({{"bounds", json::parse("[0, \"1\"]")}}), {"\"grad_probe.bounds\"", "\"1\"", "not an int"});
  check_rejected(gp({{"bounds", json::parse("[0, 1, 1]")}}),
                 {"\"grad_probe.bounds\"", "[0,1,1]", "not strictly ascending"});
  check_rejected(gp({{"bounds", json::parse("[1, 0]")}}), {"not strictly ascending at 0"});
  check_rejected(gp({{"bounds", json::parse("[0, 9223372036854775808]")}}),
                 {"\"grad_probe.bounds\"", "9223372036854775808", "int64 range"});
  check_rejected(gp({{"bounds", json::parse("[-1e19, 0]")}}), {"int64 range"});
  CHECK(rejection(gp({{"bounds", json::parse("[-9223372036854775808, 9223372036854775807]")}})) == "(accepted)");
}

TEST_CASE("grad_probe is a task config.json may name, and its keys are ignored in other tasks") {
  const Config c = parse_config(doc_with({{"task", "statistics"}, {"grad_probe", {{"grad_level", "L9"}}}}));
  CHECK(c.task == torchprobe::Task::Statistics);  // another task's section is not read
  CHECK(c.warnings.empty());
}

TEST_CASE("Options file grad_level, param_list and bounds under the grad_probe section") {
  const Config c = torchprobe::Options()
                       .set("task", "grad_probe")
                       .dump_path("./gp")
                       .set("grad_level", "L2")
                       .set("bounds", json::parse("[0.5]"))
                       .resolve();
  CHECK(c.grad_probe.grad_level == GradLevel::L2);
  CHECK(labels(c) == std::vector<std::string>{"0.5"});
  CHECK(c.dump_path == "./gp");
  CHECK_THROWS_AS(torchprobe::Options().set("task", "grad_probe").set("grad_level", "L5").resolve(),
                  torchprobe::ConfigError);
}

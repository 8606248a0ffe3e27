// "level": "L2" in a config file: msprobe's L2 rules where they apply to TorchProbe's L2 (every
// ATen call, nested ones too): no scope, at most one listed name, which is an API entry to
// descend into; tasks statistics and tensor.
#include <doctest/doctest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchprobe/config/config.hpp"
#include "config_support.hpp"

using nlohmann::json;
using namespace torchprobe;
using tptest::doc_with;
using tptest::rejection;

namespace {

void check_mentions(const std::string& message, std::initializer_list<std::string> parts) {
  INFO("message: " << message);
  for (const std::string& part : parts) CHECK(message.find(part) != std::string::npos);
}

json l2(const std::string& task, json list) {
  return doc_with({{"level", "L2"}, {"task", task}, {task, {{"list", list}}}});
}

}  // namespace

TEST_CASE("level L2 is accepted with task statistics or tensor, an empty list or one API entry name") {
  for (const char* task : {"statistics", "tensor"}) {
    CHECK(parse_config(l2(task, json::array())).level == Level::L2);
    const Config forward = parse_config(l2(task, {"Aten.linear.0.forward"}));
    CHECK(forward.level == Level::L2);
    CHECK(forward.list == std::vector<std::string>{"Aten.linear.0.forward"});
    CHECK(parse_config(l2(task, {"Aten.linear.3.backward"})).list.front() == "Aten.linear.3.backward");
  }
  CHECK(parse_config(doc_with({{"level", "L2"}})).level == Level::L2);  // task statistics by default
}

TEST_CASE("level L2 rejects, by key, more than one listed name, a name that is no API entry, a scope and other tasks") {
  const std::string allowed = "[] (every call) or one API entry name such as \"Aten.linear.0.forward\"";
  check_mentions(rejection(l2("tensor", {"Aten.t.0.forward", "Aten.mm.0.forward"})),
                 {"config key \"tensor.list\"", "[\"Aten.t.0.forward\",\"Aten.mm.0.forward\"]", "one API call",
                  "2 names", allowed});
  check_mentions(rejection(l2("statistics", {"linear"})),
                 {"config key \"statistics.list\"", "\"linear\"", "entry name", allowed});
  check_mentions(rejection(l2("statistics", {"Module.fc.Linear.forward.0"})),
                 {"\"statistics.list\"", "Module.fc.Linear.forward.0", allowed});
  check_mentions(
      rejection(doc_with(
          {{"level", "L2"}, {"task", "tensor"}, {"tensor", {{"scope", {"Aten.t.0.forward", "Aten.t.1.forward"}}}}})),
      {"\"tensor.scope\"", "Aten.t.0.forward", "\"L2\" does not take a scope", "[]"});
  for (const char* task : {"overflow_check", "free_benchmark", "grad_probe"})
    check_mentions(rejection(doc_with({{"level", "L2"}, {"task", task}})),
                   {"config key \"task\"", task, "\"L2\" works with task \"statistics\" or \"tensor\""});
}

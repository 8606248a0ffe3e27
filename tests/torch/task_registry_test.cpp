// The task list: what PrecisionDebugger dispatches on, and what the configuration is checked against.
#include <algorithm>
#include <fstream>
#include <string>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <torchprobe/torchprobe.hpp>

#include "test_support.hpp"
#include "toy_task.hpp"

namespace tp = torchprobe;

namespace {

// The built-in tasks plus the test's own: the one line that registers it.
using TasksWithToy = tp::TaskList<tp::StatisticsTask, tp::TensorTask, tp::OverflowCheckTask, tptest::ToyShapesTask>;

std::string write_config(const tptest::TempDir& tmp, const std::string& task, const std::string& level,
                         const std::string& section = "{}") {
  const std::string cfg = tmp / "config.json";
  std::ofstream(cfg) << R"({"task": ")" << task << R"(", "level": ")" << level << R"(", "dump_path": ")"
                     << (tmp / "dump") << R"(", ")" << task << "\": " << section << "}";
  return cfg;
}

}  // namespace

TEST_CASE("a task registered in a task list runs under PrecisionDebugger and writes what its describe() says") {
  tptest::TempDir tmp;
  const at::Tensor a = torch::rand({2, 3}, torch::kFloat64), b = torch::rand({2, 3}, torch::kFloat64);
  {
    tp::BasicPrecisionDebugger<TasksWithToy> dbg(write_config(tmp, "toy_shapes", "mix"));
    tptest::Net net;  // mix dumps a model's modules: start() needs one (here not called)
    dbg.start(net);
    at::add(a, b);
    dbg.stop();
  }
  const nlohmann::ordered_json dump =
      tptest::read_json(tmp / ("dump/step0/proc" + std::to_string(::getpid()) + "/dump.json"));
  CHECK(dump["task"] == "toy_shapes");
  CHECK(dump["level"] == "mix");
  CHECK(dump["dump_data_dir"].is_null());
  const nlohmann::ordered_json& in = dump["data"]["Aten.add.0.forward"]["input_args"][0];
  CHECK(in == nlohmann::ordered_json({{"type", "torch.Tensor"}, {"dtype", "torch.float64"}, {"shape", {2, 3}}}));
  CHECK(dump["data"]["Aten.add.0.forward"]["output"][0]["shape"] == nlohmann::ordered_json({2, 3}));
}

TEST_CASE("the task list decides which tasks and levels a config may name, and says what it has") {
  tptest::TempDir tmp;
  // The built-in list has no free_benchmark at mix (msprobe runs it at L1).
  CHECK_THROWS_WITH_AS(tp::PrecisionDebugger{write_config(tmp, "free_benchmark", "mix")},
                       doctest::Contains("level \"mix\" with task \"free_benchmark\" is not available"),
                       tp::ConfigError);
  // A name neither msprobe nor the list has: the message lists msprobe's tasks, then the list's own.
  CHECK_THROWS_WITH_AS(tp::BasicPrecisionDebugger<TasksWithToy>{write_config(tmp, "toy_shape", "mix")},
                       doctest::Contains("\"structure\", \"grad_probe\", \"run_ut\", \"toy_shapes\")"),
                       tp::ConfigError);
  // The built-in list does not know the toy.
  CHECK_THROWS_WITH_AS(tp::PrecisionDebugger{write_config(tmp, "toy_shapes", "mix")},
                       doctest::Contains("it is not a task"), tp::ConfigError);
  // The toy declares level mix only; the message lists the whole list's offer.
  CHECK_THROWS_WITH_AS(
      tp::BasicPrecisionDebugger<TasksWithToy>{write_config(tmp, "toy_shapes", "L0")},
      doctest::Contains(
          "levels \"L0\", \"L1\", \"mix\", \"L2\", \"debug\" with tasks \"statistics\" and \"tensor\"; levels \"L0\", "
          "\"L1\", \"mix\" with task \"overflow_check\"; level \"mix\" with task \"toy_shapes\")"),
      tp::ConfigError);
}

TEST_CASE("a section key the task does not declare is ignored with a warning") {
  tptest::TempDir tmp;
  tp::BasicPrecisionDebugger<TasksWithToy> dbg(write_config(tmp, "toy_shapes", "mix", R"({"summary_mode": "md5"})"));
  const auto& w = dbg.config().warnings;
  CHECK(std::find(w.begin(), w.end(),
                  "config key \"toy_shapes.summary_mode\" is ignored: task \"toy_shapes\" does not use it") != w.end());
  CHECK(dbg.config().summary_mode == tp::SummaryMode::Statistics);
}

TEST_CASE("the built-in task list declares what each task reads and saves") {
  const tp::TaskCatalog& c = tp::BuiltinTasks::catalog();
  REQUIRE(c.size() == 5);
  CHECK(c[0].name == tp::Task::Statistics);
  CHECK(c[0].reads("tensor_list"));
  CHECK_FALSE(c[1].reads("tensor_list"));
  CHECK(c[2].reads("overflow_nums"));
  CHECK_FALSE(c[2].levels.contains(tp::Level::Debug));
  CHECK(c[3].name == tp::Task::FreeBenchmark);
  CHECK(c[3].reads("pert_mode"));
  CHECK(c[3].levels.contains(tp::Level::L1));
  CHECK_FALSE(c[3].levels.contains(tp::Level::Mix));
  tp::Config config;
  CHECK_FALSE(tp::StatisticsTask::saves_tensors(config));
  config.tensor_list = {"relu"};
  CHECK(tp::StatisticsTask::saves_tensors(config));
  CHECK(tp::TensorTask::saves_tensors(tp::Config{}));
  CHECK(tp::OverflowCheckTask::saves_tensors(tp::Config{}));
  CHECK_FALSE(tp::FreeBenchmarkTask::saves_tensors(tp::Config{}));
  CHECK(c[4].name == tp::Task::Structure);
  CHECK(c[4].levels.contains(tp::Level::L0));
  CHECK_FALSE(c[4].levels.contains(tp::Level::L1));
  CHECK_FALSE(tp::StructureTask::saves_tensors(tp::Config{}));
}

// Task::FreeBenchmark with if_preheat (task/free_benchmark/preheat.hpp) through the Debugger: which
// calls of each step are re-run (the CSV rows of calls that are always flagged name them), the
// threshold schedule the summary reports, and a run that stays bit-identical in check mode.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <set>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace tp = torchprobe;
using Json = nlohmann::ordered_json;

namespace {

using FreeBenchmark = tp::Debugger<tp::Level::L1, tp::Task::FreeBenchmark>;

std::string step_dir(const std::string& dump, int step) {
  return dump + "/step" + std::to_string(step) + "/proc" + std::to_string(::getpid());
}

tp::Options preheated(const std::string& dir, int preheat_step, int max_sample) {
  return tp::Options()
      .dump_path(dir)
      .set("if_preheat", true)
      .set("preheat_step", preheat_step)
      .set("max_sample", max_sample);
}

// The api_name field of the step's CSV rows (Python's csv module reads the file).
std::set<std::string> flagged_calls(const std::string& dir) {
  const std::string path = dir + "/free_benchmark.csv";
  if (!std::filesystem::exists(path)) return {};
  int rc = 0;
  const std::string out = tptest::run_python(
      "import csv\nfor r in list(csv.reader(open('" + path + "', newline='')))[1:]: print(r[4])\n", &rc);
  REQUIRE_MESSAGE(rc == 0, out);
  std::set<std::string> names;
  std::size_t from = 0;
  for (std::size_t nl; (nl = out.find('\n', from)) != std::string::npos; from = nl + 1)
    names.insert(out.substr(from, nl - from));
  return names;
}

}  // namespace

TEST_CASE("with preheat, step 0 re-runs nothing and each later step re-runs the k calls msprobe samples") {
  // 8 fp16 muls that overflow (60000 * 2) per step: improve_precision flags every call it re-runs,
  // so the rows name the sampled calls. preheat_step 3, max_sample 2: k = min(ceil(8 / 3), 2) = 2,
  // call numbers (3 * (i - 1) + step) % 8 for i = 1, 2, counted from 1 (names count from 0).
  tptest::TempDir tmp;
  const at::Tensor big = torch::full({4}, 60000.0, torch::kHalf);
  {
    FreeBenchmark dbg(preheated(tmp.path(), 3, 2));
    for (int step = 0; step < 5; ++step) {
      dbg.start();
      for (int i = 0; i < 8; ++i) static_cast<void>(big * 2);
      dbg.stop();
      dbg.step();
    }
  }
  const std::vector<std::set<std::string>> expected = {
      {},
      {"Aten.mul.0.forward", "Aten.mul.3.forward"},  // step 1: calls 1 and 4
      {"Aten.mul.1.forward", "Aten.mul.4.forward"},  // step 2: calls 2 and 5
      {"Aten.mul.2.forward", "Aten.mul.5.forward"},  // step 3, past the preheat: calls 3 and 6
      {"Aten.mul.3.forward", "Aten.mul.6.forward"}};
  for (int step = 0; step < 5; ++step) {
    CAPTURE(step);
    CHECK(flagged_calls(step_dir(tmp.path(), step)) == expected[static_cast<std::size_t>(step)]);
    const Json summary = tptest::read_json(step_dir(tmp.path(), step) + "/free_benchmark_summary.json");
    CHECK(summary["checked_calls"] == (step == 0 ? 0 : 2));
  }
}

TEST_CASE("with preheat, a CPU-consistent API's threshold halves from 2.05 per preheat step to its dtype's default") {
  // An exact fp16 mul (1.5 * 2) agrees with fp32 and with the CPU: thd - 1 halves after each of the
  // preheat steps 1..4, then stays. An fp16 sum beyond fp16's range disagrees with the CPU: its
  // threshold stays min(its ratio, 2.05) = 2.05 and it is no longer preheated, but still listed.
  tptest::TempDir tmp;
  const at::Tensor exact = torch::full({4}, 1.5, torch::kHalf), many = torch::full({1000}, 100.0, torch::kHalf);
  {
    FreeBenchmark dbg(preheated(tmp.path(), 5, 20));
    for (int step = 0; step < 7; ++step) {
      dbg.start();
      static_cast<void>(exact * 2);
      static_cast<void>(many.sum());
      dbg.stop();
      dbg.step();
    }
  }
  const double mul_thd[] = {2.05, 1.525, 1.2625, 1.13125, 1.065625, 1.065625, 1.065625};
  for (int step = 1; step < 7; ++step) {
    CAPTURE(step);
    const std::string dir = step_dir(tmp.path(), step);
    const Json summary = tptest::read_json(dir + "/free_benchmark_summary.json");
    CHECK(summary["thresholds"]["Aten.mul"]["torch.float16"].get<double>() == doctest::Approx(mul_thd[step]));
    CHECK(summary["thresholds"]["Aten.sum"]["torch.float16"].get<double>() == 2.05);
    CHECK(flagged_calls(dir) == std::set<std::string>{"Aten.sum.0.forward"});
  }
}

TEST_CASE("with preheat, check mode leaves a training run bit-identical") {
  auto train = [](FreeBenchmark* dbg) {
    torch::manual_seed(5);
    torch::nn::Linear fc(8, 4);
    torch::optim::SGD opt(fc->parameters(), 0.1);
    const at::Tensor x = torch::randn({16, 8});
    for (int step = 0; step < 4; ++step) {
      if (dbg) dbg->start();
      opt.zero_grad();
      const at::Tensor loss = (fc(x).to(torch::kHalf) * 3).to(torch::kFloat).pow(2).mean();
      loss.backward();
      opt.step();
      if (dbg) {
        dbg->stop();
        dbg->step();
      }
    }
    return std::vector<at::Tensor>{fc->weight.detach().clone(), fc->bias.detach().clone()};
  };
  const std::vector<at::Tensor> plain = train(nullptr);
  for (const char* mode : {"improve_precision", "add_noise", "to_cpu"}) {
    INFO(mode);
    tptest::TempDir tmp;
    tp::Options o = preheated(tmp.path(), 2, 20).set("pert_mode", mode);
    if (std::string(mode) == "to_cpu") o.set("fuzz_device", "cpu");
    FreeBenchmark dbg(o);
    const std::vector<at::Tensor> probed = train(&dbg);
    dbg.wait_written();
    for (std::size_t i = 0; i < plain.size(); ++i) CHECK(torch::equal(plain[i], probed[i]));
    const Json summary = tptest::read_json(step_dir(tmp.path(), 3) + "/free_benchmark_summary.json");
    CHECK(summary["checked_calls"].get<int>() > 0);
    CHECK_FALSE(std::filesystem::exists(step_dir(tmp.path(), 3) + "/dump_error_info.log"));
  }
}

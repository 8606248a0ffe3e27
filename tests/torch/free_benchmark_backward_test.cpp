// Task::FreeBenchmark with fuzz_stage backward (task/free_benchmark/backward.hpp): the backward of the
// listed APIs recomputed with original and perturbed inputs when their gradient arrives, the input
// gradients compared, rows with stage "backward"; the training run's gradients unchanged.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <string>

#include "test_support.hpp"

namespace tp = torchprobe;
using Json = nlohmann::ordered_json;

TEST_CASE("backward stage: an fp16 mul whose input gradient overflows is listed, the exact one is not") {
  // y = a * b, loss = sum(y * 4): the gradient reaching the mul is 4, so da = 4 * b = 240000 (inf in
  // fp16, not in fp32: flagged) and db = 4 * a = [4, 8] (exact: not flagged).
  auto run = [](tp::Debugger<tp::Level::L1, tp::Task::FreeBenchmark>* dbg) {
    const at::Tensor a = torch::tensor({1.0, 2.0}).to(torch::kHalf).requires_grad_();
    const at::Tensor b = torch::full({2}, 60000.0, torch::kHalf).requires_grad_();
    if (dbg) dbg->start();
    (torch::mul(a, b) * 4).to(torch::kFloat).sum().backward();
    if (dbg) {
      dbg->stop();
      dbg->step();
    }
    return std::vector<at::Tensor>{a.grad().clone(), b.grad().clone()};
  };
  const std::vector<at::Tensor> plain = run(nullptr);
  CHECK(std::isinf(plain[0][0].item<float>()));
  tptest::TempDir tmp;
  std::vector<at::Tensor> probed;
  {
    tp::Debugger<tp::Level::L1, tp::Task::FreeBenchmark> dbg(
        tp::Options().dump_path(tmp.path()).list({"Aten.mul.0.forward"}).set("fuzz_stage", "backward"));
    probed = run(&dbg);
  }
  for (std::size_t i = 0; i < plain.size(); ++i) CHECK(torch::equal(plain[i], probed[i]));
  const std::string path = tmp.path() + "/step0/proc" + std::to_string(::getpid()) + "/free_benchmark.csv";
  int rc = 0;
  const std::string out = tptest::run_python(
      "import csv, json\nprint(json.dumps(list(csv.reader(open('" + path + "', newline='')))[1:]))\n", &rc);
  REQUIRE_MESSAGE(rc == 0, out);
  const Json rows = Json::parse(out);
  REQUIRE(rows.size() == 1);
  // inf against 240000: nan_to_num makes the ratio fp32's largest value, as in the forward stage.
  CHECK(rows[0] == Json{"0", "improve_precision", "backward", "0", "Aten.mul.0.forward", "3.4028234663852886e+38",
                        "torch.float16", "torch.Size([2])", "0"});
}

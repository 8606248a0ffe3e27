// Task::FreeBenchmark with pert_mode to_cpu: the CSV rows of msprobe's CheckerHandler.other_compare
// (msprobe-reference.md §7.3): a row per inconsistent call, max_rel empty; a tensor output gives its
// dtype and shape, a tuple output one row with neither (nor an output_index), judged by
// SingleCompare.compare_seq, which swaps the roles of each element (the original is the golden).
// Values worked out by hand from fp16 [1, 2, 2] and [1e4, -1e4].
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <functional>
#include <string>

#include "test_support.hpp"

namespace tp = torchprobe;
using Json = nlohmann::ordered_json;

namespace {

// The rows of the step's CSV as Python's csv module reads them (empty when there is no CSV).
Json to_cpu_rows(const std::function<void()>& program) {
  tptest::TempDir tmp;
  {
    tp::Debugger<tp::Level::L1, tp::Task::FreeBenchmark> dbg(
        tp::Options().dump_path(tmp.path()).set("pert_mode", "to_cpu").set("fuzz_device", "cpu"));
    dbg.start();
    program();
    dbg.stop();
    dbg.step();
  }
  const std::string path = tmp.path() + "/step0/proc" + std::to_string(::getpid()) + "/free_benchmark.csv";
  if (!std::filesystem::exists(path)) return Json::array();
  int rc = 0;
  const std::string out = tptest::run_python(
      "import csv, json\nprint(json.dumps(list(csv.reader(open('" + path + "', newline='')))[1:]))\n", &rc);
  REQUIRE_MESSAGE(rc == 0, out);
  return Json::parse(out);
}

}  // namespace

TEST_CASE("to_cpu: a tensor output off the CPU's by more than the fp16 bounds gives its dtype and shape, no max_rel") {
  // mean(fp16 [1, 2, 2]) = 1.6669921875 against the CPU's fp32 1.6666666: relative error 1.95e-4
  // is within fp16's rtol 2^-11, but the error balance (the same, signed) is above 1e-4.
  const at::Tensor x = torch::tensor({1.0, 2.0, 2.0}).to(torch::kHalf);
  const Json rows = to_cpu_rows([&] { static_cast<void>(x.mean()); });
  REQUIRE(rows.size() == 1);
  CHECK(rows[0] ==
        Json{"0", "to_cpu", "forward", "0", "Aten.mean.0.forward", "", "torch.float16", "torch.Size([])", ""});
}

TEST_CASE("to_cpu: a tuple output is one row without output_index, dtype or shape") {
  // var_mean(fp16 [1, 2, 2]) = (0.333251953125, 1.6669921875); the CPU's fp32 (0.33333334, 1.6666666)
  // is the actual value of each element, so fp32's bounds apply: |0.33333 - 0.33325| = 8.1e-5 > 2^-14.
  const at::Tensor x = torch::tensor({1.0, 2.0, 2.0}).to(torch::kHalf);
  const Json rows = to_cpu_rows([&] { static_cast<void>(torch::var_mean(x)); });
  REQUIRE(rows.size() == 1);
  CHECK(rows[0][4].get<std::string>().rfind("Aten.var_mean.", 0) == 0);
  CHECK(rows[0] == Json{"0", "to_cpu", "forward", "0", rows[0][4], "", "", "", ""});
}

TEST_CASE("to_cpu: an inf in a tuple output's original is msprobe's golden, so the call is not listed") {
  // var_mean(fp16 [1e4, -1e4]) = (inf, 0) against the CPU's (2e8, 0): as a tensor output the inf
  // would be flagged (the sum below), inside a tuple it is the golden value and compare_seq passes.
  const at::Tensor x = torch::tensor({1e4, -1e4}).to(torch::kHalf);
  const Json rows = to_cpu_rows([&] {
    static_cast<void>(torch::var_mean(x));
    static_cast<void>(torch::full({1000}, 100.0, torch::kHalf).sum());
  });
  REQUIRE(rows.size() == 1);
  CHECK(rows[0] ==
        Json{"0", "to_cpu", "forward", "0", "Aten.sum.0.forward", "", "torch.float16", "torch.Size([])", ""});
}

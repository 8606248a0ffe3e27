// random_save (random_save.hpp): the CSV of random ATen calls, read back by python3's csv module.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <string>
#include <vector>

#include "test_support.hpp"

namespace tp = torchprobe;

// Call sites with external linkage and not inlined, so that the CSV can name them.
namespace tp_random_save_test {

int randn_line = 0, dropout_line = 0;

__attribute__((noinline)) at::Tensor draw_randn() {
  randn_line = __LINE__ + 1;
  return torch::randn({2, 3});
}

__attribute__((noinline)) at::Tensor apply_dropout(const at::Tensor& x) {
  dropout_line = __LINE__ + 1;
  return torch::dropout(x, 0.5, true);
}

}  // namespace tp_random_save_test

TEST_CASE("random_save writes one CSV row per outermost random call, in order, with its call site, shape and dtype") {
  namespace t = tp_random_save_test;
  tptest::TempDir tmp;
  tp::random_save(tmp / "out");
  const at::Tensor x = t::draw_randn();
  torch::relu(x);  // not random: no row
  t::apply_dropout(x);
  torch::rand({4}, torch::kFloat64).uniform_();
  torch::randint(0, 5, {3}, torch::kInt64);
  tp::random_save_stop();
  torch::randn({1});  // after stop: no row

  const std::string rows = tptest::run_python("import csv\nfor r in csv.reader(open('" + (tmp / "out/random_save.csv") +
                                              "', newline='')): print('|'.join(r[:2] + r[4:]))");
  CHECK(rows ==
        "index|api|shape|dtype|device\n"
        "0|aten::randn|[2, 3]|torch.float32|cpu\n"
        "1|aten::dropout|[2, 3]|torch.float32|cpu\n"
        "2|aten::rand|[4]|torch.float64|cpu\n"
        "3|aten::uniform_|[4]|torch.float64|cpu\n"
        "4|aten::randint|[3]|torch.int64|cpu\n");

  // Call sites: file:line with debug information, else the executable and offset; the function
  // is named either way (the test executable is linked with -rdynamic).
  const std::string sites =
      tptest::run_python("import csv\nfor r in list(csv.reader(open('" + (tmp / "out/random_save.csv") +
                         "', newline='')))[1:3]: print(r[2]); print(r[3])");
  std::vector<std::string> lines;
  std::istringstream in(sites);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  REQUIRE(lines.size() == 4);
  CHECK(lines[1].find("draw_randn") != std::string::npos);
  CHECK(lines[3].find("apply_dropout") != std::string::npos);
  if (lines[0].find("random_save_test.cpp:") != std::string::npos) {
    CHECK(lines[0].substr(lines[0].rfind(':') + 1) == std::to_string(t::randn_line));
    CHECK(lines[2].substr(lines[2].rfind(':') + 1) == std::to_string(t::dropout_line));
  } else {
    CHECK(lines[0].find("+0x") != std::string::npos);
    MESSAGE("SKIPPED: the test executable has no debug information: call sites are offsets, not lines");
  }
}

TEST_CASE("random_save into a path that cannot be a directory throws, naming the file") {
  tptest::TempDir tmp;
  { std::ofstream(tmp / "file") << "x"; }
  CHECK_THROWS_WITH_AS(tp::random_save(tmp / "file"),
                       ("torchprobe::random_save: cannot write " + (tmp / "file") + "/random_save.csv").c_str(),
                       std::runtime_error);
}

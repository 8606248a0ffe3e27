// random_save (random_save.hpp): the CSV of random ATen calls, read back by python3's csv module.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/random_save.hpp>
#include <torchprobe/torchprobe.hpp>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;

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

TEST_CASE(
    "random_save writes one CSV row per outermost random call, in order, with msprobe's api_name and stack, then its "
    "call site, shape and dtype") {
  namespace t = tp_random_save_test;
  tptest::TempDir tmp;
  // msprobe's name: random_rank{id}_{timestamp}.csv, here with the rank given.
  const std::string file = tp::random_save(tmp / "out", 2);
  CHECK(std::regex_match(file, std::regex(".*/out/random_rank2_[0-9]{14}\\.csv")));
  const at::Tensor x = t::draw_randn();
  torch::relu(x);  // not random: no row
  t::apply_dropout(x);
  torch::rand({4}, torch::kFloat64).uniform_();
  torch::randint(0, 5, {3}, torch::kInt64);
  tp::random_save_stop();
  torch::randn({1});  // after stop: no row

  const std::string rows = tptest::run_python("import csv\nfor r in csv.reader(open('" + file +
                                              "', newline='')): print('|'.join([r[0], r[2]] + r[5:]))");
  CHECK(rows ==
        "api_name|index|shape|dtype|device\n"
        "aten::randn|0|[2, 3]|torch.float32|cpu\n"
        "aten::dropout|1|[2, 3]|torch.float32|cpu\n"
        "aten::rand|2|[4]|torch.float64|cpu\n"
        "aten::uniform_|3|[4]|torch.float64|cpu\n"
        "aten::randint|4|[3]|torch.int64|cpu\n");
  // stack: from the user's call site outwards, one frame a line as stack.json writes them.
  const std::string stacks = tptest::run_python(
      "import csv\nrows = list(csv.reader(open('" + file +
      "', newline='')))\nprint(rows[0][1])\nfor r in rows[1:3]: f = r[1].split('\\n'); print(f[0].startswith('File "
      "'), r[4] in f[0], len(f) > 1)");
  CHECK(stacks == "stack\nTrue True True\nTrue True True\n");

  // Call sites: file:line with debug information, else the executable and offset; the function
  // is named either way (the test executable is linked with -rdynamic).
  const std::string sites = tptest::run_python("import csv\nfor r in list(csv.reader(open('" + file +
                                               "', newline='')))[1:3]: print(r[3]); print(r[4])");
  std::vector<std::string> lines;
  std::istringstream in(sites);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  REQUIRE(lines.size() == 4);
  CHECK(lines[1].find("draw_randn") != std::string::npos);
  CHECK(lines[3].find("apply_dropout") != std::string::npos);
  // This file is always compiled with line tables (-g1, tests/CMakeLists.txt), whatever the build's
  // flags, so the call sites are file:line here: no build skips the check.
  REQUIRE_MESSAGE(lines[0].find("random_save_test.cpp:") != std::string::npos, lines[0]);
  CHECK(lines[0].substr(lines[0].rfind(':') + 1) == std::to_string(t::randn_line));
  CHECK(lines[2].substr(lines[2].rfind(':') + 1) == std::to_string(t::dropout_line));
}

TEST_CASE("random_save into a path that cannot be a directory throws, naming the file") {
  tptest::TempDir tmp;
  { std::ofstream(tmp / "file") << "x"; }
  std::string message;
  try {
    tp::random_save(tmp / "file", 0);
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  CHECK(std::regex_match(message,
                         std::regex("torchprobe::random_save: cannot write .*/file/random_rank0_[0-9]{14}\\.csv")));
  CHECK_THROWS_WITH_AS(tp::random_save(tmp.path(), -2),
                       "torchprobe::random_save: rank_id -2 is invalid; it must be >= 0", std::invalid_argument);
}

TEST_CASE(
    "random_save without a rank names its file random_proc{pid}_{timestamp}.csv, with the launcher's rank "
    "random_rank{id}_{timestamp}.csv") {
  tptest::TempDir tmp;
  // The launchers' variables as this process has them, put back at the end.
  const char* names[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "LOCAL_RANK"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* n : names)
    if (const char* v = std::getenv(n)) saved.emplace_back(n, v);
  for (const char* n : names) ::unsetenv(n);
  const std::string unranked = tp::random_save(tmp.path());
  tp::random_save_stop();
  ::setenv("SLURM_PROCID", "7", 1);
  const std::string ranked = tp::random_save(tmp.path());
  tp::random_save_stop();
  ::unsetenv("SLURM_PROCID");
  for (const auto& kv : saved) ::setenv(kv.first.c_str(), kv.second.c_str(), 1);

  CHECK(std::regex_match(unranked, std::regex(".*/random_proc" + std::to_string(::getpid()) + "_[0-9]{14}\\.csv")));
  CHECK(std::regex_match(ranked, std::regex(".*/random_rank7_[0-9]{14}\\.csv")));
  CHECK(tptest::read_text(unranked).rfind("api_name,stack,index,call_site,function,shape,dtype,device\r\n", 0) == 0);
  CHECK(fs::exists(ranked));
}

// `torchprobe api_precision_compare` (run_ut/precision_compare.hpp): msprobe's two output files
// reproduced byte for byte from the details CSVs msprobe compared, and the rules of each standard
// checked on hand-made rows whose verdicts follow from the thresholds of spec B.9.
#include <doctest/doctest.h>

#include "../skip.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <unistd.h>

#include "torchprobe/analysis/run_ut/precision_compare.hpp"

namespace pc = torchprobe::run_ut::precision;

namespace {

const std::string kRunUt = std::string(TORCHPROBE_REFERENCE_DUMPS) + "/run_ut/";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The one file in `dir` whose name starts with `prefix`.
std::string only_file(const std::string& dir, const std::string& prefix) {
  std::string found;
  for (const auto& e : std::filesystem::directory_iterator(kRunUt + dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) found = e.path().string();
  REQUIRE_MESSAGE(!found.empty(), "no " << prefix << "* in " << dir);
  return found;
}

// A details CSV of run_ut with the given rows after msprobe's header (rows in CSV text, CRLF added).
pc::Table details(const std::vector<std::string>& rows) {
  std::string text =
      "\xEF\xBB\xBF"
      "API Name,Bench Dtype,DEVICE Dtype,Shape,余弦相似度,最大绝对误差,双百指标,双千指标,双万指标,"
      "二进制一致错误率,误差均衡性,均方根误差,小值域错误占比,相对误差最大值,相对误差平均值,inf/nan错误率,"
      "相对误差错误率,绝对误差错误率,ULP误差最大值,ULP误差平均值,ULP误差大于阈值占比,Status,Message\r\n";
  for (const auto& r : rows) text += r + "\r\n";
  return pc::table_from_csv(text);
}

// The details row of the compare, split into its cells.
std::vector<std::string> out_row(const pc::Outcome& o, std::size_t k) {
  const auto rows = torchprobe::io::parse_csv(o.details_text);
  REQUIRE(rows.size() > k + 1);
  return rows[k + 1];
}

std::vector<std::string> result_row(const pc::Outcome& o, std::size_t k) {
  const auto rows = torchprobe::io::parse_csv(o.result_text);
  REQUIRE(rows.size() > k + 1);
  return rows[k + 1];
}

// A details row of run_ut: `cells` by column index (4 cosine ... 20 ULP proportion), " " elsewhere.
std::string row(const std::string& name, const std::string& dtype, const std::map<int, std::string>& cells) {
  std::string r = name + ",torch.float32," + dtype + ",\"(8,)\"";
  for (int c = 4; c <= 20; ++c) r += "," + (cells.count(c) ? cells.at(c) : std::string(" "));
  return r + ",pass,msg";
}

// Benchmark metrics (EB, RMSE, small-value error, max and mean relative error) of an fp16 forward row.
std::string bench_row(const std::string& name, const std::string& eb, const std::string& rmse, const std::string& small,
                      const std::string& max_rel, const std::string& mean_rel) {
  return row(name, "torch.float16",
             {{4, "1.0"}, {5, "0.1"}, {10, eb}, {11, rmse}, {12, small}, {13, max_rel}, {14, mean_rel}});
}

}  // namespace

TEST_CASE("api_precision_compare reproduces msprobe's files for the tensor dump against the statistics dump") {
  REQUIRE_MESSAGE(std::filesystem::exists(kRunUt), "no msprobe reference dumps at " << kRunUt);
  const std::string dir = "out_api_precision_compare_tensor_vs_statistics";
  const std::string tmp = std::filesystem::temp_directory_path() / ("tp_apc_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const pc::Outcome o = pc::api_precision_compare(only_file("out_tensor_step0", "accuracy_checking_details_"),
                                                  only_file("out_statistics_step0", "accuracy_checking_details_"),
                                                  tmp + "/result.csv", tmp + "/details.csv");
  CHECK(o.error.empty());
  CHECK(o.warnings.empty());
  CHECK(slurp(tmp + "/result.csv") == slurp(only_file(dir, "api_precision_compare_result_")));
  CHECK(slurp(tmp + "/details.csv") == slurp(only_file(dir, "api_precision_compare_details_")));
  CHECK(
      (std::filesystem::status(tmp + "/result.csv").permissions() & std::filesystem::perms::all) ==
      (std::filesystem::perms::owner_read | std::filesystem::perms::owner_write | std::filesystem::perms::group_read));
  std::filesystem::remove_all(tmp);
}

TEST_CASE("api_precision_compare reproduces msprobe's files for the bf16 case compared with itself") {
  REQUIRE_MESSAGE(std::filesystem::exists(kRunUt), "no msprobe reference dumps at " << kRunUt);
  const std::string dir = "out_api_precision_compare_bf16_self";
  const std::string bf16 = only_file("out_bf16", "accuracy_checking_details_");
  const pc::Outcome o = pc::compare_tables(pc::read_table(bf16), pc::read_table(bf16));
  CHECK(o.error.empty());
  CHECK(o.result_text == slurp(only_file(dir, "api_precision_compare_result_")));
  CHECK(o.details_text == slurp(only_file(dir, "api_precision_compare_details_")));
}

TEST_CASE("a benchmark row fails when a target error is over its limit times the bench's, the error balance aside") {
  // fp16 floor 2^-11 = 0.00048828125. RMSE 0.003 vs 0.001: ratio 3 > 2; max rel 0.05 vs 0.01: 5 <= 10;
  // EB 0.5 vs 0.1: 5 > 2 is reported but does not decide.
  const auto npu = details({bench_row("Torch.tanh.0.forward.output.0", "0.5", "0.003", "0", "0.05", "0.002")});
  const auto gpu = details({bench_row("Torch.tanh.0.forward.output.0", "0.1", "0.001", "0", "0.01", "0.001")});
  const pc::Outcome o = pc::compare_tables(npu, gpu);
  const auto r = out_row(o, 0);
  CHECK(r[pc::rmse_ratio] == "3.00000000000000");
  CHECK(r[pc::rmse_status] == "error");
  CHECK(r[pc::max_rel_ratio] == "5.00000000000000");
  CHECK(r[pc::max_rel_status] == "pass");
  CHECK(r[pc::mean_rel_ratio] == "2.00000000000000");
  CHECK(r[pc::mean_rel_status] == "pass");
  CHECK(r[pc::eb_status] == "error");
  CHECK(r[pc::result] == "error");
  CHECK(r[pc::algorithm] == "标杆比对法");
  CHECK(r[pc::message] == "ERROR: 均方根误差比值超过阈值\n");
  CHECK(result_row(o, 0) == std::vector<std::string>{"Torch.tanh.0", "error", " ", ""});

  // Only the error balance over its limit: pass.
  const auto npu2 = details({bench_row("Torch.tanh.0.forward.output.0", "0.5", "0.001", "0", "0.01", "0.001")});
  CHECK(out_row(pc::compare_tables(npu2, gpu), 0)[pc::result] == "pass");
}

TEST_CASE("an inf metric on one side only is an error, the same inf on both is consistent") {
  const auto gpu = details({bench_row("Torch.exp.0.forward.output.0", "0", "inf", "0", "0.01", "0.001")});
  const auto same =
      pc::compare_tables(details({bench_row("Torch.exp.0.forward.output.0", "0", "inf", "0", "0.01", "0.001")}), gpu);
  CHECK(out_row(same, 0)[pc::rmse_ratio] == "nan");
  CHECK(out_row(same, 0)[pc::rmse_status] == "pass");
  CHECK(out_row(same, 0)[pc::message] == "均方根误差同为同号inf或nan\n");
  const auto differ =
      pc::compare_tables(details({bench_row("Torch.exp.0.forward.output.0", "0", "0.001", "0", "0.01", "0.001")}), gpu);
  CHECK(out_row(differ, 0)[pc::rmse_status] == "error");
  CHECK(out_row(differ, 0)[pc::message] == "均方根误差inf或nan不一致\nERROR: 均方根误差比值超过阈值\n");
}

TEST_CASE("binary, thousandth and ULP rows are judged by their own rules") {
  const auto npu = details({row("Torch.neg.0.forward.output.0", "torch.int64", {{9, "0.125"}}),
                            row("Functional.conv2d.0.forward.output.0", "torch.float32", {{4, "1"}, {7, "0.998"}}),
                            row("Torch.matmul.0.forward.output.0", "torch.float16", {{19, "1.5"}, {20, "0.01"}})});
  const auto gpu = details({row("Torch.neg.0.forward.output.0", "torch.int64", {{9, "0"}}),
                            row("Functional.conv2d.0.forward.output.0", "torch.float32", {{4, "1"}, {7, "0.9995"}}),
                            row("Torch.matmul.0.forward.output.0", "torch.float16", {{19, "1.5"}, {20, "0.004"}})});
  const pc::Outcome o = pc::compare_tables(npu, gpu);
  // The integer output: any mismatch is an error, whatever the bench device did.
  CHECK(out_row(o, 0)[pc::error_rate] == "0.125");
  CHECK(out_row(o, 0)[pc::result] == "error");
  CHECK(out_row(o, 0)[pc::algorithm] == "二进制一致法");
  // conv2d: the target's 双千 0.998 < 0.999.
  CHECK(out_row(o, 1)[pc::thousandth] == "0.998");
  CHECK(out_row(o, 1)[pc::result] == "error");
  CHECK(out_row(o, 1)[pc::message] == "ERROR: 双千指标不达标\n");
  // fp16 matmul: proportion 0.01 >= 0.001 and 0.01 / 0.004 = 2.5 >= 1.
  CHECK(out_row(o, 2)[pc::ulp_prop_ratio] == "2.50000000000000");
  CHECK(out_row(o, 2)[pc::result] == "error");
  CHECK(result_row(o, 2) == std::vector<std::string>{"Torch.matmul.0", "error", " ", ""});
}

TEST_CASE("float64 rows are SKIP with msprobe's message, rows missing on the bench side are left out with a warning") {
  const std::string f64 = row("Torch.exp.0.forward.output.0", "torch.float64", {{10, "0"}, {11, "0"}});
  const auto npu = details({f64, bench_row("Torch.sin.0.forward.output.0", "0", "0", "0", "0", "0")});
  const auto gpu = details({f64});
  const pc::Outcome o = pc::compare_tables(npu, gpu);
  CHECK(out_row(o, 0)[pc::result] == "SKIP");
  CHECK(out_row(o, 0)[pc::message] == "msg");
  CHECK(result_row(o, 0) ==
        std::vector<std::string>{"Torch.exp.0", "SKIP", "SKIP", "This data type does not support benchmark compare."});
  REQUIRE(o.warnings.size() == 1);
  CHECK(o.warnings[0] == "This API : Torch.sin.0.forward.output.0 does not exist in the GPU data.");
}

TEST_CASE("a blank metric makes that row SKIP with msprobe's reason, and a duplicate bench row stops the compare") {
  const auto npu = details({bench_row("Torch.tanh.0.forward.output.0", "0", "0.001", "0", "0.01", "0.001")});
  const auto blank = details({bench_row("Torch.tanh.0.forward.output.0", "0", " ", "0", "0.01", "0.001")});
  const pc::Outcome o = pc::compare_tables(npu, blank);
  CHECK(out_row(o, 0)[pc::result] == "SKIP");
  CHECK(result_row(o, 0) == std::vector<std::string>{"Torch.tanh.0.forward.output.0", "SKIP", "SKIP",
                                                     "ERROR: Input data is an empty string"});
  const auto twice = details({bench_row("Torch.tanh.0.forward.output.0", "0", "0.001", "0", "0.01", "0.001"),
                              bench_row("Torch.tanh.0.forward.output.0", "0", "0.001", "0", "0.01", "0.001")});
  CHECK(pc::compare_tables(npu, twice).error ==
        "This API : Torch.tanh.0.forward.output.0 has multiple records in the GPU data.");
}

TEST_CASE("api_precision_compare names the columns a details CSV lacks") {
  const pc::Table t = pc::table_from_csv("API Name,DEVICE Dtype\r\nTorch.a.0.forward.output.0,torch.float32\r\n");
  try {
    pc::check_columns(t, "npu_csv");
    FAIL("accepted");
  } catch (const pc::PrecisionCompareError& e) {
    CHECK(std::string(e.what()).find("小值域错误占比,均方根误差") != std::string::npos);
    CHECK(std::string(e.what()).find("missing in npu_csv") != std::string::npos);
  }
}

// TorchProbe's own run_ut verdict (run_ut/verdict.hpp, spec C6 and C8), written beside msprobe's
// files: errors counted in device-dtype ULPs at the output's scale, so a small output that is
// wrong is not a pass and a gradient that is truly zero is not an error; an API whose outputs were
// all SKIPped is SKIP with the reason, never pass. msprobe's own statuses stay as msprobe has them.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "torchprobe/analysis/run_ut/runner.hpp"

namespace ru = torchprobe::run_ut;
namespace fs = std::filesystem;

TEST_CASE("run_ut verdict: a small output 1% wrong passes msprobe's max-abs check but is TorchProbe's error") {
  // Values around 1e-6 from inputs of the same size; the float32 "device" result is 1% off.
  const at::Tensor bench = torch::linspace(1e-6, 5e-6, 256, at::kDouble);
  const at::Tensor wrong = (bench * 1.01).to(at::kFloat);
  const ru::Detail w = ru::compare_tensor("tanh", bench, wrong, 5e-6);
  CHECK(w.status == ru::Status::pass);  // msprobe: max abs error 5e-8 < 0.001
  CHECK(w.message.find("Max abs error is less than 0.001") != std::string::npos);
  CHECK(w.verdict.status == "error");
  // 1% of 5e-6 = 5e-8 against float32's spacing near 5e-6 (2^-18 * 2^-23 = 4.5e-13): about 1.1e5 ULPs.
  CHECK(w.verdict.reason.find("ULPs of torch.float32 at the output's scale") != std::string::npos);

  // The same values correctly rounded to float32: at most half a ULP.
  const ru::Detail ok = ru::compare_tensor("tanh", bench, bench.to(at::kFloat), 5e-6);
  CHECK(ok.verdict.status == "pass");
  // 0.1% off: about 1.1e4 ULPs, still an error; 0.005% (~550 ULPs): a Warning; 0.001% (~110): a pass.
  CHECK(ru::compare_tensor("tanh", bench, (bench * 1.001).to(at::kFloat), 5e-6).verdict.status == "error");
  CHECK(ru::compare_tensor("tanh", bench, (bench * 1.00005).to(at::kFloat), 5e-6).verdict.status == "Warning");
  CHECK(ru::compare_tensor("tanh", bench, (bench * 1.00001).to(at::kFloat), 5e-6).verdict.status == "pass");
}

TEST_CASE("run_ut verdict: a gradient whose true value is zero is a pass when both sides are rounding noise") {
  // softmax backward with a gradient of ones: y * (1 - sum(y)) = 0; the float64 benchmark leaves
  // ~1e-17, the float32 device ~1e-8, from inputs of size ~1.
  torch::manual_seed(7);
  const at::Tensor bench = torch::randn({64, 64}, at::kDouble) * 1e-17;
  const at::Tensor device = (torch::randn({64, 64}, at::kDouble) * 1e-8).to(at::kFloat);
  const ru::Detail z = ru::compare_tensor("softmax", bench, device, 1.0);
  CHECK(z.status == ru::Status::error);  // msprobe: cosine of two noises < 0.99
  CHECK(z.verdict.status == "pass");
  CHECK(z.verdict.reason.find("output numerically zero") != std::string::npos);
  // The same output from inputs of size 1e-12 is not noise: it is measured at its own scale.
  CHECK(ru::compare_tensor("softmax", bench, device, 1e-12).verdict.status == "error");
  // inf where the benchmark is finite is an error whatever the scale.
  at::Tensor inf = bench.to(at::kFloat).clone();
  inf[0][0] = std::numeric_limits<float>::infinity();
  CHECK(ru::compare_tensor("softmax", bench, inf, 1.0).verdict.status == "error");
}

TEST_CASE("run_ut verdict: an API whose outputs were all SKIPped is SKIP with the reason, where msprobe says pass") {
  ru::ApiResult r;
  r.name = "Torch.thing.0";
  r.forward_rows = {ru::skip_detail("Bench output is None, skip this test.")};
  r.forward = ru::details::worst(r.forward_rows);
  CHECK(r.forward == ru::Status::pass);  // msprobe: SKIP rows do not count, so nothing is worse than pass
  const ru::Verdict f = ru::forward_verdict(r);
  CHECK(f.status == "SKIP");
  CHECK(f.reason == "Bench output is None, skip this test.");
  CHECK(ru::verdict_row(r) == "Torch.thing.0,pass, ,SKIP, ,\"forward: Bench output is None, skip this test.\"\r\n");
  // One compared output among SKIPped ones decides.
  r.forward_rows.push_back(ru::compare_tensor("tanh", torch::ones({4}, at::kDouble), torch::ones({4})));
  CHECK(ru::forward_verdict(r).status == "pass");
  // No rows at all (the API raised): SKIP with the API's reason.
  const ru::ApiResult s = ru::skipped("Torch.bad.0", "API bad not support for run ut. SKIP.");
  CHECK(ru::forward_verdict(s).status == "SKIP");
  CHECK(ru::backward_verdict(s).reason == "API bad not support for run ut. SKIP.");
}

TEST_CASE("run_ut on msprobe's bf16 dump writes TorchProbe's verdicts beside msprobe's unchanged files") {
  const std::string dump = std::string(TORCHPROBE_REFERENCE_DUMPS) + "/run_ut/dump_bf16/step0/rank/dump.json";
  REQUIRE_MESSAGE(fs::exists(dump), "no msprobe run_ut reference dump " << dump);
  tptest::TempDir tmp;
  ru::RunOptions o;
  o.api_info = dump;
  o.out_dir = tmp.path();
  const auto out = ru::run(o);
  const std::string text = tptest::read_text(out.verdicts_csv);
  CHECK(text.rfind("\xEF\xBB\xBF" + std::string(ru::kVerdictsHeader) + "\r\n", 0) == 0);
  const auto row_of = [&](const std::string& name) {
    const auto at = text.find("\r\n" + name + ",");
    return at == std::string::npos ? std::string() : text.substr(at + 2, text.find("\r\n", at + 2) - at - 2);
  };
  // softmax backward: msprobe's false error (the true gradient is 0), TorchProbe's pass.
  CHECK(row_of("Functional.softmax.0").rfind("Functional.softmax.0,pass,error,pass,pass,", 0) == 0);
  // bf16 matmul within bf16's rounding: TorchProbe's pass, beside msprobe's verdict as the result CSV
  // has it (Warning where the bf16 matmul is oneDNN's AVX-512 kernel, as on the reference's machine;
  // error with libtorch 1.13's own kernel on a CPU without AVX-512).
  const std::string result = tptest::read_text(out.result_csv);
  const auto at = result.find("\r\nTorch.matmul.0,");
  REQUIRE(at != std::string::npos);
  const std::string theirs = result.substr(at + 2, result.find("\r\n", at + 2) - at - 2);  // API,forward,backward
  CHECK(theirs.rfind("Torch.matmul.0,pass,", 0) != 0);
  CHECK(row_of("Torch.matmul.0").rfind(theirs + ",pass,pass,", 0) == 0);
  CHECK(out.summary.tp_backward.at("pass") >= 1);
  CHECK(out.summary.disagreements.size() >= 2);
}

// Task::FreeBenchmark: each call is re-run with perturbed inputs and the outputs that move more than
// their dtype allows are listed in free_benchmark.csv (msprobe's format, read back with Python's csv
// module and compared with msprobe's own rows), with a per-API summary. Check mode changes nothing;
// fix mode continues with the improved values.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <cstring>
#include <filesystem>
#include <optional>

#include "test_support.hpp"

namespace tp = torchprobe;
namespace fb = torchprobe::free_benchmark;
using Json = nlohmann::ordered_json;

namespace {

using FreeBenchmark = tp::Debugger<tp::Level::L1, tp::Task::FreeBenchmark>;

std::string rank_dir(const std::string& dump, int step = 0) {
  return dump + "/step" + std::to_string(step) + "/proc" + std::to_string(::getpid());
}

// Rows of a CSV file as Python's csv module reads them.
Json csv_rows(const std::string& path) {
  int rc = 0;
  const std::string out = tptest::run_python(
      "import csv, json\nprint(json.dumps(list(csv.reader(open('" + path + "', newline='')))))\n", &rc);
  REQUIRE_MESSAGE(rc == 0, out);
  return Json::parse(out);
}

// The rows of one of msprobe's CSVs under tests/data/reference-dumps/ (`relative`): a missing file
// fails the case (the reference dumps are part of the repository).
std::optional<Json> reference_rows(const std::string& relative) {
  const std::string path = std::string(TORCHPROBE_REFERENCE_DUMPS) + "/" + relative;
  if (std::filesystem::exists(path)) return csv_rows(path);
  FAIL("no msprobe reference dump " << path);
  return std::nullopt;
}

// One perturbation of one tensor, through the task's own entry point: {perturbed?, result}.
std::pair<bool, at::Tensor> perturbed(tp::PertMode mode, const at::Tensor& t) {
  std::vector<c10::IValue> stack{t};
  const bool done = fb::perturb(mode, stack, fb::first_valid_input(stack, [](std::size_t) { return true; }));
  return {done, stack[0].toTensor()};
}

// The reference of add_noise: the noise eps in the tensor's dtype, added in double, rounded once.
at::Tensor add_noise_reference(const at::Tensor& x, double eps) {
  const double noise = torch::full({}, eps, x.scalar_type()).item<double>();
  const at::Tensor d = x.to(torch::kDouble);
  return torch::where(d.abs() > std::sqrt(eps), d + noise, d).to(x.scalar_type());
}

// The last mantissa bit flipped by hand, element by element, where |x| > the smallest normal.
template <class Bits>
at::Tensor bit_flip_reference(const at::Tensor& x, double smallest_normal) {
  at::Tensor out = x.clone().contiguous();
  auto* p = static_cast<unsigned char*>(out.data_ptr());
  const at::Tensor d = x.to(torch::kDouble);
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (!(std::fabs(d[i].item<double>()) > smallest_normal)) continue;
    Bits b;
    std::memcpy(&b, p + i * sizeof(Bits), sizeof(Bits));
    b ^= 1;
    std::memcpy(p + i * sizeof(Bits), &b, sizeof(Bits));
  }
  return out;
}

}  // namespace

TEST_CASE("add_noise adds eps of the dtype to values above sqrt(eps), and skips tensors below eps") {
  const std::vector<std::pair<at::ScalarType, double>> dtypes = {
      {torch::kHalf, 1e-6}, {torch::kBFloat16, 1e-4}, {torch::kFloat, 1e-8}, {torch::kDouble, 1e-16}};
  for (const auto& [dtype, eps] : dtypes) {
    INFO(std::string(c10::toString(dtype)));
    // Around sqrt(eps) (untouched below it), and values where eps is visible in this dtype.
    const at::Tensor x =
        torch::tensor({0.5 * std::sqrt(eps), -2 * std::sqrt(eps), 4 * std::sqrt(eps), -1.0, 0.0}, torch::kDouble)
            .to(dtype);
    const auto [done, y] = perturbed(tp::PertMode::AddNoise, x);
    CHECK(done);
    CHECK((y.scalar_type() == dtype));
    CHECK(torch::equal(y, add_noise_reference(x, eps)));
    CHECK(torch::equal(y[0], x[0]));  // |x| <= sqrt(eps): unchanged
    CHECK_FALSE(perturbed(tp::PertMode::AddNoise, torch::full({3}, eps / 4, dtype)).first);  // max|x| < eps
    CHECK_FALSE(perturbed(tp::PertMode::AddNoise, torch::empty({0}, dtype)).first);
  }
  CHECK_FALSE(perturbed(tp::PertMode::AddNoise, torch::arange(5)).first);  // integers are not perturbed
}

TEST_CASE("bit_noise flips the last mantissa bit above the smallest normal, in every float dtype") {
  const at::Tensor base = torch::tensor({1.0, -3.5, 1e-30, 0.0, 3e4}, torch::kDouble);
  CHECK(torch::equal(perturbed(tp::PertMode::BitNoise, base.to(torch::kHalf)).second,
                     bit_flip_reference<uint16_t>(base.to(torch::kHalf), 6.103515625e-05)));
  CHECK(torch::equal(perturbed(tp::PertMode::BitNoise, base.to(torch::kBFloat16)).second,
                     bit_flip_reference<uint16_t>(base.to(torch::kBFloat16), 1.1754943508222875e-38)));
  CHECK(torch::equal(perturbed(tp::PertMode::BitNoise, base.to(torch::kFloat)).second,
                     bit_flip_reference<uint32_t>(base.to(torch::kFloat), 1.1754943508222875e-38)));
  CHECK(torch::equal(perturbed(tp::PertMode::BitNoise, base).second,
                     bit_flip_reference<uint64_t>(base, 2.2250738585072014e-308)));
  // 1.0 in fp32 becomes the next float up.
  CHECK(perturbed(tp::PertMode::BitNoise, base.to(torch::kFloat)).second[0].item<float>() ==
        std::nextafter(1.0f, 2.0f));
  CHECK_FALSE(perturbed(tp::PertMode::BitNoise, torch::full({2}, 1e-9, torch::kFloat)).first);  // below eps
}

TEST_CASE("change_value swaps the first and last element (rows' first/last for 2-D and up), within limits") {
  const auto [done1, y1] = perturbed(tp::PertMode::ChangeValue, torch::tensor({1.f, 2.f, 3.f, 4.f}));
  CHECK(done1);
  CHECK(torch::equal(y1, torch::tensor({4.f, 2.f, 3.f, 1.f})));
  const at::Tensor m = torch::arange(6, torch::kFloat).reshape({3, 2});
  CHECK(torch::equal(perturbed(tp::PertMode::ChangeValue, m).second,
                     torch::tensor({5.f, 1.f, 2.f, 3.f, 4.f, 0.f}).reshape({3, 2})));
  const at::Tensor c = torch::arange(8, torch::kDouble).reshape({2, 2, 2});  // t[0][0] and t[1][1] are rows
  CHECK(torch::equal(perturbed(tp::PertMode::ChangeValue, c).second,
                     torch::tensor({6., 7., 2., 3., 4., 5., 0., 1.}, torch::kDouble).reshape({2, 2, 2})));
  CHECK_FALSE(perturbed(tp::PertMode::ChangeValue, torch::ones({1})).first);
  CHECK_FALSE(perturbed(tp::PertMode::ChangeValue, torch::ones({1, 1})).first);
  CHECK_FALSE(perturbed(tp::PertMode::ChangeValue, torch::ones({3, 0})).first);
  CHECK(perturbed(tp::PertMode::ChangeValue, torch::ones({1, 2})).first);
}

TEST_CASE("only the first eligible tensor of the first valid argument is perturbed; improve_precision raises all") {
  // A bool tensor is not a valid argument; in the list, the empty tensor is skipped and the next one taken.
  std::vector<c10::IValue> stack{
      torch::ones({2}, torch::kBool),
      c10::List<at::Tensor>({torch::empty({0}), torch::full({2}, 1e-3), torch::full({2}, 1e-3)}), torch::ones({2})};
  const auto valid = fb::first_valid_input(stack, [](std::size_t) { return true; });
  CHECK(valid == 1);
  const at::Tensor untouched = stack[2].toTensor();
  REQUIRE(fb::perturb(tp::PertMode::AddNoise, stack, valid));
  const auto list = stack[1].toTensorList().vec();
  CHECK(torch::equal(list[1], torch::full({2}, 1e-3) + torch::full({2}, 1e-8)));
  CHECK_FALSE(torch::equal(list[1], torch::full({2}, 1e-3)));
  CHECK(torch::equal(list[2], torch::full({2}, 1e-3)));
  CHECK(stack[2].toTensor().is_same(untouched));

  std::vector<c10::IValue> mixed{torch::ones({2}, torch::kHalf), torch::ones({2}, torch::kBFloat16), torch::ones({2})};
  const at::Tensor fp32 = mixed[2].toTensor();
  REQUIRE(fb::perturb(tp::PertMode::ImprovePrecision, mixed, 0));
  CHECK((mixed[0].toTensor().scalar_type() == torch::kFloat));
  CHECK((mixed[1].toTensor().scalar_type() == torch::kFloat));
  CHECK(mixed[2].toTensor().is_same(fp32));
  std::vector<c10::IValue> full_precision{torch::ones({2}), torch::ones({2}, torch::kDouble)};
  CHECK_FALSE(fb::perturb(tp::PertMode::ImprovePrecision, full_precision, 0));  // nothing to raise: no re-run
}

TEST_CASE("the ratio of an fp16 overflow against its fp32 re-run is fp32's max; opposite signs are symbol_flipping") {
  fb::Comparison c = fb::compare_ratio(torch::full({4}, INFINITY, torch::kHalf), torch::full({4}, 120000.f),
                                       tp::PertMode::ImprovePrecision);
  std::vector<fb::Comparison*> pending{&c};
  fb::resolve(pending);
  CHECK_FALSE(c.consistent);
  CHECK(*c.ratio == static_cast<double>(std::numeric_limits<float>::max()));
  // bf16: ratio 64/63 is 1/min(r) with r = 0.984375; thresholds by the original dtype (bf16 1.004).
  fb::Comparison b = fb::compare_ratio(torch::full({2}, 63.f).to(torch::kBFloat16),
                                       torch::full({2}, 64.f).to(torch::kBFloat16), tp::PertMode::AddNoise);
  fb::Comparison ok = fb::compare_ratio(torch::full({2}, 1.0f), torch::full({2}, 1.0001f), tp::PertMode::AddNoise);
  fb::Comparison flip =
      fb::compare_ratio(torch::tensor({1.f, -1.f}), torch::tensor({1.f, 1.f}), tp::PertMode::AddNoise);
  fb::Comparison ints = fb::compare_ratio(torch::arange(3), torch::arange(3) + 1, tp::PertMode::AddNoise);
  std::vector<fb::Comparison*> all{&b, &ok, &flip, &ints};
  fb::resolve(all);
  CHECK(*b.ratio == 64.0 / 63.0);
  CHECK(tp::io::python_float_repr(*b.ratio - 1) == "0.015873015873015817");  // msprobe's row
  CHECK_FALSE(b.consistent);
  CHECK(ok.consistent);  // 1.0001 is within fp32's 1.0002
  CHECK(flip.flipped);
  CHECK_FALSE(ints.consistent);
}

namespace {

// The planted program: an fp16 sum beyond fp16's range (fp32's is not), the fp16 mul of msprobe's
// reference program (60000 * 2), an exact fp16 neg and a benign fp32 op.
at::Tensor planted_program() {
  const at::Tensor s = torch::full({1000}, 100.0, torch::kHalf).sum();
  const at::Tensor m = torch::full({4}, 60000.0, torch::kHalf) * 2;
  const at::Tensor n = torch::neg(torch::full({4}, 3.0, torch::kHalf));
  const at::Tensor r = torch::relu(torch::linspace(-1, 1, 8));
  return s.to(torch::kFloat) + m.to(torch::kFloat).sum() + n.to(torch::kFloat).sum() + r.sum();
}

}  // namespace

TEST_CASE("improve_precision lists the planted fp16 sum and mul, byte-compatible with msprobe's rows") {
  tptest::TempDir tmp;
  {
    FreeBenchmark dbg(tp::Options().dump_path(tmp.path()));
    dbg.start();
    planted_program();
    dbg.stop();
    dbg.step();
  }
  const std::string dir = rank_dir(tmp.path());
  const Json rows = csv_rows(dir + "/free_benchmark.csv");
  REQUIRE(rows.size() == 3);
  const Json header = {"rank", "pert_mode", "stage", "step", "api_name", "max_rel", "dtype", "shape", "output_index"};
  const Json sum_row = {"0",
                        "improve_precision",
                        "forward",
                        "0",
                        "Aten.sum.0.forward",
                        "3.4028234663852886e+38",
                        "torch.float16",
                        "torch.Size([])",
                        ""};
  CHECK(rows[0] == header);
  CHECK(rows[1] == sum_row);
  // msprobe's row for the same mul (reference-dumps/classic/free_benchmark), but for the API's name.
  CHECK(rows[2][4] == "Aten.mul.0.forward");  // msprobe: Torch.mul.0.forward
  if (const std::optional<Json> theirs = reference_rows("classic/free_benchmark/step0/rank/free_benchmark.csv")) {
    REQUIRE(theirs->size() == 2);
    CHECK((*theirs)[0] == rows[0]);
    for (std::size_t f = 0; f < 9; ++f) {
      CAPTURE(f);
      if (f != 4) CHECK(rows[2][f] == (*theirs)[1][f]);
    }
  }
  // The bytes as well: \r\n line ends, nothing quoted that Python's csv would not quote.
  CHECK(tptest::read_text(dir + "/free_benchmark.csv").find("torch.Size([4]),\r\n") != std::string::npos);
  CHECK(tptest::read_json(dir + "/dump.json")["data"] == Json::object());

  const Json summary = tptest::read_json(dir + "/free_benchmark_summary.json");
  // sum, mul, neg and the three fp16 -> fp32 conversions; the fp32 ops have nothing to raise.
  CHECK(summary["checked_calls"] == 6);
  CHECK(summary["flagged_calls"] == 2);
  REQUIRE(summary["apis"].size() == 4);
  for (int i = 0; i < 2; ++i) {  // worst first
    CHECK(summary["apis"][i]["flagged"] == 1);
    CHECK(summary["apis"][i]["worst"] == static_cast<double>(std::numeric_limits<float>::max()));
  }
  CHECK(summary["apis"][0]["worst_call"] == "Aten.mul.0.forward");
  CHECK(summary["apis"][1]["worst_call"] == "Aten.sum.0.forward");
  for (int i = 2; i < 4; ++i) {
    CHECK(summary["apis"][i]["flagged"] == 0);
    CHECK(summary["apis"][i]["worst"] == 1.0);
  }
  CHECK(summary["apis"][2]["api"] == "Aten.neg");
  CHECK(summary["apis"][3]["api"] == "Aten.to");
  CHECK(summary["apis"][3]["checked"] == 3);
}

TEST_CASE("add_noise on msprobe's bf16 matmul program writes a row of the same form as msprobe's") {
  tptest::TempDir tmp;
  torch::manual_seed(1234);
  {
    FreeBenchmark dbg(tp::Options().dump_path(tmp.path()).set("pert_mode", "add_noise"));
    dbg.start();
    const at::Tensor a = torch::randn({64, 64}).to(torch::kBFloat16), b = torch::randn({64, 64}).to(torch::kBFloat16);
    torch::add(torch::matmul(a, b), 1);
    dbg.stop();
    dbg.step();
  }
  const Json rows = csv_rows(rank_dir(tmp.path()) + "/free_benchmark.csv");
  Json mm;
  for (const Json& r : rows)
    if (r[4] == "Aten.mm.0.forward" || r[4] == "Aten.matmul.0.forward") mm = r;
  REQUIRE_MESSAGE(mm.is_array(), rows.dump());
  MESSAGE("add_noise bf16 matmul row: " << mm.dump());
  if (const std::optional<Json> theirs =
          reference_rows("classic/free_benchmark_add_noise/step0/rank/free_benchmark.csv"))
    for (std::size_t f : {0, 1, 2, 3, 6, 7, 8}) CHECK(mm[f] == (*theirs)[1][f]);
  CHECK(mm[1] == "add_noise");
  CHECK(mm[6] == "torch.bfloat16");
  CHECK(mm[7] == "torch.Size([64, 64])");
  // The data differ (msprobe's seed is not known): a bf16 rounding step, as msprobe's 1/63.
  const double max_rel = std::stod(mm[5].get<std::string>());
  CHECK(max_rel > 0.004);
  CHECK(max_rel < 1.0);
}

namespace {

// A step of a small mixed-precision model with an in-place and an out= op: loss, and gradients.
std::vector<at::Tensor> training_step(torch::nn::Linear& fc) {
  fc->zero_grad();
  torch::manual_seed(7);
  const at::Tensor x = torch::randn({4, 8});
  at::Tensor h = fc(x);
  h.mul_(1.5);
  at::Tensor half = h.to(torch::kHalf) * 3;
  const at::Tensor t = torch::tanh(half.to(torch::kFloat));
  at::Tensor out = torch::empty({4, 2});
  torch::add_out(out, h.detach(), t.detach());  // out= does not take tensors that require grad
  const at::Tensor loss = (h * h).mean() + t.mean();
  loss.backward();
  return {loss.detach().clone(), out.detach().clone(), fc->weight.grad().clone(), fc->bias.grad().clone()};
}

}  // namespace

TEST_CASE("check mode leaves every output and gradient bit-identical, for each pert_mode") {
  torch::manual_seed(3);
  torch::nn::Linear fc(8, 2);
  const std::vector<at::Tensor> plain = training_step(fc);
  for (const char* mode : {"improve_precision", "add_noise", "bit_noise", "change_value", "no_change", "to_cpu"}) {
    INFO(mode);
    tptest::TempDir tmp;
    tp::Options o = tp::Options().dump_path(tmp.path()).set("pert_mode", mode);
    if (std::string(mode) == "to_cpu") o.set("fuzz_device", "cpu");
    FreeBenchmark dbg(o);
    dbg.start();
    const std::vector<at::Tensor> probed = training_step(fc);
    dbg.stop();
    dbg.step();
    dbg.wait_written();
    for (std::size_t i = 0; i < plain.size(); ++i) CHECK(torch::equal(plain[i], probed[i]));
    const Json summary = tptest::read_json(rank_dir(tmp.path()) + "/free_benchmark_summary.json");
    CHECK(summary["checked_calls"].get<int>() > 0);
    CHECK_MESSAGE(!std::filesystem::exists(rank_dir(tmp.path()) + "/dump_error_info.log"),
                  tptest::read_text(rank_dir(tmp.path()) + "/dump_error_info.log"));
  }
}

TEST_CASE("fix replaces an overflowing fp16 mse_loss by the fp32 result cast back: the loss becomes finite") {
  // Half the squared errors (300^2 = 90000) overflow fp16 before the mean, which (45000) would not:
  // inf in fp16 with libtorch 1.13 and 2.6 alike (a plain fp16 mean accumulates in fp32 in 2.x).
  const at::Tensor x = at::cat({torch::full({50}, 300.0, torch::kHalf), torch::zeros({50}, torch::kHalf)});
  const at::Tensor y = torch::zeros({100}, torch::kHalf);
  auto loss_of = [&] { return at::mse_loss(x, y).to(torch::kFloat) * 2; };
  CHECK(std::isinf(loss_of().item<float>()));
  tptest::TempDir tmp;
  FreeBenchmark dbg(tp::Options().dump_path(tmp.path()).set("handler_type", "fix"));
  dbg.start();
  const float fixed = loss_of().item<float>();
  dbg.stop();
  dbg.step();
  dbg.wait_written();  // the step is written in the background
  CHECK(fixed == 2 * at::scalar_tensor(45000.0).to(torch::kHalf).item<float>());
  // The comparison is still reported.
  const Json rows = csv_rows(rank_dir(tmp.path()) + "/free_benchmark.csv");
  REQUIRE(rows.size() == 2);
  CHECK(rows[1][4] == "Aten.mse_loss.0.forward");
}

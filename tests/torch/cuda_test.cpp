// CUDA tensors: device statistics, overflow flags, tensor files and checksums, each against an
// independent reference (ATen float64 on the CPU copy, the same program run on the CPU, python's
// torch.load and zlib). Without a GPU every test prints "SKIPPED: no CUDA device" and returns.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

const torch::Device kCuda(torch::kCUDA, 0);

std::string rank_dir(const std::string& dump) { return dump + "/step0/proc" + std::to_string(::getpid()); }

std::vector<std::string> keys_of(const Json& object) {
  std::vector<std::string> keys;
  for (auto it = object.begin(); it != object.end(); ++it) keys.push_back(it.key());
  return keys;
}

std::vector<std::string> neg_entries(std::size_t n) {
  std::vector<std::string> names;
  for (std::size_t k = 0; k < n; ++k) names.push_back("Aten.neg." + std::to_string(k) + ".forward");
  return names;
}

bool same_or_both_nan(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// A statistic of the dump: a number, or NaN where the JSON holds none.
double number(const Json& v) { return v.is_number() ? v.get<double>() : kNaN; }

// An item's statistics against ATen on a float64 copy of the CPU tensor: Max/Min exact, Mean and
// Norm within 1e-9 (both are float64 sums, in different orders). Not for 0-d tensors, whose four
// statistics are all the value.
void check_against_float64(const Json& item, const at::Tensor& cpu) {
  REQUIRE(cpu.dim() > 0);
  const at::Tensor d = cpu.to(at::kDouble);
  const double max = d.max().item<double>(), min = d.min().item<double>();
  const double mean = d.mean().item<double>(), norm = d.norm().item<double>();
  CHECK(same_or_both_nan(number(item["Max"]), max));
  CHECK(same_or_both_nan(number(item["Min"]), min));
  for (const auto& [key, want] : {std::pair<const char*, double>{"Mean", mean}, {"Norm", norm}}) {
    CAPTURE(key);
    const double got = number(item[key]);
    if (std::isnan(want) || std::isinf(want))
      CHECK(same_or_both_nan(got, want));
    else
      CHECK(std::abs(got - want) <= 1e-9 * std::max(1.0, std::abs(want)));
  }
}

// float32, bfloat16 and float16 samples on the CPU: randn * 50, with a NaN, with +inf, with -inf,
// with both infinities, a strided view, and a 0-d tensor.
std::vector<at::Tensor> float_samples() {
  torch::manual_seed(21);
  std::vector<at::Tensor> out;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const at::Tensor base = (torch::randn({1000}, at::kDouble) * 50).to(dtype);
    at::Tensor nan = base.clone(), pos = base.clone(), neg = base.clone(), both = base.clone();
    nan[500] = kNaN;
    pos[0] = kInf;
    neg[999] = -kInf;
    both[3] = kInf;
    both[4] = -kInf;
    const at::Tensor strided = (torch::randn({33, 65}, at::kDouble) * 3).to(dtype).t().slice(0, 1, 60, 2);
    out.insert(out.end(), {base, nan, pos, neg, both, strided, torch::tensor(-2.5, dtype)});
  }
  return out;
}

// The overflow program, on `device`: an fp16 multiply that overflows (80000 > 65504: the origin), an
// in-place add on its inf result, a finite neg (not written), a sqrt of -1 (NaN).
void overflow_program(const torch::Device& device) {
  const at::Tensor a = torch::full({2, 4}, 8.0, at::kHalf).to(device);
  const at::Tensor m = torch::full({3}, -1.0).to(device);
  at::Tensor b = a.mul(10000);
  b.add_(1);
  a.neg();
  m.sqrt();
}

using tptest::read_python_json;

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  if (!fs::exists(dir)) return names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("statistics of CUDA fp32, bf16 and fp16 tensors, with NaN and inf, equal ATen float64 on their CPU copies" *
          TP_NEEDS("cuda")) {
  if (!torch::cuda::is_available()) TP_SKIP("no CUDA device");
  const std::vector<at::Tensor> samples = float_samples();
  std::vector<at::Tensor> on_gpu;
  for (const at::Tensor& s : samples) on_gpu.push_back(s.to(kCuda));
  tp::Debugger<tp::Level::L1, tp::Task::Statistics, tp::MemorySink> dbg(
      tp::Options().dump_path("/tmp/torchprobe-memory-sink").extra_info(false));
  dbg.start();
  std::vector<at::Tensor> outputs;
  for (const at::Tensor& g : on_gpu) outputs.push_back(g.neg());
  dbg.stop();
  const Json data = dbg.sink().step(0).dump["data"];
  REQUIRE(keys_of(data) == neg_entries(samples.size()));  // the probe's own reductions are not recorded
  for (std::size_t k = 0; k < samples.size(); ++k) {
    CAPTURE(k);
    const Json& entry = data["Aten.neg." + std::to_string(k) + ".forward"];
    const Json& in = entry["input_args"][0];
    const at::ScalarType dtype = samples[k].scalar_type();
    CHECK(in["dtype"] == (dtype == at::kFloat      ? "torch.float32"
                          : dtype == at::kBFloat16 ? "torch.bfloat16"
                                                   : "torch.float16"));
    CHECK(in["shape"] == Json(samples[k].sizes().vec()));
    if (samples[k].dim() == 0) {  // the value in all four, Norm keeping the sign, as on the CPU
      for (const char* key : {"Max", "Min", "Mean", "Norm"}) {
        CHECK(in[key] == -2.5);
        CHECK(entry["output"][0][key] == 2.5);
      }
      continue;
    }
    check_against_float64(in, samples[k]);
    check_against_float64(entry["output"][0], outputs[k].cpu());
  }
}

TEST_CASE("overflow_check writes the same entries, flags and files for CUDA tensors as for CPU tensors" *
          TP_NEEDS("cuda")) {
  if (!torch::cuda::is_available()) TP_SKIP("no CUDA device");
  tptest::TempDir tmp;
  for (const char* where : {"cpu", "cuda"}) {
    tp::Debugger<tp::Level::L1, tp::Task::OverflowCheck> dbg(tp::Options().dump_path(tmp / where).overflow_nums(-1));
    dbg.start();
    overflow_program(std::string(where) == "cpu" ? torch::Device(torch::kCPU) : kCuda);
    dbg.stop();
  }
  const std::string cpu = rank_dir(tmp / "cpu"), cuda = rank_dir(tmp / "cuda");
  const Json want = read_python_json(cpu + "/dump.json")["data"], got = read_python_json(cuda + "/dump.json")["data"];
  CHECK(keys_of(want) == std::vector<std::string>{"Aten.mul.0.forward", "Aten.add_.0.forward", "Aten.sqrt.0.forward"});
  REQUIRE(keys_of(got) == keys_of(want));
  for (const std::string& name : keys_of(want)) {
    for (const char* side : {"input_args", "output"}) {
      CAPTURE(name);
      CAPTURE(side);
      REQUIRE(got[name][side].size() == want[name][side].size());
      for (std::size_t i = 0; i < want[name][side].size(); ++i) {
        const Json &w = want[name][side][i], &g = got[name][side][i];
        for (const char* key : {"type", "dtype", "shape", "Max", "Min", "data_name", "value"})
          if (w.contains(key)) CHECK(g[key] == w[key]);
      }
    }
  }
  CHECK(got["Aten.mul.0.forward"]["output"][0]["Max"] == "Infinity");
  CHECK(got["Aten.sqrt.0.forward"]["output"][0]["Max"] == "NaN");

  const Json summary_cpu = tptest::read_json(cpu + "/overflow_summary.json");
  const Json summary_cuda = tptest::read_json(cuda + "/overflow_summary.json");
  CHECK(summary_cuda["origin"] == "Aten.mul.0.forward");
  CHECK(summary_cuda["calls"] == summary_cpu["calls"]);
  CHECK(summary_cuda["overflowing_calls"] == 3);

  // The saved tensors: the same files, equal values (NaN where NaN), read by python as CPU tensors.
  REQUIRE(files_in(cuda + "/dump_tensor_data") == files_in(cpu + "/dump_tensor_data"));
  CHECK(files_in(cuda + "/dump_tensor_data").size() == 6);
  int rc = 0;
  const std::string out = tptest::run_python(
      "import os, torch\n"
      "a, b = '" +
          cpu + "/dump_tensor_data', '" + cuda +
          "/dump_tensor_data'\n"
          "for f in sorted(os.listdir(a)):\n"
          "    x, y = torch.load(os.path.join(a, f)), torch.load(os.path.join(b, f))\n"
          "    same = y.device.type == 'cpu' and x.dtype == y.dtype and torch.equal(x.isnan(), y.isnan()) \\\n"
          "        and torch.equal(x.nan_to_num(), y.nan_to_num())\n"
          "    print(f, same)\n",
      &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(
      out ==
      "Aten.add_.0.forward.input.0.pt True\nAten.add_.0.forward.output.0.pt True\nAten.mul.0.forward.input.0.pt True\n"
      "Aten.mul.0.forward.output.0.pt True\nAten.sqrt.0.forward.input.0.pt True\nAten.sqrt.0.forward.output.0.pt "
      "True\n");
  CHECK_FALSE(fs::exists(cuda + "/dump_error_info.log"));
}

TEST_CASE("tensor task: .pt files of CUDA tensors, contiguous and strided, load in python as the equal CPU tensors" *
          TP_NEEDS("cuda")) {
  if (!torch::cuda::is_available()) TP_SKIP("no CUDA device");
  tptest::TempDir tmp;
  const std::vector<at::ScalarType> dtypes = {at::kFloat, at::kBFloat16, at::kHalf};
  std::vector<at::Tensor> on_gpu;  // per dtype: a contiguous 3x4 and its transpose
  for (at::ScalarType dtype : dtypes) {
    const at::Tensor x = (torch::arange(12, at::kFloat) * 0.25 - 1.5).reshape({3, 4}).to(dtype).to(kCuda);
    on_gpu.insert(on_gpu.end(), {x, x.t()});
  }
  {
    tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp / "d"));
    dbg.start();
    for (const at::Tensor& g : on_gpu) g.neg();
    dbg.stop();
  }
  const std::string rank = rank_dir(tmp / "d");
  const Json data = tptest::read_json(rank + "/dump.json")["data"];
  REQUIRE(keys_of(data) == neg_entries(on_gpu.size()));
  CHECK(data["Aten.neg.1.forward"]["input_args"][0]["data_name"] == "Aten.neg.1.forward.input.0.pt");
  // python builds the expected tensors itself: the arange on the CPU, the dtype, the transpose.
  int rc = 0;
  const std::string out = tptest::run_python(
      "import torch\n"
      "d = '" +
          rank +
          "/dump_tensor_data/'\n"
          "k = 0\n"
          "for dtype in (torch.float32, torch.bfloat16, torch.float16):\n"
          "    x = (torch.arange(12, dtype=torch.float32) * 0.25 - 1.5).reshape(3, 4).to(dtype)\n"
          "    for want in (x, x.t()):\n"
          "        a = torch.load(d + 'Aten.neg.%d.forward.input.0.pt' % k)\n"
          "        b = torch.load(d + 'Aten.neg.%d.forward.output.0.pt' % k)\n"
          "        ok = all(t.device.type == 'cpu' and t.dtype == dtype and t.is_contiguous() for t in (a, b))\n"
          "        print(k, ok and torch.equal(a, want) and torch.equal(b, -want))\n"
          "        k += 1\n",
      &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out == "0 True\n1 True\n2 True\n3 True\n4 True\n5 True\n");
  CHECK_FALSE(fs::exists(rank + "/dump_error_info.log"));
}

TEST_CASE("summary_mode md5 of a CUDA tensor is zlib.crc32 of its CPU bytes" * TP_NEEDS("cuda")) {
  if (!torch::cuda::is_available()) TP_SKIP("no CUDA device");
  torch::manual_seed(22);
  const std::vector<at::Tensor> samples = {torch::randn({100}),
                                           torch::randn({7, 9}).to(at::kBFloat16),
                                           torch::randn({64}).to(at::kHalf),
                                           torch::arange(50, at::kLong),
                                           torch::randn({10, 12}).t(),
                                           torch::tensor(3.25)};
  std::vector<at::Tensor> on_gpu;
  for (const at::Tensor& s : samples) on_gpu.push_back(s.to(kCuda));
  tp::Debugger<tp::Level::L1, tp::Task::Statistics, tp::MemorySink> dbg(
      tp::Options().dump_path("/tmp/torchprobe-memory-sink").extra_info(false).summary_mode("md5"));
  dbg.start();
  for (const at::Tensor& g : on_gpu) g.neg();
  dbg.stop();
  const Json data = dbg.sink().step(0).dump["data"];
  REQUIRE(keys_of(data) == neg_entries(samples.size()));

  // python's zlib over the bytes of each CPU tensor, written to a file here.
  tptest::TempDir tmp;
  std::string code = "import zlib\n";
  for (std::size_t k = 0; k < samples.size(); ++k) {
    const at::Tensor c = samples[k].contiguous();
    const std::string path = tmp / (std::to_string(k) + ".bin");
    std::ofstream(path, std::ios::binary).write(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
    code += "print('%08x' % zlib.crc32(open('" + path + "', 'rb').read()))\n";
  }
  int rc = 0;
  std::istringstream lines(tptest::run_python(code, &rc));
  REQUIRE(rc == 0);
  for (std::size_t k = 0; k < samples.size(); ++k) {
    CAPTURE(k);
    std::string want;
    std::getline(lines, want);
    CHECK(data["Aten.neg." + std::to_string(k) + ".forward"]["input_args"][0]["md5"] == want);
  }
}

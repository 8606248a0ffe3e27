// Real models: a residual CNN (conv, batch norm, relu, max pool, residual blocks with a downsample,
// adaptive avg pool, dropout, linear; forward -> _forward_impl -> _stem, as torchvision's ResNet),
// scripted in Python and loaded with torch::jit::load, dumped by TorchProbe at L0 in train mode,
// against msprobe's own Python dump of the same weights, input and step
// (tests/data/msprobe_residual, made by its make_reference.py): every module entry pairs by name,
// module gradients agree, and `torchprobe compare` finds no divergence.
#include <torch/torch.h>
#include <torch/script.h>
#include <torch/version.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "torchprobe/analysis/compare/cli.hpp"
#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

const fs::path kTwin = fs::path(TORCHPROBE_TESTS_DIR) / "data" / "msprobe_residual";

// msprobe's dump was made with torch 1.13 on a CPU with AVX-512. Another CPU's kernels (oneDNN's
// AVX2 convolutions: 8.4e-7 of a conv weight gradient's Max on an AVX2-only AMD EPYC) and libtorch
// 2.x's own convolution and batch-norm kernels round the last bits differently; a wrong statistic
// is off by far more (compare's own verdict, below, is asserted as well).
constexpr double kOtherKernels = 1e-5;

// The one rank directory under DUMP/step0/ (msprobe names it proc{pid}).
fs::path rank_dir(const fs::path& dump) {
  for (const auto& e : fs::directory_iterator(dump / "step0"))
    if (e.is_directory()) return e.path();
  return {};
}

torch::Tensor twin_input() {
  std::ifstream in(kTwin / "input.bin", std::ios::binary);
  std::vector<float> v(4 * 3 * 16 * 16);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  REQUIRE(in.gcount() == static_cast<std::streamsize>(v.size() * sizeof(float)));
  return torch::from_blob(v.data(), {4, 3, 16, 16}).clone();
}

// The largest relative difference of one statistic over all tensor items of two entries.
void widest(const Json& a, const Json& b, const char* key, double& worst, std::string& where, const std::string& at) {
  if (a.is_array() && b.is_array()) {
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) widest(a[i], b[i], key, worst, where, at);
  } else if (a.is_object() && b.is_object() && a.contains(key) && b.contains(key) && a[key].is_number() &&
             b[key].is_number()) {
    const double x = a[key].get<double>(), y = b[key].get<double>();
    // A Mean relative to the tensor's range (a mean near zero is the difference of large sums, as
    // compare judges it), the others relative to themselves.
    double scale = std::max(std::fabs(x), std::fabs(y));
    if (std::string(key) == "Mean" && a["Max"].is_number() && a["Min"].is_number())
      scale = std::max(std::fabs(a["Max"].get<double>()), std::fabs(a["Min"].get<double>()));
    const double rel = x == y ? 0 : std::fabs(x - y) / scale;
    if (rel > worst) {
      worst = rel;
      where = at;
    }
  }
}

}  // namespace

TEST_CASE("a scripted residual CNN dumped at L0 pairs every module entry with msprobe's dump, and compare exits 0") {
  REQUIRE(fs::exists(kTwin / "model.pt"));
  const tptest::ReferenceKernels kernels;  // ATen's convolutions, not oneDNN's (wrong on some CPUs)
  tptest::TempDir tmp;
  torch::jit::Module model = torch::jit::load((kTwin / "model.pt").string());
  const torch::Tensor x = twin_input().requires_grad_(true);
  {
    tp::Debugger<tp::Level::L0, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp.path()));
    dbg.start(model);
    torch::manual_seed(7);  // dropout is in train mode: the same draws as the Python step
    const torch::Tensor out = model.forward({x}).toTensor();
    out.pow(2).sum().backward();
    dbg.stop();
    dbg.step();
  }
  const fs::path ours = rank_dir(tmp.path()), theirs = rank_dir(kTwin / "L0");
  REQUIRE(!ours.empty());
  REQUIRE(!theirs.empty());
  const Json a = tptest::read_json((ours / "dump.json").string())["data"];
  const Json b = tptest::read_json((theirs / "dump.json").string())["data"];

  // Every entry of either side has its namesake on the other (msprobe: 33 module calls, their 33
  // backward entries, 17 parameters_grad).
  std::set<std::string> names_a, names_b;
  for (const auto& kv : a.items()) names_a.insert(kv.key());
  for (const auto& kv : b.items()) names_b.insert(kv.key());
  CHECK(names_b.size() == 83);
  CHECK(names_a == names_b);

  // Module gradients (and everything else): Max and Min are elements, equal to the bit when the
  // run is; Mean and Norm are msprobe's float32 sums against our float64 ones.
  double worst_extreme = 0, worst_sum = 0;
  std::string at_extreme, at_sum;
  for (const std::string& n : names_a) {
    if (!names_b.count(n)) continue;
    for (const auto& kv : a[n].items()) {
      if (!b[n].contains(kv.key())) continue;
      for (const char* k : {"Max", "Min"}) widest(kv.value(), b[n][kv.key()], k, worst_extreme, at_extreme, n);
      for (const char* k : {"Mean", "Norm"}) widest(kv.value(), b[n][kv.key()], k, worst_sum, at_sum, n);
    }
  }
  MESSAGE("largest relative difference: Max/Min " << worst_extreme << " (" << at_extreme << "), Mean/Norm " << worst_sum
                                                  << " (" << at_sum << ")");
  CHECK(worst_extreme <= kOtherKernels);
  CHECK(worst_sum <= 1e-5 + kOtherKernels);

  // msprobe's own gradient of each block's input (whole: conv1's branch and the skip) is ours.
  for (const char* block : {"Module.layer1.0.BasicBlock.backward.0", "Module.layer1.1.BasicBlock.backward.0",
                            "Module.layer2.0.BasicBlock.backward.0"}) {
    CAPTURE(block);
    REQUIRE(a.contains(block));
    CHECK(a[block]["output"][0]["Norm"].get<double>() ==
          doctest::Approx(b[block]["output"][0]["Norm"].get<double>()).epsilon(1e-6 + kOtherKernels));
  }

  tp::compare::CompareOptions o;
  o.target = ours;
  o.bench = theirs;
  o.out = tmp / "compare";
  o.timestamp = "20261203000000";
  std::ostringstream log;
  const int status = tp::compare::run_compare(o, log);
  INFO(log.str());
  CHECK(status == 0);
  const Json report = tptest::read_json(tmp / "compare/first_divergence.json");
  MESSAGE("compare: " << report["summary"].dump() << " statistics: " << report["statistics"].dump());
  CHECK(report["summary"]["paired"] == 83);
  CHECK(report["summary"]["target_only"] == 0);
  CHECK(report["summary"]["bench_only"] == 0);
  CHECK(report["statistics"]["more_exact"] == "target");
}

// `torchprobe compare` on TorchProbe's own dumps of a three-Linear net (fc1 -> relu -> fc2 -> relu ->
// fc3, mix level), in statistics and tensor tasks: the run against itself is clean (exit 0); a run
// whose fc2 computes in bfloat16 inside its forward names that module as the source (exit 1); a run
// whose fc2 output is multiplied by 3e38 names that multiplication as the first overflow.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <filesystem>
#include <sstream>
#include <string>

#include "torchprobe/analysis/compare/cli.hpp"
#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;

namespace {

enum class Variant { reference, bf16_fc2, overflow_after_fc2 };

// fc2 of the bfloat16 variant: a Linear (same class name, same parameters) that casts its input
// and parameters to bfloat16, computes, and returns float32 -- float32 at its boundary, so the
// divergence starts inside it.
namespace bf16 {
struct LinearImpl : torch::nn::Module {
  explicit LinearImpl(const torch::nn::Linear& from)
      : weight(register_parameter("weight", from->weight.detach().clone())),
        bias(register_parameter("bias", from->bias.detach().clone())) {}
  torch::Tensor forward(const torch::Tensor& x) {
    tp::ModuleGuard guard(this, x);
    const auto y = torch::linear(x.to(torch::kBFloat16), weight.to(torch::kBFloat16), bias.to(torch::kBFloat16));
    return guard.output(y.to(torch::kFloat));
  }
  torch::Tensor weight, bias;
};
TORCH_MODULE(Linear);
}  // namespace bf16

struct ThreeLinearImpl : torch::nn::Module {
  explicit ThreeLinearImpl(Variant v) : variant(v) {
    torch::manual_seed(7);
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    const torch::nn::Linear second(32, 32);  // drawn in the same order in every variant
    if (v == Variant::bf16_fc2)
      fc2_bf16 = register_module("fc2", bf16::Linear(second));
    else
      fc2 = register_module("fc2", second);
    fc3 = register_module("fc3", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(fc1(x));
    h = variant == Variant::bf16_fc2 ? fc2_bf16(h) : fc2(h);
    if (variant == Variant::overflow_after_fc2) h = h * 3e38;
    return fc3(torch::relu(h));
  }
  Variant variant;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  bf16::Linear fc2_bf16{nullptr};
};
TORCH_MODULE(ThreeLinear);

template <tp::Task T>
void run_variant(const std::string& dump, Variant v) {
  tp::Debugger<tp::Level::Mix, T> dbg(tp::Options().dump_path(dump));
  ThreeLinear net(v);
  torch::manual_seed(1234);
  const auto x = torch::randn({4, 8}) * 8;  // large enough that 3e38 times fc2's output overflows
  {
    tp::ScopedDump scope(dbg, net);
    net->forward(x).sum().backward();
  }
  dbg.step();
}

struct Compared {
  int status = -1;
  nlohmann::ordered_json report;
  std::string log;
};

Compared compare(const std::string& target, const std::string& bench, const std::string& out) {
  tp::compare::CompareOptions o;
  o.target = target + "/step0";
  o.bench = bench + "/step0";
  o.out = out;
  std::ostringstream log;
  Compared c;
  c.status = tp::compare::run_compare(o, log);
  c.log = log.str();
  if (fs::exists(o.out / "first_divergence.json"))
    c.report = tp::compare::read_json_file(o.out / "first_divergence.json");
  return c;
}

template <tp::Task T>
void check_three_cases(const char* task) {
  CAPTURE(task);
  tptest::TempDir tmp;
  const std::string a = tmp.path() + "/a", b = tmp.path() + "/b", c = tmp.path() + "/c";
  run_variant<T>(a, Variant::reference);
  run_variant<T>(b, Variant::bf16_fc2);
  run_variant<T>(c, Variant::overflow_after_fc2);

  const Compared same = compare(a, a, tmp.path() + "/same");
  INFO(same.log);
  CHECK(same.status == 0);
  CHECK(same.report["diverged"] == false);
  CHECK(same.report["summary"]["target_only"] == 0);
  CHECK(same.report["first_divergence"].is_null());

  const Compared low = compare(b, a, tmp.path() + "/bf16");
  INFO(low.log);
  CHECK(low.status == 1);
  REQUIRE(low.report["first_divergence"].is_object());
  CHECK(low.report["first_divergence"]["entry"] == "Module.fc2.Linear.forward.0");
  CHECK(low.report["first_divergence"]["input_error"] == 0);
  // bfloat16 rounding is about 2^16 float32 epsilons: far over the default threshold of 64
  CHECK(low.report["first_divergence"]["output_error"].get<double>() > 1000);
  CHECK(fs::exists(tmp.path() + "/bf16/report.html"));

  const Compared big = compare(c, a, tmp.path() + "/overflow");
  INFO(big.log);
  CHECK(big.status == 1);
  REQUIRE(big.report["first_overflow"]["target"].is_object());
  CHECK(big.report["first_overflow"]["target"]["entry"] == "Aten.mul.0.forward");
  CHECK(big.report["first_overflow"]["bench"].is_null());

  const Compared none = compare(tmp.path() + "/absent", a, tmp.path() + "/bad");
  CHECK(none.status == 2);
  CHECK(none.log.find(tmp.path() + "/absent") != std::string::npos);
}

}  // namespace

TEST_CASE(
    "compare names fc2 as the source when it computes in bfloat16, and the mul that overflows, in statistics dumps") {
  check_three_cases<tp::Task::Statistics>("statistics");
}

TEST_CASE("compare names fc2 as the source when it computes in bfloat16, and the mul that overflows, in tensor dumps") {
  check_three_cases<tp::Task::Tensor>("tensor");
}

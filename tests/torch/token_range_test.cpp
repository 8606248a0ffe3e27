// start(model, token_range): only the model's forward calls start..end (counted from 0 at each
// start()) are recorded, with the calls a generation loop makes after each of them (msprobe's
// forward pre-hook switches the dump at the beginning of forwards start and end + 1).
#include <torch/script.h>
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace tp = torchprobe;
using Json = nlohmann::ordered_json;

namespace {

// A one-layer "language model" whose root forward carries the guard that shows each token.
struct GenImpl : torch::nn::Module {
  explicit GenImpl(bool guarded) : guarded(guarded), fc(register_module("fc", torch::nn::Linear(4, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    if (!guarded) return torch::tanh(fc(x));
    tp::ModuleGuard guard(this, x);
    return torch::tanh(fc(x));
  }
  bool guarded;
  torch::nn::Linear fc;
};
TORCH_MODULE(Gen);

// One token of the loop: the forward's input and output, and what "sampling" made of it.
struct Token {
  at::Tensor in, out, next;
};

// `n` tokens: next = out * 0.5 (an ATen call between two forwards). `around` puts the guard at
// the call site instead of in the forward.
std::vector<Token> generate(Gen& net, int n, double first, bool around = false) {
  torch::NoGradGuard no_grad;
  std::vector<Token> tokens;
  at::Tensor x = torch::linspace(first, first + 1.5, 8).reshape({2, 4});
  for (int t = 0; t < n; ++t) {
    Token k;
    k.in = x;
    if (around) {
      tp::ModuleGuard g(net.get(), x);
      k.out = net->forward(x);
    } else {
      k.out = net->forward(x);
    }
    k.next = k.out * 0.5;
    x = k.next;
    tokens.push_back(k);
  }
  return tokens;
}

std::string rank_dir(const std::string& dump, int step) {
  return dump + "/step" + std::to_string(step) + "/proc" + std::to_string(::getpid());
}

std::vector<std::string> names_of(const Json& data) {
  std::vector<std::string> names;
  for (auto it = data.begin(); it != data.end(); ++it) names.push_back(it.key());
  return names;
}

// A dump.json tensor item against ATen float64 statistics of the tensor the call saw: Max and Min
// exact (float32 values are exact in float64), Mean and Norm to 1e-12 relative.
void check_item(const Json& item, const at::Tensor& value) {
  CAPTURE(item.dump());
  const at::Tensor d = value.to(at::kDouble);
  CHECK(item["shape"] == Json(value.sizes().vec()));
  CHECK(item["Max"].get<double>() == d.max().item<double>());
  CHECK(item["Min"].get<double>() == d.min().item<double>());
  CHECK(item["Mean"].get<double>() == doctest::Approx(d.mean().item<double>()).epsilon(1e-12));
  CHECK(item["Norm"].get<double>() == doctest::Approx(d.norm().item<double>()).epsilon(1e-12));
}

// Token k's entries, numbered n: fc's t and addmm, the Linear module, tanh, and the sampling mul.
void check_token(const Json& data, const Gen& net, const Token& k, int n) {
  const std::string i = std::to_string(n);
  const at::Tensor hidden = torch::addmm(net->fc->bias, k.in, net->fc->weight.t()).detach();  // what fc's addmm made
  check_item(data["Aten.t." + i + ".forward"]["input_args"][0], net->fc->weight);
  check_item(data["Aten.addmm." + i + ".forward"]["output"][0], hidden);
  check_item(data["Module.fc.Linear.forward." + i]["input_args"][0], k.in);
  check_item(data["Module.fc.Linear.forward." + i]["output"][0], hidden);
  check_item(data["Aten.tanh." + i + ".forward"]["input_args"][0], hidden);
  check_item(data["Aten.tanh." + i + ".forward"]["output"][0], k.out);
  check_item(data["Aten.mul." + i + ".forward"]["input_args"][0], k.out);
  check_item(data["Aten.mul." + i + ".forward"]["output"][0], k.next);
}

const std::vector<std::string> kTwoTokens = {
    "Aten.t.0.forward",    "Aten.addmm.0.forward", "Module.fc.Linear.forward.0", "Aten.tanh.0.forward",
    "Aten.mul.0.forward",  "Aten.t.1.forward",     "Aten.addmm.1.forward",       "Module.fc.Linear.forward.1",
    "Aten.tanh.1.forward", "Aten.mul.1.forward"};

}  // namespace

TEST_CASE("token_range {2, 3} records exactly forwards 2 and 3 and the calls after them, in every step") {
  tptest::TempDir tmp;
  torch::manual_seed(3);
  Gen net(true);
  std::vector<std::vector<Token>> steps;
  {
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp.path()));
    dbg.start(net, tp::TokenRange{2, 3});
    steps.push_back(generate(net, 6, -1.0));
    dbg.step();  // the capture goes on in step 1, counting forwards from 0 again
    steps.push_back(generate(net, 6, 0.25));
    dbg.stop();
    dbg.wait_written();
  }
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    const Json data = tptest::read_json(rank_dir(tmp.path(), s) + "/dump.json")["data"];
    REQUIRE(names_of(data) == kTwoTokens);
    check_token(data, net, steps[s][2], 0);
    check_token(data, net, steps[s][3], 1);
  }
}

TEST_CASE("token_range with a list of models counts the first model's forwards only") {
  tptest::TempDir tmp;
  torch::manual_seed(4);
  Gen a(true), b(true);
  std::vector<at::Tensor> a_out, b_out;
  {
    tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp.path()));
    dbg.start(std::vector<Gen>{a, b}, tp::TokenRange{1, 1});
    torch::NoGradGuard no_grad;
    at::Tensor x = torch::linspace(-1, 1, 8).reshape({2, 4});
    for (int t = 0; t < 3; ++t) {  // a's forwards 0, 1, 2, each followed by one of b's
      a_out.push_back(a->forward(x));
      b_out.push_back(b->forward(x));
      x = x + 0.25;
    }
    dbg.stop();
    dbg.step();
    dbg.wait_written();
  }
  // From the start of a's forward 1 to the start of a's forward 2: that forward, b's after it and
  // the add between them. Had b's forwards counted, recording would have begun at b's forward 0.
  const Json data = tptest::read_json(rank_dir(tmp.path(), 0) + "/dump.json")["data"];
  REQUIRE(names_of(data) == std::vector<std::string>{"Aten.t.0.forward", "Aten.addmm.0.forward", "Aten.tanh.0.forward",
                                                     "Aten.t.1.forward", "Aten.addmm.1.forward", "Aten.tanh.1.forward",
                                                     "Aten.add.0.forward"});
  check_item(data["Aten.tanh.0.forward"]["output"][0], a_out[1]);
  check_item(data["Aten.tanh.1.forward"]["output"][0], b_out[1]);
}

TEST_CASE("token_range counts a guard around the call site as the root's forward") {
  tptest::TempDir tmp;
  torch::manual_seed(4);
  Gen net(false);
  std::vector<Token> tokens;
  {
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp.path()));
    dbg.start(net, tp::TokenRange{1, 2});
    tokens = generate(net, 4, 0.5, /*around=*/true);
  }
  const Json data = tptest::read_json(rank_dir(tmp.path(), 0) + "/dump.json")["data"];
  REQUIRE(names_of(data) == kTwoTokens);
  check_token(data, net, tokens[1], 0);
  check_token(data, net, tokens[2], 1);
}

TEST_CASE("token_range on a torch::nn model whose forward no guard shows records nothing and says why") {
  tptest::TempDir tmp;
  Gen net(false);
  {
    tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp.path()));
    dbg.start(net, tp::TokenRange{0, 1});
    generate(net, 3, 0.0);
  }
  const Json data = tptest::read_json(rank_dir(tmp.path(), 0) + "/dump.json")["data"];
  CHECK(data.empty());
  const std::string log = tptest::read_text(rank_dir(tmp.path(), 0) + "/dump_error_info.log");
  CHECK(log.find("token_range {0, 1} recorded nothing: 0 forward call(s)") != std::string::npos);
  CHECK(log.find("torchprobe::ModuleGuard") != std::string::npos);
}

TEST_CASE("token_range on a TorchScript model counts its forward calls with no change to the model") {
  tptest::TempDir tmp;
  torch::jit::Module gen("Gen");
  gen.define(R"(
def forward(self, x):
    return torch.tanh(x * 2.0)
)");
  std::vector<at::Tensor> in, out;
  {
    tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp.path()));
    dbg.start(gen, tp::TokenRange{1, 2});
    torch::NoGradGuard no_grad;
    at::Tensor x = torch::linspace(-1.0, 1.0, 6);
    for (int t = 0; t < 4; ++t) {
      in.push_back(x);
      out.push_back(gen.forward({x}).toTensor());
      x = out.back() + 0.25;
    }
  }
  const Json data = tptest::read_json(rank_dir(tmp.path(), 0) + "/dump.json")["data"];
  REQUIRE(names_of(data) == std::vector<std::string>{"Aten.mul.0.forward", "Aten.tanh.0.forward", "Aten.add.0.forward",
                                                     "Aten.mul.1.forward", "Aten.tanh.1.forward",
                                                     "Aten.add.1.forward"});
  for (int n = 0; n < 2; ++n) {
    CAPTURE(n);
    const std::string i = std::to_string(n);
    check_item(data["Aten.mul." + i + ".forward"]["input_args"][0], in[n + 1]);
    check_item(data["Aten.tanh." + i + ".forward"]["output"][0], out[n + 1]);
    check_item(data["Aten.add." + i + ".forward"]["output"][0], in[n + 2]);
  }
}

TEST_CASE("token_range without a model, or with start > end or a negative start, is refused by name") {
  tptest::TempDir tmp;
  Gen net(true);
  tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp.path()));
  CHECK_THROWS_WITH_AS(dbg.start(tp::ModelRef{}, tp::TokenRange{2, 3}),
                       doctest::Contains("missing the parameter 'model'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      dbg.start(net, tp::TokenRange{3, 2}),
      doctest::Contains("token_range {3, 2} is invalid; it must be {start, end} with 0 <= start <= end"),
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(dbg.start(net, tp::TokenRange{-1, 2}), doctest::Contains("token_range {-1, 2} is invalid"),
                       std::invalid_argument);
  CHECK_FALSE(dbg.running());

  const std::string cfg = tmp / "config.json";
  std::ofstream(cfg) << R"({"task": "statistics", "level": "L1", "dump_path": ")" << tmp.path() << "/pd\"}";
  tp::PrecisionDebugger pd(cfg);
  CHECK_THROWS_WITH_AS(pd.start(std::vector<Gen>{}, tp::TokenRange{0, 0}),
                       doctest::Contains("missing the parameter 'model'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(pd.start(net, tp::TokenRange{5, 4}), doctest::Contains("token_range {5, 4} is invalid"),
                       std::invalid_argument);
  CHECK_FALSE(pd.running());
}

TEST_CASE("PrecisionDebugger::start(model, token_range) records the chosen token only") {
  tptest::TempDir tmp;
  torch::manual_seed(5);
  Gen net(true);
  const std::string cfg = tmp / "config.json";
  std::ofstream(cfg) << R"({"task": "statistics", "level": "L1", "dump_path": ")" << tmp.path() << "\"}";
  std::vector<Token> tokens;
  {
    tp::PrecisionDebugger pd(cfg);
    pd.start(net, tp::TokenRange{0, 0});
    tokens = generate(net, 3, 1.0);
    pd.stop();
    pd.wait_written();
  }
  const Json data = tptest::read_json(rank_dir(tmp.path(), 0) + "/dump.json")["data"];
  REQUIRE(names_of(data) == std::vector<std::string>{"Aten.t.0.forward", "Aten.addmm.0.forward", "Aten.tanh.0.forward",
                                                     "Aten.mul.0.forward"});
  check_item(data["Aten.tanh.0.forward"]["output"][0], tokens[0].out);
  check_item(data["Aten.mul.0.forward"]["output"][0], tokens[0].next);
}

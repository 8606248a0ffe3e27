// A module's backward entry lists only the gradients msprobe's BackwardHook sees: those of the
// outputs and positional inputs that require grad. API entries keep their positional nulls.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <filesystem>
#include <string>

#include "reference_program.hpp"
#include "test_support.hpp"

namespace tp = torchprobe;
using Json = nlohmann::ordered_json;

namespace {

struct EmbNetImpl : torch::nn::Module {
  EmbNetImpl()
      : emb(register_module("emb", torch::nn::Embedding(10, 4))), fc(register_module("fc", torch::nn::Linear(4, 3))) {}
  torch::Tensor forward(const torch::Tensor& tokens) { return fc(emb(tokens)); }
  torch::nn::Embedding emb;
  torch::nn::Linear fc;
};
TORCH_MODULE(EmbNet);

std::size_t requiring_grad(const Json& items) {
  std::size_t n = 0;
  for (const Json& i : items) n += i.is_object() && i.value("requires_grad", false) ? 1 : 0;
  return n;
}

// msprobe's rule, read off a dump: each Module.*.backward.{n} has as many "output" items as its
// forward's input_args that required grad, and as many "input" items as outputs that did.
int check_module_backwards(const Json& data) {
  int checked = 0;
  for (const auto& kv : data.items()) {
    const std::string& name = kv.key();
    const auto at = name.find(".backward.");
    if (name.rfind("Module.", 0) != 0 || at == std::string::npos) continue;
    const std::string forward = name.substr(0, at) + ".forward." + name.substr(at + 10);
    CAPTURE(name);
    REQUIRE(data.contains(forward));
    CHECK(kv.value()["output"].size() == requiring_grad(data[forward]["input_args"]));
    CHECK(kv.value()["input"].size() == requiring_grad(data[forward]["output"]));
    ++checked;
  }
  return checked;
}

}  // namespace

TEST_CASE("msprobe's reference dumps and TorchProbe's dump of the same program follow one module backward rule") {
  REQUIRE_MESSAGE(std::filesystem::exists(std::string(TORCHPROBE_REFERENCE_DUMPS) + "/stat_L0"),
                  "no msprobe reference dumps at " << TORCHPROBE_REFERENCE_DUMPS);
  int theirs = 0;
  for (const char* dump : {"stat_L0", "stat_mix", "md5_mix", "tensor_mix"})
    for (const auto& step : std::filesystem::directory_iterator(std::string(TORCHPROBE_REFERENCE_DUMPS) + "/" + dump))
      for (const auto& rank : std::filesystem::directory_iterator(step.path()))
        theirs += check_module_backwards(tptest::read_json(rank.path().string() + "/dump.json")["data"]);
  CHECK(theirs == 8);  // Module.fc.Linear.backward.0 of each dump's two steps
  tptest::TempDir tmp;
  tptest::run_reference_program<tp::Level::Mix>(tmp.path(), "statistics");
  int ours = 0;
  for (int s = 0; s < 2; ++s)
    ours += check_module_backwards(tptest::read_json(
        tmp / ("step" + std::to_string(s) + "/proc" + std::to_string(::getpid()) + "/dump.json"))["data"]);
  CHECK(ours == 2);
}

TEST_CASE("an Embedding's backward entry has \"output\": [] (its indices need no gradient); its ATen call keeps null") {
  torch::manual_seed(3);
  EmbNet net;
  tp::Debugger<tp::Level::Mix, tp::Task::Statistics, tp::MemorySink> dbg(
      tp::Options().dump_path("/tmp/torchprobe-memory-sink").extra_info(false));
  const at::Tensor tokens = torch::tensor({{1, 4, 4, 7, 0}, {2, 9, 3, 3, 5}}, torch::kLong);
  dbg.start(net);
  net->forward(tokens).sum().backward();
  dbg.stop();
  Json d = dbg.sink().step(0).dump["data"];
  CHECK(check_module_backwards(d) == 2);
  REQUIRE(d.contains("Module.emb.Embedding.backward.0"));
  Json& emb = d["Module.emb.Embedding.backward.0"];
  CHECK(emb["output"] == Json::array());
  REQUIRE(emb["input"].size() == 1);
  // d(sum(fc(e)))/de = ones(2, 5, 3) @ W, computed here in float64
  const at::Tensor grad_e = torch::ones({2, 5, 3}, torch::kDouble).matmul(net->fc->weight.detach().to(torch::kDouble));
  CHECK(emb["input"][0]["shape"] == Json({2, 5, 4}));
  CHECK(emb["input"][0]["Max"].get<double>() == doctest::Approx(grad_e.max().item<double>()).epsilon(1e-6));
  CHECK(emb["input"][0]["Norm"].get<double>() == doctest::Approx(grad_e.norm().item<double>()).epsilon(1e-6));
  // The Linear's input does need one: its one "output" item is the same gradient.
  REQUIRE(d["Module.fc.Linear.backward.0"]["output"].size() == 1);
  CHECK(d["Module.fc.Linear.backward.0"]["output"][0]["Norm"].get<double>() ==
        doctest::Approx(grad_e.norm().item<double>()).epsilon(1e-6));
  // The ATen call: embedding(weight, indices) -> [grad of weight, null]
  Json& api = d["Aten.embedding.0.backward"]["output"];
  REQUIRE(api.size() == 2);
  CHECK(api[0]["shape"] == Json({10, 4}));
  CHECK(api[1].is_null());
}

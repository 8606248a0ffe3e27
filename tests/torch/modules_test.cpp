// Backward entries, module level (L0) and mix: gradients against autograd's own, module entries
// against msprobe's Python dumps of the same model, guards, construct.json, threads.
#include <torch/torch.h>
#include <torch/script.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <set>
#include <thread>

#include "test_support.hpp"

namespace tp = torchprobe;
using Json = nlohmann::ordered_json;

namespace {

using tptest::Net;

template <tp::Level L>
using MemoryDebugger = tp::Debugger<L, tp::Task::Statistics, tp::MemorySink>;

tp::Options memory_options() { return tp::Options().dump_path("/tmp/torchprobe-memory-sink").extra_info(false); }

std::vector<std::string> names_of(const Json& data) {
  std::vector<std::string> names;
  for (const auto& kv : data.items()) names.push_back(kv.key());
  return names;
}

// The statistics of `item` (a dump.json tensor item) equal those of `t` computed by ATen in float64.
void check_item_is(const Json& item_, const at::Tensor& t) {
  Json item = item_;
  CAPTURE(item.dump());
  REQUIRE(item.is_object());
  CHECK(item["shape"] == Json(t.sizes().vec()));
  const at::Tensor d = t.to(at::kDouble);
  CHECK(item["Max"].get<double>() == d.max().item<double>());
  CHECK(item["Min"].get<double>() == d.min().item<double>());
  CHECK(item["Mean"].get<double>() == doctest::Approx(d.mean().item<double>()).epsilon(1e-9));
  CHECK(item["Norm"].get<double>() == doctest::Approx(d.norm().item<double>()).epsilon(1e-9));
  CHECK(item["requires_grad"] == false);
}

// Module entries include gradients, which C++ and Python may round differently in the last bit.
void check_same_statistics(const Json& ours, const Json& theirs) {
  tptest::check_same_statistics(ours, theirs, /*extrema_rel=*/1e-6);
}

// msprobe's Python dump of step `s` at a level ("stat_L0", "stat_mix").
Json reference(const std::string& level, int s) {
  const std::string dir =
      std::string(TORCHPROBE_TESTS_DIR) + "/data/reference-dumps/" + level + "/step" + std::to_string(s);
  for (const auto& e : std::filesystem::directory_iterator(dir))
    return tptest::read_json(e.path().string() + "/dump.json")["data"];
  return Json();
}

}  // namespace

TEST_CASE(
    "API backward entries hold the gradients autograd computes: w.r.t. outputs as input, w.r.t. inputs as output") {
  MemoryDebugger<tp::Level::L1> dbg(memory_options());
  torch::manual_seed(3);
  auto x = torch::randn({3, 5}, torch::requires_grad());
  auto w = torch::randn({3, 5}, torch::requires_grad());
  dbg.start();
  auto y = x.mul(w);
  y.retain_grad();
  auto z = y.sin();
  z.retain_grad();
  (z * z).sum().backward();
  dbg.stop();
  Json d = dbg.sink().step(0).dump["data"];
  REQUIRE(d.contains("Aten.mul.0.backward"));
  REQUIRE(d.contains("Aten.sin.0.backward"));
  check_item_is(d["Aten.sin.0.backward"]["input"][0], z.grad());
  check_item_is(d["Aten.sin.0.backward"]["output"][0], y.grad());
  check_item_is(d["Aten.mul.0.backward"]["input"][0], y.grad());
  check_item_is(d["Aten.mul.0.backward"]["output"][0], x.grad());
  check_item_is(d["Aten.mul.0.backward"]["output"][1], w.grad());
  // backward entries arrive in the order autograd runs them
  const auto names = names_of(d);
  const auto pos = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) - names.begin(); };
  CHECK(pos("Aten.sum.0.backward") < pos("Aten.mul.1.backward"));
  CHECK(pos("Aten.mul.1.backward") < pos("Aten.sin.0.backward"));
  CHECK(pos("Aten.sin.0.backward") < pos("Aten.mul.0.backward"));
}

TEST_CASE("composite, in-place and later-reshaped ops get their backward, with null for inputs that need no gradient") {
  MemoryDebugger<tp::Level::L1> dbg(memory_options());
  torch::manual_seed(4);
  auto x = torch::randn({4, 6}, torch::requires_grad());
  auto w = torch::randn({3, 6}, torch::requires_grad());
  auto b = torch::randn({3});  // needs no gradient
  dbg.start();
  auto lin = at::linear(x, w, b);  // composite: t and addmm nodes inside one call
  lin.retain_grad();
  auto a = lin * 2;
  a.mul_(3);  // in-place: its input's history moves to the new node
  auto e = a.exp();
  auto flat = e.view({-1});  // the output of exp is reshaped before use
  flat.sum().backward();
  dbg.stop();
  Json d = dbg.sink().step(0).dump["data"];
  REQUIRE(d.contains("Aten.linear.0.backward"));
  REQUIRE(d.contains("Aten.mul_.0.backward"));
  REQUIRE(d.contains("Aten.exp.0.backward"));
  check_item_is(d["Aten.linear.0.backward"]["input"][0], lin.grad());
  Json& lin_out = d["Aten.linear.0.backward"]["output"];
  REQUIRE(lin_out.size() == 3);
  check_item_is(lin_out[0], x.grad());
  check_item_is(lin_out[1], w.grad());
  CHECK(lin_out[2].is_null());
  // d(a*3)/da = 3, times d(exp)/d(.) = exp(a)
  const at::Tensor grad_after = a.detach().exp();
  check_item_is(d["Aten.mul_.0.backward"]["input"][0], grad_after);
  check_item_is(d["Aten.mul_.0.backward"]["output"][0], grad_after * 3);
  check_item_is(d["Aten.exp.0.backward"]["input"][0], torch::ones({4, 3}));
}

TEST_CASE("a tensor passed twice gets a gradient in each of its positions") {
  MemoryDebugger<tp::Level::L1> dbg(memory_options());
  auto p = torch::tensor({1.0f, -2.0f, 3.0f}, torch::requires_grad());
  dbg.start();
  p.mul(p).sum().backward();
  dbg.stop();
  Json out = dbg.sink().step(0).dump["data"]["Aten.mul.0.backward"]["output"];
  REQUIRE(out.size() == 2);
  check_item_is(out[0], p.detach());  // d(p*q)/dp = q = p
  check_item_is(out[1], p.detach());
  CHECK(torch::equal(p.grad(), 2 * p.detach()));
}

namespace {

// The module entries of the reference program (two steps of relu(fc(x)).sum().backward()) against
// msprobe's Python dumps, at L0 (level 0) or mix (level 1).
void check_against_msprobe(int level, std::map<std::int64_t, tp::MemorySink::Files>& steps) {
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    Json ours = steps.at(s).dump["data"];
    Json ref = reference(level == 0 ? "stat_L0" : "stat_mix", s);
    if (level == 0) CHECK(names_of(ours) == names_of(ref));  // same entries in the same order
    Json &f = ours["Module.fc.Linear.forward.0"], &rf = ref["Module.fc.Linear.forward.0"];
    check_same_statistics(f["input_args"][0], rf["input_args"][0]);
    check_same_statistics(f["output"][0], rf["output"][0]);
    check_same_statistics(f["parameters"]["weight"], rf["parameters"]["weight"]);
    check_same_statistics(f["parameters"]["bias"], rf["parameters"]["bias"]);
    Json &b = ours["Module.fc.Linear.backward.0"], &rb = ref["Module.fc.Linear.backward.0"];
    check_same_statistics(b["input"][0], rb["input"][0]);
    check_same_statistics(b["output"][0], rb["output"][0]);
    Json &g = ours["Module.fc.Linear.parameters_grad.0"], &rg = ref["Module.fc.Linear.parameters_grad.0"];
    check_same_statistics(g["weight"][0], rg["weight"][0]);
    check_same_statistics(g["bias"][0], rg["bias"][0]);
    CHECK(steps.at(s).construct["Module.fc.Linear.forward.0"].is_null());
  }
}

// Runs the reference program on `model` (a Net or its TorchScript export) under a Debugger of level L.
template <tp::Level L, class Model, class Forward>
std::map<std::int64_t, tp::MemorySink::Files> run_reference(Model& model, Forward forward) {
  MemoryDebugger<L> dbg(memory_options());
  for (int s = 0; s < 2; ++s) {
    const auto x = torch::randn({2, 8}, torch::requires_grad());
    {
      tp::ScopedDump scope(dbg, model);
      forward(x).sum().backward();
    }
    dbg.step();
  }
  return dbg.sink().steps();
}

}  // namespace

TEST_CASE("L0 and mix: the Linear module's entries equal msprobe's Python dumps of the same model") {
  for (int level = 0; level < 2; ++level) {
    CAPTURE(level);
    torch::manual_seed(1234);
    Net net;
    auto forward = [&](const torch::Tensor& x) { return net->forward(x); };
    auto steps = level == 0 ? run_reference<tp::Level::L0>(net, forward) : run_reference<tp::Level::Mix>(net, forward);
    check_against_msprobe(level, steps);
    if (level == 1) {
      // mix: the ATen calls of the Linear belong to it; relu and sum are at top level
      Json& c = steps.at(0).construct;
      CHECK(c["Aten.t.0.forward"] == "Module.fc.Linear.forward.0");
      CHECK(c["Aten.addmm.0.forward"] == "Module.fc.Linear.forward.0");
      CHECK(c["Aten.relu.0.forward"].is_null());
      CHECK(c["Aten.addmm.0.backward"] == "Module.fc.Linear.backward.0");
      CHECK(names_of(steps.at(0).dump["data"]) ==
            std::vector<std::string>{"Aten.t.0.forward", "Aten.addmm.0.forward", "Module.fc.Linear.forward.0",
                                     "Aten.relu.0.forward", "Aten.sum.0.forward", "Aten.sum.0.backward",
                                     "Aten.relu.0.backward", "Aten.addmm.0.backward", "Aten.t.0.backward",
                                     "Module.fc.Linear.parameters_grad.0", "Module.fc.Linear.backward.0"});
    }
  }
}

TEST_CASE("a TorchScript export of the model, loaded with torch::jit::load, gives the same module entries as msprobe") {
  tptest::TempDir tmp;
  const std::string path = tmp / "net.pt";
  int rc = 0;
  const std::string out = tptest::run_python(
      "import torch\n"
      "torch.manual_seed(1234)\n"
      "class Net(torch.nn.Module):\n"
      "    def __init__(self):\n"
      "        super().__init__()\n"
      "        self.fc = torch.nn.Linear(8, 4)\n"
      "    def forward(self, x):\n"
      "        return torch.relu(self.fc(x))\n"
      "torch.jit.script(Net()).save('" +
          path + "')\n",
      &rc);
  REQUIRE_MESSAGE(rc == 0, out);
  for (int level = 0; level < 2; ++level) {
    CAPTURE(level);
    torch::jit::Module scripted = torch::jit::load(path);
    torch::manual_seed(1234);
    torch::nn::Linear same_draws(8, 4);  // consume the generator as the Python model's init did
    auto forward = [&](const torch::Tensor& x) { return scripted.forward({x}).toTensor(); };
    auto steps =
        level == 0 ? run_reference<tp::Level::L0>(scripted, forward) : run_reference<tp::Level::Mix>(scripted, forward);
    check_against_msprobe(level, steps);
    if (level == 1) {
      Json& c = steps.at(0).construct;
      CHECK(c["Aten.linear.0.forward"] == "Module.fc.Linear.forward.0");  // TorchScript calls aten::linear itself
      CHECK(c["Aten.relu.0.forward"].is_null());
      CHECK(c["Aten.linear.0.backward"] == "Module.fc.Linear.backward.0");
    }
  }
}

namespace {

struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : proj(register_module("proj", torch::nn::Linear(6, 6))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    tp::ModuleGuard guard(this, x);  // the one line a parameter-free or container module needs
    return norm(proj(x)).relu() + x;
  }
  torch::nn::Linear proj;
  torch::nn::LayerNorm norm;
};
TORCH_MODULE(Block);

struct ModelImpl : torch::nn::Module {
  ModelImpl()
      : embed(register_module("embed", torch::nn::Embedding(10, 6))),
        block(register_module("block", Block())),
        conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 2, 3).padding(1)))),
        head(register_module("head", tp::probe_children(torch::nn::Sequential(
                                         torch::nn::Linear(12, 5), torch::nn::ReLU(), torch::nn::Linear(5, 2))))) {}
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto h = block(embed(tokens));             // [B, 2, 6]
    auto c = conv(h.unsqueeze(1)).mean(1);     // [B, 2, 6]
    return head->forward((h + c).flatten(1));  // [B, 2]
  }
  torch::nn::Embedding embed;
  Block block;
  torch::nn::Conv2d conv;
  torch::nn::Sequential head;
};
TORCH_MODULE(Model);

}  // namespace

TEST_CASE(
    "a model with Embedding, a guarded block with Linear and LayerNorm, Conv2d and a probed Sequential: entries, "
    "counters, construct.json") {
  torch::manual_seed(5);
  Model model;
  MemoryDebugger<tp::Level::Mix> dbg(memory_options());
  const auto tokens = torch::randint(0, 10, {3, 2});
  {
    tp::ScopedDump scope(dbg, model);
    model->forward(tokens).sum().backward();
    model->forward(tokens);  // a second call: counters 1
  }
  auto files = dbg.sink().step(0);
  Json d = files.dump["data"];
  std::set<std::string> modules;
  for (const auto& n : names_of(d))
    if (n.rfind("Module.", 0) == 0) modules.insert(n);
  const std::set<std::string> expected = {"Module.embed.Embedding.forward.0",
                                          "Module.embed.Embedding.forward.1",
                                          "Module.embed.Embedding.backward.0",
                                          "Module.embed.Embedding.parameters_grad.0",
                                          "Module.block.Block.forward.0",
                                          "Module.block.Block.forward.1",
                                          "Module.block.Block.backward.0",
                                          "Module.block.proj.Linear.forward.0",
                                          "Module.block.proj.Linear.forward.1",
                                          "Module.block.proj.Linear.backward.0",
                                          "Module.block.proj.Linear.parameters_grad.0",
                                          "Module.block.norm.LayerNorm.forward.0",
                                          "Module.block.norm.LayerNorm.forward.1",
                                          "Module.block.norm.LayerNorm.backward.0",
                                          "Module.block.norm.LayerNorm.parameters_grad.0",
                                          "Module.conv.Conv2d.forward.0",
                                          "Module.conv.Conv2d.forward.1",
                                          "Module.conv.Conv2d.backward.0",
                                          "Module.conv.Conv2d.parameters_grad.0",
                                          "Module.head.0.Linear.forward.0",
                                          "Module.head.0.Linear.forward.1",
                                          "Module.head.0.Linear.backward.0",
                                          "Module.head.0.Linear.parameters_grad.0",
                                          "Module.head.1.ReLU.forward.0",
                                          "Module.head.1.ReLU.forward.1",
                                          "Module.head.1.ReLU.backward.0",
                                          "Module.head.2.Linear.forward.0",
                                          "Module.head.2.Linear.forward.1",
                                          "Module.head.2.Linear.backward.0",
                                          "Module.head.2.Linear.parameters_grad.0"};
  CHECK(modules == expected);
  Json& c = files.construct;
  CHECK(c["Module.block.proj.Linear.forward.0"] == "Module.block.Block.forward.0");
  CHECK(c["Module.block.norm.LayerNorm.forward.1"] == "Module.block.Block.forward.1");
  CHECK(c["Module.block.Block.forward.0"].is_null());
  CHECK(c["Module.head.1.ReLU.forward.0"] == "Module.head.Sequential.forward.0");  // no guard: inferred
  CHECK(c["Module.head.Sequential.forward.0"].is_null());
  CHECK(c["Module.embed.Embedding.forward.0"].is_null());
  CHECK(c["Aten.relu.0.forward"] == "Module.block.Block.forward.0");  // inside the guarded block
  CHECK(c["Aten.layer_norm.0.forward"] == "Module.block.norm.LayerNorm.forward.0");
  CHECK(c["Aten.conv2d.0.forward"] == "Module.conv.Conv2d.forward.0");
  CHECK(c["Aten.relu.1.forward"] == "Module.head.1.ReLU.forward.0");
  CHECK(c["Module.block.proj.Linear.backward.0"] == "Module.block.Block.backward.0");
  // the guarded block's own entry: its input is the embedding's output, its output the last call's
  Json& blk = d["Module.block.Block.forward.0"];
  CHECK(blk["input_args"][0]["shape"] == Json::parse("[3, 2, 6]"));
  CHECK(blk["output"][0]["shape"] == Json::parse("[3, 2, 6]"));
  CHECK(d["Module.embed.Embedding.forward.0"]["input_args"][0]["dtype"] == "torch.int64");
  CHECK(d["Module.embed.Embedding.forward.0"]["parameters"].contains("weight"));
  CHECK(d["Module.head.1.ReLU.backward.0"]["output"][0]["shape"] == Json::parse("[3, 5]"));
  CHECK(d["Module.conv.Conv2d.backward.0"]["output"][0]["shape"] == Json::parse("[3, 1, 2, 6]"));
}

TEST_CASE("every parameter-owning leaf of torch::nn is found without any change to the model") {
  torch::manual_seed(9);
  struct ZooImpl : torch::nn::Module {
    torch::nn::Linear linear = register_module("linear", torch::nn::Linear(6, 6));
    torch::nn::Conv1d conv1 = register_module("conv1", torch::nn::Conv1d(2, 2, 3));
    torch::nn::Conv2d conv2 = register_module("conv2", torch::nn::Conv2d(2, 2, 3));
    torch::nn::Conv3d conv3 = register_module("conv3", torch::nn::Conv3d(2, 2, 3));
    torch::nn::ConvTranspose2d deconv = register_module("deconv", torch::nn::ConvTranspose2d(2, 2, 3));
    torch::nn::BatchNorm1d bn = register_module("bn", torch::nn::BatchNorm1d(6));
    torch::nn::LayerNorm ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})));
    torch::nn::GroupNorm gn = register_module("gn", torch::nn::GroupNorm(2, 6));
    torch::nn::Embedding emb = register_module("emb", torch::nn::Embedding(10, 6));
    torch::nn::LSTM lstm = register_module("lstm", torch::nn::LSTM(6, 4));
    torch::nn::GRU gru = register_module("gru", torch::nn::GRU(6, 4));
    torch::nn::RNN rnn = register_module("rnn", torch::nn::RNN(6, 4));
    torch::nn::PReLU prelu = register_module("prelu", torch::nn::PReLU());
  };
  auto zoo = std::make_shared<ZooImpl>();
  MemoryDebugger<tp::Level::L0> dbg(memory_options());
  const auto v = torch::randn({4, 6}, torch::requires_grad());
  const auto seq = torch::randn({5, 2, 6}, torch::requires_grad());
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> expect = {
      {"linear.Linear", {4, 6}},
      {"conv1.Conv1d", {2, 2, 7}},
      {"conv2.Conv2d", {2, 2, 5, 5}},
      {"conv3.Conv3d", {1, 2, 4, 4, 4}},
      {"deconv.ConvTranspose2d", {2, 2, 5, 5}},
      {"bn.BatchNorm1d", {4, 6}},
      {"ln.LayerNorm", {4, 6}},
      {"gn.GroupNorm", {4, 6}},
      {"emb.Embedding", {4}},
      {"lstm.LSTM", {5, 2, 6}},
      {"gru.GRU", {5, 2, 6}},
      {"rnn.RNN", {5, 2, 6}},
      {"prelu.PReLU", {4, 6}}};
  dbg.start(zoo);
  std::vector<torch::Tensor> outs = {zoo->linear(v),
                                     zoo->conv1(torch::randn({2, 2, 7})),
                                     zoo->conv2(torch::randn({2, 2, 5, 5})),
                                     zoo->conv3(torch::randn({1, 2, 4, 4, 4})),
                                     zoo->deconv(torch::randn({2, 2, 5, 5})),
                                     zoo->bn(v),
                                     zoo->ln(v),
                                     zoo->gn(v),
                                     zoo->emb(torch::randint(0, 10, {4})),
                                     std::get<0>(zoo->lstm(seq)),
                                     std::get<0>(zoo->gru(seq)),
                                     std::get<0>(zoo->rnn(seq)),
                                     zoo->prelu(v)};
  torch::Tensor total = torch::zeros({});
  for (const auto& o : outs) total = total + o.sum();
  total.backward();
  dbg.stop();
  Json d = dbg.sink().step(0).dump["data"];
  for (const auto& e : expect) {
    CAPTURE(e.first);
    const std::string m = "Module." + e.first;
    REQUIRE(d.contains(m + ".forward.0"));
    CHECK(d[m + ".forward.0"]["input_args"][0]["shape"] == Json(e.second));
    CHECK(d[m + ".forward.0"]["parameters"].size() >= 1);
    CHECK_FALSE(d.contains(m + ".forward.1"));  // one call, one entry
    CHECK(d.contains(m + ".backward.0"));
    CHECK(d.contains(m + ".parameters_grad.0"));
  }
  // BatchNorm's running statistics are its state, not its inputs
  CHECK(d["Module.bn.BatchNorm1d.forward.0"]["input_args"].size() == 1);
}

namespace {
// Fine-tuning: a frozen backbone (fc1, no parameter needs a gradient) and one frozen parameter of a
// trained layer (fc2's bias).
struct PartlyFrozenImpl : torch::nn::Module {
  PartlyFrozenImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 8))), fc2(register_module("fc2", torch::nn::Linear(8, 4))) {
    for (auto& p : fc1->parameters()) p.requires_grad_(false);
    fc2->bias.requires_grad_(false);
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(PartlyFrozen);
}  // namespace

TEST_CASE("a partly frozen model (fine-tuning): gradient entries only for trained parameters, backward entries whole") {
  // Steps 0 and 1 train fc2's weight only; step 2 freezes it too (a layer frozen after training).
  constexpr int kSteps = 3;
  auto freeze_at = [](PartlyFrozen& model, int s) {
    if (s == 2) model->fc2->weight.requires_grad_(false);
  };
  // The plain run, with the gradients at each module boundary kept for reference.
  struct Step {
    torch::Tensor loss, x_grad, w2_grad, h_grad, a_grad, y_grad;
  };
  auto plain = [&] {
    torch::manual_seed(5);
    PartlyFrozen model;
    std::vector<Step> out;
    for (int s = 0; s < kSteps; ++s) {
      freeze_at(model, s);
      const auto x = torch::randn({3, 8}, torch::requires_grad());
      auto h = model->fc1(x);
      auto a = torch::relu(h);
      auto y = model->fc2(a);
      for (auto* t : {&h, &a, &y}) t->retain_grad();
      const auto loss = y.pow(2).sum();
      loss.backward();
      const auto w2 = model->fc2->weight.grad();
      out.push_back({loss.detach(), x.grad().clone(), w2.defined() ? w2.clone() : w2, h.grad(), a.grad(), y.grad()});
      model->zero_grad(/*set_to_none=*/true);
    }
    return out;
  };
  const std::vector<Step> ref = plain();
  REQUIRE(ref[1].w2_grad.defined());
  REQUIRE(!ref[2].w2_grad.defined());

  torch::manual_seed(5);
  PartlyFrozen model;
  MemoryDebugger<tp::Level::Mix> dbg(memory_options());
  for (int s = 0; s < kSteps; ++s) {
    CAPTURE(s);
    freeze_at(model, s);
    const auto x = torch::randn({3, 8}, torch::requires_grad());
    torch::Tensor loss;
    {
      tp::ScopedDump scope(dbg, model);
      loss = model->forward(x).pow(2).sum();
      loss.backward();
    }
    dbg.step();
    // The probe changes nothing: loss and gradients bit-identical, frozen parameters still without.
    CHECK(torch::equal(loss.detach(), ref[s].loss));
    CHECK(torch::equal(x.grad(), ref[s].x_grad));
    CHECK(model->fc2->weight.grad().defined() == ref[s].w2_grad.defined());
    if (ref[s].w2_grad.defined()) CHECK(torch::equal(model->fc2->weight.grad(), ref[s].w2_grad));
    CHECK(!model->fc1->weight.grad().defined());
    CHECK(!model->fc1->bias.grad().defined());
    CHECK(!model->fc2->bias.grad().defined());
    model->zero_grad(/*set_to_none=*/true);

    Json d = dbg.sink().step(s).dump["data"];
    // The module entries in msprobe's order: a module's parameters_grad right before its backward
    // entry, each backward entry as its gradient arrives (none held back for a frozen parameter).
    std::vector<std::string> modules;
    for (const auto& n : names_of(d))
      if (n.rfind("Module.", 0) == 0) modules.push_back(n);
    std::vector<std::string> want = {"Module.fc1.Linear.forward.0", "Module.fc2.Linear.forward.0",
                                     "Module.fc2.Linear.parameters_grad.0", "Module.fc2.Linear.backward.0",
                                     "Module.fc1.Linear.backward.0"};
    if (s == 2) want.erase(want.begin() + 2);  // fc2 trains nothing any more
    CHECK(modules == want);
    if (s < 2) {
      const std::string g = "Module.fc2.Linear.parameters_grad.0";
      REQUIRE(d.contains(g));
      CHECK(names_of(d[g]) == std::vector<std::string>{"weight"});
      check_item_is(d[g]["weight"][0], ref[s].w2_grad);
    }
    // The forward entries say which parameters are trained.
    CHECK(d["Module.fc1.Linear.forward.0"]["parameters"]["weight"]["requires_grad"] == false);
    CHECK(d["Module.fc2.Linear.forward.0"]["parameters"]["weight"]["requires_grad"] == (s < 2));
    CHECK(d["Module.fc2.Linear.forward.0"]["parameters"]["bias"]["requires_grad"] == false);
    // Backward entries: "input" is the gradient arriving at the module's output, "output" the one it
    // passes to its input. fc1's are there although none of its parameters is trained.
    REQUIRE(d.contains("Module.fc2.Linear.backward.0"));
    REQUIRE(d.contains("Module.fc1.Linear.backward.0"));
    check_item_is(d["Module.fc2.Linear.backward.0"]["input"][0], ref[s].y_grad);
    check_item_is(d["Module.fc2.Linear.backward.0"]["output"][0], ref[s].a_grad);
    check_item_is(d["Module.fc1.Linear.backward.0"]["input"][0], ref[s].h_grad);
    check_item_is(d["Module.fc1.Linear.backward.0"]["output"][0], ref[s].x_grad);
  }
}

TEST_CASE("with mix on, losses and gradients stay bit-identical") {
  auto run = [](bool probed) {
    torch::manual_seed(11);
    Model model;
    MemoryDebugger<tp::Level::Mix> dbg(memory_options());
    const auto tokens = torch::randint(0, 10, {4, 2});
    if (probed) dbg.start(model);
    auto loss = model->forward(tokens).pow(2).mean();
    loss.backward();
    if (probed) dbg.stop();
    std::vector<torch::Tensor> out{loss.detach()};
    for (auto& p : model->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const auto a = run(false), b = run(true);
  REQUIRE(a.size() == b.size());
  for (std::size_t k = 0; k < a.size(); ++k) CHECK(torch::equal(a[k], b[k]));
}

TEST_CASE(
    "two models run forward and backward on two threads at once: every entry complete and on its own model's shapes") {
  torch::manual_seed(6);
  struct TwoImpl : torch::nn::Module {
    TwoImpl() : a(register_module("a", torch::nn::Linear(8, 4))), b(register_module("b", torch::nn::Linear(6, 3))) {}
    torch::nn::Linear a, b;
  };
  auto two = std::make_shared<TwoImpl>();
  MemoryDebugger<tp::Level::Mix> dbg(memory_options());
  dbg.start(two);
  constexpr int kIters = 20;
  std::thread ta([&] {
    for (int i = 0; i < kIters; ++i) two->a(torch::randn({5, 8}, torch::requires_grad())).tanh().sum().backward();
  });
  std::thread tb([&] {
    for (int i = 0; i < kIters; ++i) two->b(torch::randn({7, 6}, torch::requires_grad())).sigmoid().sum().backward();
  });
  ta.join();
  tb.join();
  dbg.stop();
  auto files = dbg.sink().step(0);
  Json d = files.dump["data"];
  for (int i = 0; i < kIters; ++i) {
    const std::string n = std::to_string(i);
    CAPTURE(i);
    REQUIRE(d.contains("Module.a.Linear.forward." + n));
    REQUIRE(d.contains("Module.b.Linear.forward." + n));
    REQUIRE(d.contains("Module.a.Linear.backward." + n));
    REQUIRE(d.contains("Module.b.Linear.backward." + n));
    CHECK(d["Module.a.Linear.forward." + n]["input_args"][0]["shape"] == Json::parse("[5, 8]"));
    CHECK(d["Module.b.Linear.forward." + n]["input_args"][0]["shape"] == Json::parse("[7, 6]"));
    CHECK(d["Module.a.Linear.backward." + n]["output"][0]["shape"] == Json::parse("[5, 8]"));
    CHECK(d["Module.b.Linear.backward." + n]["output"][0]["shape"] == Json::parse("[7, 6]"));
    CHECK(d["Module.a.Linear.parameters_grad." + n]["weight"][0]["shape"] == Json::parse("[4, 8]"));
    CHECK(d["Module.b.Linear.parameters_grad." + n]["weight"][0]["shape"] == Json::parse("[3, 6]"));
  }
  // every API forward has its backward, and each API call's parent is a module of its own thread's model
  std::size_t forwards = 0, backwards = 0;
  for (const auto& kv : d.items()) {
    if (kv.key().rfind("Aten.", 0) != 0 || kv.key().rfind("Aten.randn", 0) == 0) continue;  // randn has no backward
    const bool fwd = kv.key().find(".forward") != std::string::npos;
    (fwd ? forwards : backwards)++;
    if (kv.key().rfind("Aten.tanh", 0) == 0 || kv.key().rfind("Aten.sigmoid", 0) == 0)
      CHECK(files.construct[kv.key()].is_null());
  }
  CHECK(forwards == backwards);
  for (const auto& kv : files.construct.items()) {
    if (kv.key().rfind("Aten.addmm", 0) != 0 || kv.key().find(".forward") == std::string::npos) continue;
    const std::string parent = kv.value();
    Json& in = d[kv.key()]["input_args"][1];
    CHECK(parent.find(in["shape"][1] == 8 ? "Module.a." : "Module.b.") == 0);
  }
}

TEST_CASE("ScopedModuleDump records only the named module, under the given name, and no API entries") {
  torch::manual_seed(7);
  Net net;
  MemoryDebugger<tp::Level::L1> dbg(memory_options());
  dbg.start();
  {
    tp::ScopedModuleDump only(net->fc, "fc_only");
    net->forward(torch::randn({2, 8}, torch::requires_grad())).sum().backward();
  }
  torch::ones({2}).neg();  // after the scope: API entries again
  dbg.stop();
  Json d = dbg.sink().step(0).dump["data"];
  CHECK(names_of(d) == std::vector<std::string>{"Module.fc_only.Linear.forward.0", "Module.fc_only.Linear.backward.0",
                                                "Aten.ones.0.forward", "Aten.neg.0.forward"});
  CHECK(d["Module.fc_only.Linear.forward.0"]["input_args"][0]["shape"] == Json::parse("[2, 8]"));
}

TEST_CASE("a guard outside a dump, or for a module not given to start(), does nothing") {
  torch::manual_seed(8);
  Block block;
  block->forward(torch::randn({2, 6}));  // no debugger started: inert
  Net net;
  MemoryDebugger<tp::Level::Mix> dbg(memory_options());
  dbg.start(net);
  block->forward(torch::randn({2, 6}));  // not part of net
  dbg.stop();
  for (const auto& n : names_of(dbg.sink().step(0).dump["data"])) CHECK(n.rfind("Module.", 0) != 0);
}

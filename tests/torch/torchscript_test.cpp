// TorchScript models beyond one Linear: a scripted Sequential called twice, nested modules, L1
// on a scripted model, the graph executor's optimisation flag, and lists of models.
#include <torch/torch.h>
#include <torch/script.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <set>

#include "test_support.hpp"

namespace tp = torchprobe;
using Json = nlohmann::ordered_json;

namespace {

template <tp::Level L>
using MemoryDebugger = tp::Debugger<L, tp::Task::Statistics, tp::MemorySink>;

tp::Options memory_options() { return tp::Options().dump_path("/tmp/torchprobe-memory-sink").extra_info(false); }

// net.pt: block(seq(seq(x))), with Block = norm(inner(x)) + x and Inner = tanh(fc(x));
// small.pt: relu(fc(x)). Scripted and saved by Python once per process.
struct ScriptFiles {
  tptest::TempDir dir;
  std::string net = dir / "net.pt", small = dir / "small.pt";
  ScriptFiles() {
    int rc = 0;
    const std::string out = tptest::run_python(
        "import torch\n"
        "torch.manual_seed(3)\n"
        "class Inner(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 4)\n"
        "    def forward(self, x):\n"
        "        return torch.tanh(self.fc(x))\n"
        "class Block(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.inner = Inner()\n"
        "        self.norm = torch.nn.LayerNorm(4)\n"
        "    def forward(self, x):\n"
        "        return self.norm(self.inner(x)) + x\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.seq = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))\n"
        "        self.block = Block()\n"
        "    def forward(self, x):\n"
        "        return self.block(self.seq(self.seq(x)))\n"
        "class Small(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 4)\n"
        "    def forward(self, x):\n"
        "        return torch.relu(self.fc(x))\n"
        "torch.jit.script(Net()).save('" +
            net +
            "')\n"
            "torch.jit.script(Small()).save('" +
            small + "')\n",
        &rc);
    REQUIRE_MESSAGE(rc == 0, out);
  }
};

const ScriptFiles& files() {
  static const ScriptFiles f;
  return f;
}

std::vector<std::string> names_of(const Json& data, const std::string& part = "") {
  std::vector<std::string> names;
  for (const auto& kv : data.items())
    if (kv.key().find(part) != std::string::npos) names.push_back(kv.key());
  return names;
}

using tptest::check_item_is;

// One step of net.pt under a Debugger of level L: its files, and the input it ran on.
template <tp::Level L>
std::pair<tp::MemorySink::Files, torch::Tensor> run_net(torch::jit::Module& net) {
  MemoryDebugger<L> dbg(memory_options());
  torch::manual_seed(17);
  const auto x = torch::randn({3, 4}, torch::requires_grad());
  {
    tp::ScopedDump scope(dbg, net);
    net.forward({x}).toTensor().sum().backward();
  }
  return {dbg.sink().step(0), x};
}

const std::vector<std::string> kForwardOrder = {
    "Module.seq.0.Linear.forward.0",          "Module.seq.1.ReLU.forward.0",
    "Module.seq.2.Linear.forward.0",          "Module.seq.Sequential.forward.0",
    "Module.seq.0.Linear.forward.1",          "Module.seq.1.ReLU.forward.1",
    "Module.seq.2.Linear.forward.1",          "Module.seq.Sequential.forward.1",
    "Module.block.inner.fc.Linear.forward.0", "Module.block.inner.Inner.forward.0",
    "Module.block.norm.LayerNorm.forward.0",  "Module.block.Block.forward.0"};

}  // namespace

TEST_CASE("a scripted Sequential called twice and nested scripted modules get msprobe's names, counters and values") {
  torch::jit::Module net = torch::jit::load(files().net);
  auto [f, x] = run_net<tp::Level::L0>(net);
  Json d = f.dump["data"];
  // Forward entries as msprobe orders them (a module's after those of its children); the
  // Sequential's second call and its children's count .1.
  CHECK(names_of(d, ".forward.") == kForwardOrder);
  std::set<std::string> backward;
  for (const auto& n : names_of(d, ".backward.")) backward.insert(n);
  std::set<std::string> expected_backward;
  for (const std::string& n : kForwardOrder)
    expected_backward.insert(n.substr(0, n.find(".forward.")) + ".backward" + n.substr(n.find(".forward.") + 8));
  CHECK(backward == expected_backward);
  for (const char* g :
       {"Module.seq.0.Linear.parameters_grad.0", "Module.seq.2.Linear.parameters_grad.0",
        "Module.block.inner.fc.Linear.parameters_grad.0", "Module.block.norm.LayerNorm.parameters_grad.0"})
    CHECK_MESSAGE(d.contains(g), g);

  // The values each call saw, recomputed without the probe by calling the submodules directly.
  torch::NoGradGuard no_grad;
  torch::jit::Module seq = net.attr("seq").toModule(), block = net.attr("block").toModule();
  const auto y1 = seq.forward({x}).toTensor(), y2 = seq.forward({y1}).toTensor();
  const auto inner = block.attr("inner").toModule().forward({y2}).toTensor();
  check_item_is(d["Module.seq.Sequential.forward.0"]["input_args"][0], x);
  check_item_is(d["Module.seq.Sequential.forward.0"]["output"][0], y1);
  check_item_is(d["Module.seq.Sequential.forward.1"]["input_args"][0], y1);
  check_item_is(d["Module.seq.Sequential.forward.1"]["output"][0], y2);
  check_item_is(d["Module.seq.0.Linear.forward.1"]["input_args"][0], y1);
  check_item_is(d["Module.block.inner.Inner.forward.0"]["output"][0], inner);
  check_item_is(d["Module.block.Block.forward.0"]["output"][0], block.forward({y2}).toTensor());
  check_item_is(d["Module.seq.2.Linear.forward.1"]["parameters"]["weight"],
                seq.attr("2").toModule().attr("weight").toTensor());
  check_item_is(d["Module.block.norm.LayerNorm.backward.0"]["input"][0], torch::ones({3, 4}));  // d(sum)/d(norm + x)
}

TEST_CASE("mix on a scripted model: construct.json puts each call in its own call of the enclosing module") {
  torch::jit::Module net = torch::jit::load(files().net);
  auto [f, x] = run_net<tp::Level::Mix>(net);
  Json& c = f.construct;
  CHECK(c["Module.seq.0.Linear.forward.0"] == "Module.seq.Sequential.forward.0");
  CHECK(c["Module.seq.0.Linear.forward.1"] == "Module.seq.Sequential.forward.1");
  CHECK(c["Module.seq.1.ReLU.forward.1"] == "Module.seq.Sequential.forward.1");
  CHECK(c["Module.seq.Sequential.forward.1"].is_null());
  CHECK(c["Module.block.inner.fc.Linear.forward.0"] == "Module.block.inner.Inner.forward.0");
  CHECK(c["Module.block.inner.Inner.forward.0"] == "Module.block.Block.forward.0");
  CHECK(c["Module.block.Block.forward.0"].is_null());
  CHECK(c["Aten.linear.2.forward"] == "Module.seq.0.Linear.forward.1");
  CHECK(c["Aten.relu.1.forward"] == "Module.seq.1.ReLU.forward.1");
  CHECK(c["Aten.tanh.0.forward"] == "Module.block.inner.Inner.forward.0");
  CHECK(c["Aten.add.0.forward"] == "Module.block.Block.forward.0");  // the residual, in Block's own graph
  CHECK(c["Aten.sum.0.forward"].is_null());
  CHECK(c["Aten.tanh.0.backward"] == "Module.block.inner.Inner.backward.0");
  CHECK(c["Module.seq.0.Linear.backward.1"] == "Module.seq.Sequential.backward.1");
}

TEST_CASE("L1 on a scripted model records the ATen calls TorchScript makes, forward and backward, in every step") {
  torch::jit::Module net = torch::jit::load(files().net);
  MemoryDebugger<tp::Level::L1> dbg(memory_options());
  torch::manual_seed(19);
  for (int s = 0; s < 3; ++s) {  // the profiling executor would optimise the graph from the second run on
    const auto x = torch::randn({3, 4}, torch::requires_grad());
    {
      tp::ScopedDump scope(dbg, net);
      net.forward({x}).toTensor().sum().backward();
    }
    dbg.step();
    CAPTURE(s);
    Json d = dbg.sink().step(s).dump["data"];
    CHECK(names_of(d, ".forward") ==
          std::vector<std::string>{"Aten.linear.0.forward", "Aten.relu.0.forward", "Aten.linear.1.forward",
                                   "Aten.linear.2.forward", "Aten.relu.1.forward", "Aten.linear.3.forward",
                                   "Aten.linear.4.forward", "Aten.tanh.0.forward", "Aten.layer_norm.0.forward",
                                   "Aten.add.0.forward", "Aten.sum.0.forward"});
    CHECK(names_of(d, "Module.").empty());
    for (const std::string n :
         {"sum.0", "add.0", "layer_norm.0", "tanh.0", "linear.4", "linear.3", "relu.1", "linear.0"})
      CHECK_MESSAGE(d.contains("Aten." + n + ".backward"), n);
    check_item_is(d["Aten.linear.0.forward"]["input_args"][0], x);
    check_item_is(d["Aten.linear.0.backward"]["output"][0], x.grad());
  }
}

TEST_CASE(
    "the graph executor's optimisation is off while a TorchScript model is dumped, and as it was before after stop()") {
  const bool original = torch::jit::getGraphExecutorOptimize();
  for (const bool before : {true, false}) {
    CAPTURE(before);
    torch::jit::Module net = torch::jit::load(files().small);
    torch::jit::setGraphExecutorOptimize(before);
    auto check_level = [&](tp::DebuggerInterface& dbg) {
      dbg.start_with(tp::to_model_ref(net), std::nullopt);
      CHECK_FALSE(torch::jit::getGraphExecutorOptimize());
      net.forward({torch::randn({2, 4}, torch::requires_grad())}).toTensor().sum().backward();
      dbg.step();  // stops and starts again: still off
      CHECK(dbg.running());
      CHECK_FALSE(torch::jit::getGraphExecutorOptimize());
      dbg.stop();
      CHECK(torch::jit::getGraphExecutorOptimize() == before);
      dbg.stop();  // a second stop() changes nothing
      CHECK(torch::jit::getGraphExecutorOptimize() == before);
    };
    MemoryDebugger<tp::Level::L0> l0(memory_options());
    MemoryDebugger<tp::Level::Mix> mix(memory_options());
    MemoryDebugger<tp::Level::L1> l1(memory_options());
    check_level(l0);
    check_level(mix);
    check_level(l1);
    // A dump without a TorchScript model leaves the flag alone.
    tptest::Net plain;
    l0.start(plain);
    CHECK(torch::jit::getGraphExecutorOptimize() == before);
    l0.stop();
  }
  torch::jit::setGraphExecutorOptimize(original);
}

TEST_CASE("start() with a std::vector of models names each model's modules Module.{index}.{path}") {
  SUBCASE("TorchScript models") {
    std::vector<torch::jit::Module> models{torch::jit::load(files().small), torch::jit::load(files().small)};
    MemoryDebugger<tp::Level::L0> dbg(memory_options());
    dbg.start(models);
    const auto x = torch::randn({2, 4}, torch::requires_grad());
    models[1].forward({x}).toTensor().sum().backward();
    models[0].forward({x}).toTensor().sum().backward();
    models[1].forward({x});
    dbg.stop();
    CHECK(names_of(dbg.sink().step(0).dump["data"], ".forward.") ==
          std::vector<std::string>{"Module.1.fc.Linear.forward.0", "Module.0.fc.Linear.forward.0",
                                   "Module.1.fc.Linear.forward.1"});
    CHECK(dbg.sink().step(0).dump["data"].contains("Module.0.fc.Linear.backward.0"));
    CHECK(dbg.sink().step(0).dump["data"].contains("Module.1.fc.Linear.parameters_grad.0"));
  }
  SUBCASE("torch::nn models") {
    std::vector<tptest::Net> models{tptest::Net(), tptest::Net()};
    MemoryDebugger<tp::Level::L0> dbg(memory_options());
    dbg.start(models);
    const auto x = torch::randn({2, 8}, torch::requires_grad());
    models[1]->forward(x).sum().backward();
    models[0]->forward(x);
    dbg.stop();
    CHECK(names_of(dbg.sink().step(0).dump["data"], ".forward.") ==
          std::vector<std::string>{"Module.1.fc.Linear.forward.0", "Module.0.fc.Linear.forward.0"});
  }
}

// A module's backward entry holds the whole gradient autograd computes for its input: every use
// inside the module summed (a residual block's input feeds conv1 and the skip), uses outside it
// not counted. Each case is checked against torch::autograd::grad on a second, un-probed run of the
// same model, whose module calls are taped: grad({module output}, {module input}, {gradient that
// reached the output}) is exactly "the uses inside the module".
#include <torch/torch.h>
#include <torch/script.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace tp = torchprobe;
using Json = nlohmann::ordered_json;

namespace {

// The module calls of the un-probed reference run, in call order: input and output of each.
struct Tape {
  bool on = false;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> calls;
  torch::Tensor keep(const torch::Tensor& in, const torch::Tensor& out) {
    if (on) {
      out.retain_grad();
      calls.emplace_back(in, out);
    }
    return out;
  }
};

// out = relu(bn2(conv2(relu(bn1(conv1(x)))))) + x: torchvision's BasicBlock, its input used twice.
struct ResidualImpl : torch::nn::Module {
  ResidualImpl(int c, Tape& t)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 3).padding(1).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(c))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(c))),
        tape(t) {}
  torch::Tensor forward(const torch::Tensor& x) {
    tp::ModuleGuard guard(this, x);
    const torch::Tensor out = torch::relu(bn2(conv2(torch::relu(bn1(conv1(x)))))) + x;
    return guard.output(tape.keep(x, out));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  Tape& tape;
};
TORCH_MODULE(Residual);

// The same block with in-place ops on its path: relu_ on conv1's result, `out += x` for the skip.
struct InplaceResidualImpl : torch::nn::Module {
  InplaceResidualImpl(int c, Tape& t)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, c, 3).padding(1)))),
        tape(t) {}
  torch::Tensor forward(const torch::Tensor& x) {
    tp::ModuleGuard guard(this, x);
    torch::Tensor h = conv1(x);
    h.relu_();
    torch::Tensor out = conv2(h);
    out += x;
    return guard.output(tape.keep(x, out));
  }
  torch::nn::Conv2d conv1, conv2;
  Tape& tape;
};
TORCH_MODULE(InplaceResidual);

// Its input used three times: fc1(x) + fc2(x) * x.
struct ThreeUsesImpl : torch::nn::Module {
  ThreeUsesImpl(int n, Tape& t)
      : fc1(register_module("fc1", torch::nn::Linear(n, n))),
        fc2(register_module("fc2", torch::nn::Linear(n, n))),
        tape(t) {}
  torch::Tensor forward(const torch::Tensor& x) {
    tp::ModuleGuard guard(this, x);
    const torch::Tensor out = fc1(x) + fc2(x) * x;
    return guard.output(tape.keep(x, out));
  }
  torch::nn::Linear fc1, fc2;
  Tape& tape;
};
TORCH_MODULE(ThreeUses);

enum class Case { residual, residual_inplace, three_uses, inside_and_outside, called_twice };

// stem (a Conv2d or Linear the probe finds by its parameters) -> the case's block(s) -> a loss
// weighted by fixed random numbers, so that no gradient is uniform.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(Case c) : kind(c) {
    torch::manual_seed(11);
    const bool conv = c == Case::residual || c == Case::residual_inplace || c == Case::called_twice;
    if (conv) {
      stem = register_module("stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 4, 3).padding(1)));
      if (c == Case::residual_inplace)
        inplace = register_module("block", InplaceResidual(4, tape));
      else
        residual = register_module("block", Residual(4, tape));
    } else {
      fc = register_module("stem", torch::nn::Linear(6, 6));
      three = register_module("block", ThreeUses(6, tape));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    switch (kind) {
      case Case::residual: return residual(stem(x));
      case Case::residual_inplace: return inplace(stem(x));
      case Case::called_twice: return residual(residual(stem(x)));
      case Case::three_uses: return three(fc(x));
      case Case::inside_and_outside: {
        const torch::Tensor h = fc(x);
        return three(h) + h * 3;  // h's use outside the block is not the block's gradient
      }
    }
    return {};
  }
  Case kind;
  Tape tape;
  torch::nn::Conv2d stem{nullptr};
  torch::nn::Linear fc{nullptr};
  Residual residual{nullptr};
  InplaceResidual inplace{nullptr};
  ThreeUses three{nullptr};
};
TORCH_MODULE(Net);

torch::Tensor input_for(Case c) {
  torch::manual_seed(5);
  const bool conv = c == Case::residual || c == Case::residual_inplace || c == Case::called_twice;
  return conv ? torch::randn({3, 2, 6, 6}) : torch::randn({5, 6});
}

torch::Tensor loss_of(const torch::Tensor& out) {
  torch::manual_seed(9);
  return (out * torch::randn(out.sizes())).sum();
}

// ATen's statistics of a reference gradient, in float64.
struct Stats {
  double max, min, mean, norm;
};
Stats stats_of(const torch::Tensor& g) {
  const torch::Tensor d = g.to(torch::kDouble);
  return {d.max().item<double>(), d.min().item<double>(), d.mean().item<double>(), d.norm().item<double>()};
}

void check_item(const Json& item, const Stats& ref) {
  CAPTURE(item.dump());
  REQUIRE(item.is_object());
  // Max and Min are elements of the tensor: equal when the tensors are; Mean and Norm are ours in
  // float64 against ATen's in float64 of the same float32 elements.
  CHECK(item["Max"].get<double>() == ref.max);
  CHECK(item["Min"].get<double>() == ref.min);
  CHECK(item["Mean"].get<double>() == doctest::Approx(ref.mean).epsilon(1e-9));
  CHECK(item["Norm"].get<double>() == doctest::Approx(ref.norm).epsilon(1e-9));
}

// The probed run (Mix, statistics, every entry in memory) and the reference run of the same model.
struct Runs {
  Json data;
  std::vector<torch::Tensor> block_input_grads;  // per block call, uses inside the block only
  std::vector<torch::Tensor> block_output_grads;
  torch::Tensor x_grad;  // the model input's whole gradient (the stem's input gradient)
};

Runs run_case(Case c) {
  Runs r;
  {
    Net net(c);
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics, tp::MemorySink> dbg(
        tp::Options().dump_path("/tmp/torchprobe-memory-sink").extra_info(false));
    const torch::Tensor x = input_for(c).requires_grad_(true);
    dbg.start(net);
    loss_of(net->forward(x)).backward();
    dbg.stop();
    r.data = dbg.sink().step(0).dump["data"];
  }
  Net net(c);
  net->tape.on = true;
  const torch::Tensor x = input_for(c).requires_grad_(true);
  loss_of(net->forward(x)).backward({}, /*retain_graph=*/true);
  r.x_grad = x.grad().clone();
  // Every output gradient is read before any autograd::grad: retain_grad's hooks fire there too.
  for (const auto& call : net->tape.calls) r.block_output_grads.push_back(call.second.grad().clone());
  for (std::size_t n = 0; n < net->tape.calls.size(); ++n) {
    const auto& [in, out] = net->tape.calls[n];
    r.block_input_grads.push_back(torch::autograd::grad({out}, {in}, {r.block_output_grads[n]},
                                                        /*retain_graph=*/true, /*create_graph=*/false)[0]);
  }
  return r;
}

void check_blocks(const Runs& r, const std::string& entry_prefix) {
  REQUIRE(!r.block_input_grads.empty());
  for (std::size_t n = 0; n < r.block_input_grads.size(); ++n) {
    const std::string name = entry_prefix + ".backward." + std::to_string(n);
    CAPTURE(name);
    REQUIRE(r.data.contains(name));
    const Json& entry = r.data[name];
    REQUIRE(entry["input"].size() == 1);
    REQUIRE(entry["output"].size() == 1);
    check_item(entry["input"][0], stats_of(r.block_output_grads[n]));
    check_item(entry["output"][0], stats_of(r.block_input_grads[n]));
  }
}

}  // namespace

TEST_CASE("a residual block's backward entry holds its input's whole gradient: conv1's branch and the skip") {
  const tptest::ReferenceKernels kernels;  // not oneDNN 3.7's convolutions (wrong, even NaN, on some CPUs)
  const Runs r = run_case(Case::residual);
  check_blocks(r, "Module.block.Residual");
  // The block's input is used by nothing else, so its gradient is also autograd's dL/d(stem output),
  // what the stem's own backward entry lists as the gradient of its output.
  check_item(r.data["Module.stem.Conv2d.backward.0"]["input"][0], stats_of(r.block_input_grads[0]));
  check_item(r.data["Module.stem.Conv2d.backward.0"]["output"][0], stats_of(r.x_grad));
}

TEST_CASE("in-place ops on a block's path (relu_, out += x) leave its input gradient whole") {
  const tptest::ReferenceKernels kernels;  // not oneDNN 3.7's convolutions (wrong, even NaN, on some CPUs)
  const Runs r = run_case(Case::residual_inplace);
  check_blocks(r, "Module.block.InplaceResidual");
}

TEST_CASE("an input used three times inside a module: the three contributions summed as autograd sums them") {
  const tptest::ReferenceKernels kernels;  // not oneDNN 3.7's convolutions (wrong, even NaN, on some CPUs)
  const Runs r = run_case(Case::three_uses);
  check_blocks(r, "Module.block.ThreeUses");
}

TEST_CASE("an input used inside and outside a module: only the uses inside count towards its entry") {
  const tptest::ReferenceKernels kernels;  // not oneDNN 3.7's convolutions (wrong, even NaN, on some CPUs)
  const Runs r = run_case(Case::inside_and_outside);
  check_blocks(r, "Module.block.ThreeUses");
  // The stem's output gradient is the whole one (block + the `h * 3` outside): not the block's.
  const Json& stem = r.data["Module.stem.Linear.backward.0"];
  CHECK(stem["input"][0]["Norm"].get<double>() != doctest::Approx(stats_of(r.block_input_grads[0]).norm));
}

TEST_CASE("a module called twice in one step: each call's entry has its own call's gradients") {
  const tptest::ReferenceKernels kernels;  // not oneDNN 3.7's convolutions (wrong, even NaN, on some CPUs)
  const Runs r = run_case(Case::called_twice);
  REQUIRE(r.block_input_grads.size() == 2);
  check_blocks(r, "Module.block.Residual");
}

// TorchScript: the same rule for the probes torchscript.hpp puts around submodule calls, and
// modules reached through helper methods (torchvision's forward -> _forward_impl).
namespace {

struct ScriptedModels {
  tptest::TempDir dir;
  std::string residual = dir / "residual.pt", helpers = dir / "helpers.pt", input = dir / "x.pt",
              reference = dir / "reference.json";
};

// residual.pt: stem conv -> Block (conv/bn/relu_ and `out += x`) called twice -> sum. The Python side
// also computes, with autograd, each Block call's gradients (uses inside it only) and writes their
// statistics in float64 to reference.json.
const ScriptedModels& scripted() {
  static ScriptedModels m;
  static const bool made = [] {
    int rc = 0;
    const std::string out = tptest::run_python(
        "import torch, json\n"
        "import torch.nn as nn\n"
        "torch.set_num_threads(1)  # the C++ side's kernels: tptest::ReferenceKernels\n"
        "if int(torch.__version__.split('.')[0]) >= 2: torch.backends.mkldnn.enabled = False\n"
        "torch.manual_seed(4)\n"
        "class Block(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.conv1 = nn.Conv2d(3, 3, 3, padding=1, bias=False)\n"
        "        self.bn1 = nn.BatchNorm2d(3)\n"
        "        self.conv2 = nn.Conv2d(3, 3, 3, padding=1)\n"
        "    def forward(self, x):\n"
        "        out = self.bn1(self.conv1(x))\n"
        "        out.relu_()\n"
        "        out = self.conv2(out)\n"
        "        out += x\n"
        "        return out\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.stem = nn.Conv2d(2, 3, 3, padding=1)\n"
        "        self.block = Block()\n"
        "    def forward(self, x):\n"
        "        return self.block(self.block(self.stem(x)))\n"
        "class Helpers(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc1 = nn.Linear(4, 4)\n"
        "        self.act = nn.Tanh()\n"
        "        self.fc2 = nn.Linear(4, 4)\n"
        "        self.head = nn.Linear(4, 2)\n"
        "    def forward(self, x):\n"
        "        return self._forward_impl(x)\n"
        "    def _forward_impl(self, x):\n"
        "        return self.head(self._body(x) + self.act(x))\n"
        "    def _body(self, x):\n"
        "        return self.fc2(self.act(self.fc1(x)))\n"
        "net = Net().train()\n"
        "torch.jit.script(net).save('" +
            m.residual +
            "')\n"
            "torch.jit.script(Helpers()).save('" +
            m.helpers +
            "')\n"
            "torch.manual_seed(5)\n"
            "x = torch.randn(2, 2, 5, 5)\n"
            "torch.save(x, '" +
            m.input +
            "')\n"
            "taped = []\n"
            "def tape(mod, inp, out):\n"
            "    out.retain_grad()\n"
            "    taped.append((inp[0], out))\n"
            "net.block.register_forward_hook(tape)\n"
            "torch.manual_seed(9)\n"
            "w = None\n"
            "xr = x.clone().requires_grad_(True)\n"
            "y = net(xr)\n"
            "w = torch.randn(y.shape)\n"
            "(y * w).sum().backward(retain_graph=True)\n"
            "def stats(g):\n"
            "    d = g.double()\n"
            "    return [d.max().item(), d.min().item(), d.mean().item(), d.norm().item()]\n"
            "ref = {'w': w.flatten().tolist()}\n"
            "# every output gradient is read before any autograd.grad: their retain_grad hooks fire there too\n"
            "gos = [o.grad.clone() for _, o in taped]\n"
            "for n, ((i, o), go) in enumerate(zip(taped, gos)):\n"
            "    gi, = torch.autograd.grad([o], [i], [go], retain_graph=True)\n"
            "    ref['Module.block.Block.backward.%d' % n] = {'input': stats(go), 'output': stats(gi)}\n"
            "json.dump(ref, open('" +
            m.reference + "', 'w'))\n",
        &rc);
    INFO(out);
    REQUIRE(rc == 0);
    return true;
  }();
  (void)made;
  return m;
}

}  // namespace

TEST_CASE("TorchScript: a scripted block with a skip and in-place ops, called twice, has autograd's gradients") {
  const tptest::ReferenceKernels kernels;  // not oneDNN 3.7's convolutions (wrong, even NaN, on some CPUs)
  const ScriptedModels& m = scripted();
  const Json ref = tptest::read_json(m.reference);
  torch::jit::Module net = torch::jit::load(m.residual);
  torch::Tensor x;
  {
    std::ifstream in(m.input, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    x = torch::pickle_load(bytes).toTensor();
  }
  const torch::Tensor w = torch::tensor(ref["w"].get<std::vector<float>>());
  tp::Debugger<tp::Level::Mix, tp::Task::Statistics, tp::MemorySink> dbg(
      tp::Options().dump_path("/tmp/torchprobe-memory-sink").extra_info(false));
  x.requires_grad_(true);
  dbg.start(net);
  const torch::Tensor y = net.forward({x}).toTensor();
  (y * w.view(y.sizes())).sum().backward();
  dbg.stop();
  const Json data = dbg.sink().step(0).dump["data"];
  for (const char* name : {"Module.block.Block.backward.0", "Module.block.Block.backward.1"}) {
    CAPTURE(name);
    REQUIRE(data.contains(name));
    for (const char* side : {"input", "output"}) {
      CAPTURE(side);
      const auto s = ref[name][side].get<std::vector<double>>();
      REQUIRE(data[name][side].size() == 1);
      // Python's eager run and this scripted one are different executions of the same kernels:
      // equal to float32 rounding, not necessarily to the bit.
      const Json& item = data[name][side][0];
      CHECK(item["Max"].get<double>() == doctest::Approx(s[0]).epsilon(1e-6));
      CHECK(item["Min"].get<double>() == doctest::Approx(s[1]).epsilon(1e-6));
      CHECK(item["Mean"].get<double>() == doctest::Approx(s[2]).epsilon(1e-5));
      CHECK(item["Norm"].get<double>() == doctest::Approx(s[3]).epsilon(1e-6));
    }
  }
}

TEST_CASE("TorchScript: modules called from helper methods (forward -> _forward_impl -> _body) are all dumped") {
  const tptest::ReferenceKernels kernels;  // not oneDNN 3.7's convolutions (wrong, even NaN, on some CPUs)
  const ScriptedModels& m = scripted();
  torch::jit::Module net = torch::jit::load(m.helpers);
  tp::Debugger<tp::Level::L0, tp::Task::Statistics, tp::MemorySink> dbg(
      tp::Options().dump_path("/tmp/torchprobe-memory-sink").extra_info(false));
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({3, 4}, torch::requires_grad());
  dbg.start(net);
  net.forward({x}).toTensor().sum().backward();
  dbg.stop();
  std::vector<std::string> names;
  for (const auto& kv : dbg.sink().step(0).dump["data"].items()) names.push_back(kv.key());
  // act is called from two methods: _body (forward.0) and _forward_impl (forward.1), in that order.
  const std::vector<std::string> forwards = {"Module.fc1.Linear.forward.0", "Module.act.Tanh.forward.0",
                                             "Module.fc2.Linear.forward.0", "Module.act.Tanh.forward.1",
                                             "Module.head.Linear.forward.0"};
  std::vector<std::string> got_forwards;
  for (const std::string& n : names)
    if (n.find(".forward.") != std::string::npos) got_forwards.push_back(n);
  CHECK(got_forwards == forwards);
  for (const char* b : {"Module.fc1.Linear.backward.0", "Module.act.Tanh.backward.0", "Module.act.Tanh.backward.1",
                        "Module.fc2.Linear.backward.0", "Module.head.Linear.backward.0"}) {
    CAPTURE(b);
    CHECK(std::find(names.begin(), names.end(), b) != names.end());
  }
}

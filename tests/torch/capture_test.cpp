// L1 capture: which ATen calls become entries, how they are named and counted, how their
// arguments are encoded, and that capturing changes nothing in the user's computation.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <set>
#include <thread>

#include "test_support.hpp"

namespace tp = torchprobe;
using Json = nlohmann::ordered_json;
using MemoryDebugger = tp::Debugger<tp::Level::L1, tp::Task::Statistics, tp::MemorySink>;

namespace {

using tptest::Net;

std::vector<std::string> names_of(const Json& dump) {
  std::vector<std::string> names;
  for (const auto& kv : dump.at("data").items()) names.push_back(kv.key());
  return names;
}

tp::Options memory_options() { return tp::Options().dump_path("/tmp/torchprobe-memory-sink").extra_info(false); }

}  // namespace

TEST_CASE("a Linear + relu step records t, addmm, relu and sum, counted per API and reset by step()") {
  torch::manual_seed(1234);
  Net net;
  MemoryDebugger dbg(memory_options().data_mode({"forward"}));
  const auto x = torch::randn({2, 8}, torch::requires_grad());
  for (int step = 0; step < 2; ++step) {
    {
      tp::ScopedDump scope(dbg, net);
      net->forward(x).sum().backward();
      net->forward(x);  // a second forward in the same step: counters go on to 1
    }
    dbg.step();
  }
  const auto steps = dbg.sink().steps();
  REQUIRE(steps.size() == 2);
  for (const auto& kv : steps) {
    CHECK(names_of(kv.second.dump) == std::vector<std::string>{"Aten.t.0.forward", "Aten.addmm.0.forward",
                                                               "Aten.relu.0.forward", "Aten.sum.0.forward",
                                                               "Aten.t.1.forward", "Aten.addmm.1.forward",
                                                               "Aten.relu.1.forward"});
    CHECK(kv.second.dump["task"] == "statistics");
    CHECK(kv.second.dump["level"] == "L1");
  }
}

TEST_CASE("positional arguments go to input_args and keyword-only ones to input_kwargs, typed as msprobe types them") {
  MemoryDebugger dbg(memory_options());
  const auto x = torch::ones({2, 3});
  dbg.start();
  x.add(x, 0.5);                                    // add.Tensor(self, other, *, alpha)
  x.to(at::kHalf);                                  // to.dtype(self, dtype, non_blocking, copy, memory_format)
  x.sum(at::IntArrayRef{0, 1}, /*keepdim=*/false);  // sum.dim_IntList(self, dim, keepdim, *, dtype)
  torch::full({2}, 1.5, torch::dtype(torch::kFloat64));
  x.t().contiguous(at::MemoryFormat::Contiguous);  // an already contiguous tensor would not call the op
  dbg.stop();
  const Json d = dbg.sink().step(0).dump["data"];
  for (const char* name : {"Aten.add.0.forward", "Aten.to.0.forward", "Aten.sum.0.forward", "Aten.full.0.forward",
                           "Aten.contiguous.0.forward"})
    REQUIRE(d.contains(name));

  const Json& add = d["Aten.add.0.forward"];
  CHECK(add["input_args"].size() == 2);
  CHECK(add["input_kwargs"]["alpha"] == Json::parse(R"({"type": "float", "value": 0.5})"));
  CHECK(add["output"][0]["Max"] == 1.5);

  const Json& to = d["Aten.to.0.forward"];
  CHECK(to["input_args"][1] == Json::parse(R"({"type": "torch.dtype", "value": "torch.float16"})"));
  CHECK(to["input_args"][2] == Json::parse(R"({"type": "bool", "value": false})"));
  CHECK(to["input_args"][4].is_null());  // ATen's to.dtype has no keyword-only argument
  CHECK(to["input_kwargs"] == Json::object());
  CHECK(to["output"][0]["dtype"] == "torch.float16");

  const Json& sum = d["Aten.sum.0.forward"];
  CHECK(sum["input_args"][1] == Json::parse(R"([{"type": "int", "value": 0}, {"type": "int", "value": 1}])"));
  CHECK(sum["input_kwargs"] == Json::parse(R"({"dtype": null})"));
  CHECK(sum["output"][0]["shape"] == Json::array());
  CHECK(sum["output"][0]["Norm"] == 6.0);  // 0-d: the value itself

  const Json& full = d["Aten.full.0.forward"];
  CHECK(full["input_args"][0] == Json::parse(R"([{"type": "int", "value": 2}])"));
  CHECK(full["input_args"][1] == Json::parse(R"({"type": "float", "value": 1.5})"));
  CHECK(full["input_kwargs"]["dtype"] == Json::parse(R"({"type": "torch.dtype", "value": "torch.float64"})"));
  CHECK(full["input_kwargs"]["layout"].is_null());
  CHECK(full["input_kwargs"]["device"].is_null());

  const Json& cont = d["Aten.contiguous.0.forward"];
  CHECK(cont["input_kwargs"]["memory_format"] ==
        Json::parse(R"({"type": "torch.memory_format", "format": "contiguous_format"})"));
}

TEST_CASE("tensor items carry type, dtype, shape, the four statistics and requires_grad, in that order") {
  MemoryDebugger dbg(memory_options());
  const auto w = torch::tensor({{1.0f, -2.0f}, {3.0f, 4.0f}}, torch::requires_grad());
  dbg.start();
  w.relu();
  dbg.stop();
  const Json item = dbg.sink().step(0).dump["data"]["Aten.relu.0.forward"]["input_args"][0];
  std::vector<std::string> keys;
  for (const auto& kv : item.items()) keys.push_back(kv.key());
  CHECK(keys == std::vector<std::string>{"type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad"});
  CHECK(item["type"] == "torch.Tensor");
  CHECK(item["dtype"] == "torch.float32");
  CHECK(item["shape"] == Json::parse("[2, 2]"));
  CHECK(item["Max"] == 4.0);
  CHECK(item["Min"] == -2.0);
  CHECK(item["Mean"] == 1.5);
  CHECK(item["Norm"].get<double>() == doctest::Approx(std::sqrt(30.0)));
  CHECK(item["requires_grad"] == true);
}

TEST_CASE("only outermost calls are recorded: ops nested in an op, in backward, and the probe's own are not") {
  MemoryDebugger dbg(memory_options().data_mode({"forward"}));
  dbg.task().force_device_path(true);  // the probe then runs ATen reductions of its own
  auto a = torch::randn({3, 4}, torch::requires_grad());
  auto b = torch::randn({4, 5});
  dbg.start();
  auto y = torch::addmm(torch::zeros({5}), a, b);  // addmm expands its bias and copies internally
  y.t().contiguous().sum().backward();             // backward runs mm, t, ... inside autograd nodes
  a.detach();                                      // infrastructure op: not a user API
  dbg.stop();
  const auto names = names_of(dbg.sink().step(0).dump);
  CHECK(names == std::vector<std::string>{"Aten.zeros.0.forward", "Aten.addmm.0.forward", "Aten.t.0.forward",
                                          "Aten.contiguous.0.forward", "Aten.sum.0.forward"});
  // The forced device path resolved every placeholder at flush.
  CHECK(dbg.sink().step(0).dump["data"]["Aten.addmm.0.forward"]["output"][0]["Max"].is_number());
}

TEST_CASE("with the probe on, losses and gradients are bit-identical to a run without it") {
  auto run = [](bool probed) {
    torch::manual_seed(42);
    torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::Functional(torch::tanh),
                                torch::nn::Linear(32, 3));
    torch::optim::SGD opt(model->parameters(), 0.1);
    MemoryDebugger dbg(memory_options());
    std::vector<torch::Tensor> out;
    for (int it = 0; it < 3; ++it) {
      opt.zero_grad();
      auto x = torch::randn({8, 16}).to(at::kFloat);
      if (probed) dbg.start(model);
      auto loss = torch::log_softmax(model->forward(x), 1).mean();
      loss.backward();
      if (probed) dbg.stop();
      out.push_back(loss.detach().clone());
      for (auto& p : model->parameters()) out.push_back(p.grad().clone());
      opt.step();
      if (probed) dbg.step();
    }
    return out;
  };
  const auto plain = run(false);
  const auto probed = run(true);
  REQUIRE(plain.size() == probed.size());
  for (std::size_t k = 0; k < plain.size(); ++k) CHECK(torch::equal(plain[k], probed[k]));
}

TEST_CASE("calls from several threads at once are all recorded, each with its own number") {
  MemoryDebugger dbg(memory_options());
  dbg.start();
  constexpr int kThreads = 4, kCalls = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([] {
      auto x = torch::randn({16});
      for (int k = 0; k < kCalls; ++k) x = x.sigmoid();
    });
  for (auto& th : threads) th.join();
  dbg.stop();
  const Json d = dbg.sink().step(0).dump["data"];
  std::set<std::string> names;
  for (const auto& kv : d.items()) names.insert(kv.key());
  CHECK(names.count("Aten.sigmoid.0.forward") == 1);
  CHECK(names.count("Aten.sigmoid." + std::to_string(kThreads * kCalls - 1) + ".forward") == 1);
  CHECK(names.count("Aten.randn." + std::to_string(kThreads - 1) + ".forward") == 1);
  CHECK(d.size() == std::size_t(kThreads * kCalls + kThreads));
  for (const auto& kv : d.items()) CHECK(kv.value().contains("output"));
}

TEST_CASE("an op that throws leaves a record without output and the capture goes on") {
  MemoryDebugger dbg(memory_options());
  dbg.start();
  CHECK_THROWS(torch::mm(torch::ones({2, 3}), torch::ones({2, 3})));
  torch::ones({2}).neg();
  dbg.stop();
  const Json d = dbg.sink().step(0).dump["data"];
  CHECK(d.contains("Aten.mm.0.forward"));
  CHECK(d["Aten.mm.0.forward"]["input_args"].size() == 2);
  CHECK(d.contains("Aten.neg.0.forward"));
}

TEST_CASE("a debugger that is not started registers no callback at all") {
  MemoryDebugger dbg(memory_options());
  CHECK_FALSE(at::hasCallbacks());
  dbg.start();
  CHECK(at::hasGlobalCallbacks());
  dbg.stop();
  CHECK_FALSE(at::hasCallbacks());
}

TEST_CASE("two debuggers cannot capture at the same time") {
  MemoryDebugger a(memory_options());
  MemoryDebugger b(memory_options());
  a.start();
  CHECK_THROWS_WITH_AS(b.start(), doctest::Contains("already started"), std::logic_error);
  a.stop();
  b.start();
  CHECK(b.running());
  b.stop();
}

// A custom operator (TORCH_LIBRARY), composite: its body runs ATen ops and autograd goes through them.
TORCH_LIBRARY(tpcapture, m) { m.def("scale2(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(tpcapture, CompositeImplicitAutograd, m) {
  m.impl("scale2", [](const at::Tensor& x) { return x * 2; });
}

TEST_CASE(
    "a custom operator is an API of its namespace (tpcapture::scale2 -> Tpcapture.scale2.0) hiding its ATen ops") {
  MemoryDebugger dbg(memory_options());
  const auto scale2 =
      c10::Dispatcher::singleton().findSchemaOrThrow("tpcapture::scale2", "").typed<at::Tensor(const at::Tensor&)>();
  const auto x = torch::tensor({1.0f, 2.0f, 3.0f}, torch::requires_grad());
  dbg.start();
  scale2.call(x).sum().backward();
  dbg.stop();
  const Json& dump = dbg.sink().step(0).dump;
  const std::vector<std::string> names = names_of(dump);
  CHECK(std::find(names.begin(), names.end(), "Aten.mul.0.forward") == names.end());
  REQUIRE(std::find(names.begin(), names.end(), "Tpcapture.scale2.0.forward") != names.end());
  const Json& fwd = dump["data"]["Tpcapture.scale2.0.forward"];
  CHECK(fwd["input_args"][0]["Max"] == 3.0);
  CHECK(fwd["output"][0]["Max"] == 6.0);
  CHECK(fwd["output"][0]["Min"] == 2.0);
  // Its backward: the gradient that reaches x is 2 everywhere.
  REQUIRE(std::find(names.begin(), names.end(), "Tpcapture.scale2.0.backward") != names.end());
  const Json& bwd = dump["data"]["Tpcapture.scale2.0.backward"];
  CHECK(bwd["input"][0]["Max"] == 1.0);
  CHECK(bwd["output"][0]["Max"] == 2.0);
  CHECK(bwd["output"][0]["Min"] == 2.0);
}

TEST_CASE("TORCHPROBE_API makes a function one entry with its ATen calls hidden; restore_custom_api undoes it") {
  auto block =
      TORCHPROBE_API("TpNet", block, [](const at::Tensor& x, const at::Tensor& w) { return at::relu(x.matmul(w)); });
  torch::manual_seed(3);
  const auto x = torch::randn({4, 3}, torch::requires_grad());
  const auto w = torch::randn({3, 2});
  MemoryDebugger dbg(memory_options());
  dbg.start();
  const at::Tensor y = block(x, w);
  y.sum().backward();
  CHECK(tp::restore_custom_api("TpNet", "block"));
  block(x, w);  // a plain call now: matmul and relu are entries of their own
  dbg.stop();
  CHECK(y.equal(at::relu(x.matmul(w))));  // the same kernels: bit-identical
  const Json& dump = dbg.sink().step(0).dump;
  std::vector<std::string> forward;
  for (const std::string& n : names_of(dump))
    if (n.size() > 8 && n.compare(n.size() - 8, 8, ".forward") == 0) forward.push_back(n);
  CHECK(forward == std::vector<std::string>{"TpNet.block.0.forward", "Aten.sum.0.forward", "Aten.matmul.0.forward",
                                            "Aten.relu.0.forward"});
  const Json& entry = dump["data"]["TpNet.block.0.forward"];
  CHECK(entry["input_args"].size() == 2);
  CHECK(entry["output"][0]["Max"] == y.to(at::kDouble).max().item<double>());
  // Backward: the gradient that reaches x, as autograd computes it (relu' * ones @ w^T).
  REQUIRE(dump["data"].contains("TpNet.block.0.backward"));
  CHECK(dump["data"]["TpNet.block.0.backward"]["output"][0]["Max"] == x.grad().max().item<double>());
  CHECK_FALSE(tp::restore_custom_api("TpNet", "never_registered"));

  CHECK_THROWS_WITH_AS(tp::register_custom_api("aten", "mine", [](const at::Tensor& t) { return t; }),
                       doctest::Contains("'aten' is a namespace of libtorch's own"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(tp::register_custom_api("Tp Net", "x", [](const at::Tensor& t) { return t; }),
                       doctest::Contains("must be identifiers"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(tp::register_custom_api("TpNet", "block", [](const at::Tensor& t) { return t; }),
                       doctest::Contains("registered before with another signature"), std::invalid_argument);
}

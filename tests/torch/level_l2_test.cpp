// Level L2: every ATen call, nested ones too, each under the call it runs in (construct.json);
// the ops autograd runs in backward under the backward entry of the call that created the node.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>
#include <torchprobe/analysis/compare/dump_reader.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

namespace tp = torchprobe;
using Json = nlohmann::ordered_json;

namespace {

template <tp::Level L>
using MemoryDebugger = tp::Debugger<L, tp::Task::Statistics, tp::MemorySink>;

tp::Options memory_options() { return tp::Options().dump_path("/tmp/torchprobe-l2-memory").extra_info(true); }

std::vector<std::string> names_of(const Json& dump) {
  std::vector<std::string> names;
  for (const auto& kv : dump.at("data").items()) names.push_back(kv.key());
  return names;
}

// A tensor item's statistics against the float64 reduction of `t` (relative 1e-6: Max/Min of a
// float32 tensor are exact, Mean/Norm accumulate in double on both sides).
void check_stats(const Json& item, const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble);
  CHECK(item.at("Max").get<double>() == doctest::Approx(d.max().item<double>()).epsilon(1e-6));
  CHECK(item.at("Min").get<double>() == doctest::Approx(d.min().item<double>()).epsilon(1e-6));
  CHECK(item.at("Mean").get<double>() == doctest::Approx(d.mean().item<double>()).epsilon(1e-6));
  CHECK(item.at("Norm").get<double>() == doctest::Approx(d.norm().item<double>()).epsilon(1e-6));
  CHECK(item.at("shape").get<std::vector<std::int64_t>>() == t.sizes().vec());
}

struct LinearInputs {
  at::Tensor x, w, b;
  explicit LinearInputs(bool grad) {
    torch::manual_seed(7);
    x = torch::randn({3, 4}).requires_grad_(grad);
    w = torch::randn({5, 4}).requires_grad_(grad);
    b = torch::randn({5}).requires_grad_(grad);
  }
};

}  // namespace

TEST_CASE("at L2 the t and addmm that at::linear runs are entries under the linear call, with their own statistics") {
  LinearInputs in(false);
  MemoryDebugger<tp::Level::L2> dbg(memory_options());
  dbg.start();
  const at::Tensor y = at::linear(in.x, in.w, in.b);
  dbg.stop();
  const auto& files = dbg.sink().step(0);
  const Json& d = files.dump.at("data");
  const Json& c = files.construct;
  CHECK(files.dump.at("level") == "L2");
  for (const char* name :
       {"Aten.linear.0.forward", "Aten.t.0.forward", "Aten.transpose.0.forward", "Aten.addmm.0.forward"})
    REQUIRE(d.contains(name));
  CHECK(c.at("Aten.linear.0.forward").is_null());
  CHECK(c.at("Aten.t.0.forward") == "Aten.linear.0.forward");
  CHECK(c.at("Aten.addmm.0.forward") == "Aten.linear.0.forward");
  CHECK(c.at("Aten.transpose.0.forward") == "Aten.t.0.forward");  // nested two deep
  // The intermediate values, against ATen in float64: t's output is W^T, addmm's inputs are
  // (b, x, W^T) and its output x W^T + b.
  check_stats(d["Aten.t.0.forward"]["output"][0], in.w.t());
  const Json& addmm = d["Aten.addmm.0.forward"];
  check_stats(addmm["input_args"][0], in.b);
  check_stats(addmm["input_args"][1], in.x);
  check_stats(addmm["input_args"][2], in.w.t());
  const at::Tensor ref = in.x.to(at::kDouble).matmul(in.w.to(at::kDouble).t()) + in.b.to(at::kDouble);
  CHECK(addmm["output"][0]["Max"].get<double>() == doctest::Approx(ref.max().item<double>()).epsilon(1e-5));
  CHECK(addmm["output"][0]["Norm"].get<double>() == doctest::Approx(ref.norm().item<double>()).epsilon(1e-5));
  check_stats(addmm["output"][0], y);
  // Every parent names an entry of this dump.
  for (const auto& kv : c.items())
    if (!kv.value().is_null()) CHECK(d.contains(kv.value().get<std::string>()));
}

TEST_CASE("at L2 the ops left out at L1 are left out with everything they run, and leave the counters alone") {
  torch::manual_seed(3);
  const at::Tensor t = torch::randn({3});
  at::Tensor z = torch::randn({3});
  at::Tensor f = torch::randn({3});
  MemoryDebugger<tp::Level::L2> dbg(memory_options());
  dbg.start();
  const at::Tensor d = t.detach();
  const at::Tensor e = torch::empty({3});
  z.zero_();                                 // runs a fill_ inside
  const at::Tensor o = torch::ones_like(t);  // runs empty_like and a fill_ inside
  f.fill_(2.0);                              // the user's own fill_
  const at::Tensor s = torch::add(t, f);
  dbg.stop();
  const auto& files = dbg.sink().step(0);
  // Nothing of detach, empty, zero_ or ones_like; the user's fill_ is the first fill_ (number 0).
  CHECK(names_of(files.dump) == std::vector<std::string>{"Aten.fill_.0.forward", "Aten.add.0.forward"});
  CHECK(files.dump["data"]["Aten.fill_.0.forward"]["input_args"][1]["value"] == 2.0);
  CHECK(o.equal(torch::ones({3})));
  CHECK(z.equal(torch::zeros({3})));
}

TEST_CASE("at L1 the same program records only the outermost linear call and no parents") {
  LinearInputs in(false);
  MemoryDebugger<tp::Level::L1> dbg(memory_options());
  dbg.start();
  at::linear(in.x, in.w, in.b);
  dbg.stop();
  CHECK(names_of(dbg.sink().step(0).dump) == std::vector<std::string>{"Aten.linear.0.forward"});
  CHECK(dbg.sink().step(0).construct == Json::object());
}

TEST_CASE("at L2 the ops autograd runs in backward sit under the backward entry of the call whose node runs them") {
  LinearInputs in(true);
  MemoryDebugger<tp::Level::L2> dbg(memory_options());
  dbg.start();
  at::linear(in.x, in.w, in.b).sum().backward();
  dbg.stop();
  const auto& files = dbg.sink().step(0);
  const Json& d = files.dump.at("data");
  const Json& c = files.construct;
  for (const char* name :
       {"Aten.linear.0.backward", "Aten.t.0.backward", "Aten.addmm.0.backward", "Aten.sum.0.backward"})
    REQUIRE(d.contains(name));
  CHECK(c.at("Aten.linear.0.backward").is_null());
  CHECK(c.at("Aten.addmm.0.backward") == "Aten.linear.0.backward");
  CHECK(c.at("Aten.t.0.backward") == "Aten.linear.0.backward");
  // AddmmBackward0 computes grad x = grad_y W and grad W^T = x^T grad_y with two mm calls.
  std::vector<std::string> mms;
  for (const auto& kv : c.items())
    if (kv.key().rfind("Aten.mm.", 0) == 0) {
      CHECK(kv.value() == "Aten.addmm.0.backward");
      mms.push_back(kv.key());
    }
  REQUIRE(mms.size() == 2);
  // grad x (first) and grad W: as a stride-aware mm_mat2_backward computes it, W's gradient or its
  // transpose (libtorch picks by W^T's strides), with the same statistics.
  check_stats(d.at(mms[0])["output"][0], in.x.grad());
  const Json& grad_w = d.at(mms[1])["output"][0];
  const bool transposed = grad_w.at("shape") == Json::array({4, 5});
  check_stats(grad_w, transposed ? in.w.grad().t() : in.w.grad());
  // SumBackward0 expands the gradient: its expand is under the sum's backward entry.
  bool expand_under_sum = false;
  for (const auto& kv : c.items())
    if (kv.key().rfind("Aten.expand.", 0) == 0 && kv.value() == "Aten.sum.0.backward") expand_under_sum = true;
  CHECK(expand_under_sum);
  // Nothing the engine runs for nodes no recorded call created (AccumulateGrad) is recorded: every
  // entry without a parent is one the user called, or its backward.
  std::set<std::string> roots;
  for (const auto& kv : c.items())
    if (kv.value().is_null()) roots.insert(kv.key());
  CHECK(roots == std::set<std::string>{"Aten.linear.0.forward", "Aten.linear.0.backward", "Aten.sum.0.forward",
                                       "Aten.sum.0.backward"});
}

TEST_CASE("a probed L2 run computes bit for bit what the unprobed run computes, and costs nothing once stopped") {
  auto run = [](tp::DebuggerInterface* dbg) {
    torch::manual_seed(3);
    torch::nn::Sequential net(torch::nn::Linear(6, 8), torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})),
                              torch::nn::GELU(), torch::nn::Linear(8, 3));
    const at::Tensor x = torch::randn({4, 6});
    if (dbg) dbg->start_with(tp::ModelRef{}, std::nullopt);
    const at::Tensor out = torch::softmax(net->forward(x), 1);
    out.pow(2).sum().backward();
    if (dbg) dbg->stop();
    std::vector<at::Tensor> all{out.detach()};
    for (const auto& p : net->parameters()) all.push_back(p.grad());
    return all;
  };
  const std::vector<at::Tensor> plain = run(nullptr);
  MemoryDebugger<tp::Level::L2> dbg(memory_options());
  const std::vector<at::Tensor> probed = run(&dbg);
  REQUIRE(plain.size() == probed.size());
  for (std::size_t i = 0; i < plain.size(); ++i) CHECK(torch::equal(plain[i], probed[i]));
  CHECK(dbg.sink().step(0).dump.at("data").size() > 20);  // it did record
  CHECK_FALSE(at::hasGlobalCallbacks());                  // stopped: no callback left
}

TEST_CASE("L2 capture on two threads at once keeps each call's parent on its own thread") {
  MemoryDebugger<tp::Level::L2> dbg(memory_options().extra_info(false));
  dbg.start();
  auto work = [] {
    LinearInputs in(true);
    for (int i = 0; i < 20; ++i) at::linear(in.x, in.w, in.b).sum().backward();
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  dbg.stop();
  const auto& files = dbg.sink().step(0);
  const Json& d = files.dump.at("data");
  const Json& c = files.construct;
  CHECK(d.contains("Aten.linear.39.forward"));
  CHECK(d.contains("Aten.linear.39.backward"));
  int t_calls = 0;
  for (const auto& kv : c.items()) {
    const std::string& k = kv.key();
    if (!kv.value().is_null()) CHECK(d.contains(kv.value().get<std::string>()));
    // Every forward t and addmm ran inside a linear, whichever thread ran it.
    if ((k.rfind("Aten.addmm.", 0) == 0 || k.rfind("Aten.t.", 0) == 0) && k.find(".forward") != std::string::npos &&
        kv.value().is_string() && kv.value().get<std::string>().rfind("Aten.linear.", 0) == 0)
      ++t_calls;
  }
  CHECK(t_calls == 80);
}

TEST_CASE("config \"level\": \"L2\" with a list descends into the one call it names, forward or backward") {
  const tptest::TempDir dir;
  auto run = [&](const std::string& listed) {
    const std::string cfg = dir.path() + "/config.json";
    tptest::remove_tree(dir.path() + "/dump");
    std::ofstream(cfg) << Json{{"task", "statistics"},
                               {"level", "L2"},
                               {"dump_path", dir.path() + "/dump"},
                               {"statistics", {{"list", {listed}}}}}
                              .dump();
    LinearInputs in(true);
    tp::PrecisionDebugger dbg(cfg);
    dbg.start();
    at::linear(in.x, in.w, in.b).relu();
    at::linear(in.x, in.w, in.b).sum().backward();
    dbg.stop();
    dbg.wait_written();
    const std::string rank = dir.path() + "/dump/step0/proc" + std::to_string(::getpid());
    // Read as Python's json reads it: at L2 a nested call's input can be a buffer not yet written
    // (the output of an `empty` that the next call fills), whose statistics may be NaN.
    return std::make_pair(tp::compare::read_json_file(rank + "/dump.json").at("data"),
                          tptest::read_json(rank + "/construct.json"));
  };
  const auto [fwd, fwd_construct] = run("Aten.linear.1.forward");
  std::set<std::string> names;
  for (const auto& kv : fwd.items()) names.insert(kv.key());
  // The second linear and what it ran, numbered as an unfiltered L2 run numbers them.
  CHECK(names.count("Aten.linear.1.forward") == 1);
  CHECK(names.count("Aten.t.1.forward") == 1);
  CHECK(names.count("Aten.addmm.1.forward") == 1);
  CHECK(fwd_construct.at("Aten.addmm.1.forward") == "Aten.linear.1.forward");
  for (const std::string& n : names) {
    CHECK(n.find(".backward") == std::string::npos);
    CHECK(n.find("relu") == std::string::npos);
    CHECK(n.find(".0.forward") == std::string::npos);  // nothing of the first linear's call
  }

  const auto [bwd, bwd_construct] = run("Aten.linear.1.backward");
  CHECK(bwd.contains("Aten.linear.1.backward"));
  CHECK(bwd.contains("Aten.addmm.1.backward"));
  CHECK_FALSE(bwd.contains("Aten.linear.1.forward"));
  CHECK_FALSE(bwd.contains("Aten.sum.0.backward"));
  int mm_under_addmm = 0;
  for (const auto& kv : bwd_construct.items())
    if (kv.key().rfind("Aten.mm.", 0) == 0 && kv.value() == "Aten.addmm.1.backward") ++mm_under_addmm;
  CHECK(mm_under_addmm == 2);
}

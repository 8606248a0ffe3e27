// construct.json's module tree: containers of the model that no guard marks are named as the
// parents of the modules inside them (forward and backward), and the structure task writes the
// same tree with no data.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "torchprobe/analysis/compare/cli.hpp"
#include "test_support.hpp"

namespace tp = torchprobe;
using Json = nlohmann::ordered_json;

namespace {

struct BlockImpl : torch::nn::Module {  // a container with no guard
  BlockImpl()
      : fc1(register_module("fc1", torch::nn::Linear(4, 4))), fc2(register_module("fc2", torch::nn::Linear(4, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct EncoderImpl : torch::nn::Module {  // a container of a container, no guard either
  EncoderImpl()
      : blk(register_module("blk", Block())),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({4})))) {}
  torch::Tensor forward(const torch::Tensor& x) { return norm(blk(x)); }
  Block blk;
  torch::nn::LayerNorm norm;
};
TORCH_MODULE(Encoder);

struct GuardedImpl : torch::nn::Module {  // a guarded container holding an unguarded one
  GuardedImpl() : blk(register_module("blk", Block())) {}
  torch::Tensor forward(const torch::Tensor& x) {
    tp::ModuleGuard guard(this, x);
    return blk(x) * 2;
  }
  Block blk;
};
TORCH_MODULE(Guarded);

struct TreeNetImpl : torch::nn::Module {
  TreeNetImpl()
      : enc(register_module("enc", Encoder())),
        outer(register_module("outer", Guarded())),
        head(register_module("head", torch::nn::Linear(4, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head(outer(enc(x))); }
  Encoder enc;
  Guarded outer;
  torch::nn::Linear head;
};
TORCH_MODULE(TreeNet);

// Two forward/backward passes of TreeNet in one step.
template <class Dbg>
void run_twice(Dbg& dbg, TreeNet& net) {
  torch::manual_seed(8);
  dbg.start(net);
  for (int i = 0; i < 2; ++i) net->forward(torch::randn({3, 4}, torch::requires_grad())).sum().backward();
  dbg.stop();
}

std::map<std::string, Json> modules_of(const Json& construct) {
  std::map<std::string, Json> out;
  for (const auto& kv : construct.items())
    if (kv.key().rfind("Module.", 0) == 0) out[kv.key()] = kv.value();
  return out;
}

}  // namespace

TEST_CASE("construct.json names the containers no guard marks as parents, forward and backward, with no dump entry") {
  TreeNet net;
  tp::Debugger<tp::Level::Mix, tp::Task::Statistics, tp::MemorySink> dbg(
      tp::Options().dump_path("/tmp/torchprobe-memory-sink"));
  run_twice(dbg, net);
  const auto files = dbg.sink().step(0);
  std::map<std::string, Json> expected;
  for (int n = 0; n < 2; ++n) {
    const std::string k = std::to_string(n);
    for (const char* dir : {"forward", "backward"}) {
      auto name = [&](const std::string& prefix) { return Json("Module." + prefix + "." + dir + "." + k); };
      const std::string d = dir;
      expected["Module.enc.Encoder." + d + "." + k] = nullptr;
      expected["Module.enc.blk.Block." + d + "." + k] = name("enc.Encoder");
      expected["Module.enc.blk.fc1.Linear." + d + "." + k] = name("enc.blk.Block");
      expected["Module.enc.blk.fc2.Linear." + d + "." + k] = name("enc.blk.Block");
      expected["Module.enc.norm.LayerNorm." + d + "." + k] = name("enc.Encoder");
      expected["Module.outer.Guarded." + d + "." + k] = nullptr;  // the guard's own entry, as before
      expected["Module.outer.blk.Block." + d + "." + k] = name("outer.Guarded");
      expected["Module.outer.blk.fc1.Linear." + d + "." + k] = name("outer.blk.Block");
      expected["Module.outer.blk.fc2.Linear." + d + "." + k] = name("outer.blk.Block");
      expected["Module.head.Linear." + d + "." + k] = nullptr;
    }
  }
  CHECK(modules_of(files.construct) == expected);
  // An inferred container comes before the modules inside it, as msprobe's pre-hooks list them.
  const Json& d = files.dump["data"];
  std::map<std::string, std::size_t> pos;
  for (const auto& kv : files.construct.items()) pos.emplace(kv.key(), pos.size());
  for (const auto& kv : expected)
    if (!kv.second.is_null() && !d.contains(kv.second.get<std::string>()))
      CHECK(pos.at(kv.second.get<std::string>()) < pos.at(kv.first));
  // The inferred containers have no data entry; the guarded one and the leaves do.
  CHECK_FALSE(d.contains("Module.enc.Encoder.forward.0"));
  CHECK_FALSE(d.contains("Module.outer.blk.Block.forward.1"));
  CHECK_FALSE(d.contains("Module.enc.blk.Block.backward.0"));
  CHECK(d.contains("Module.outer.Guarded.forward.1"));
  CHECK(d.contains("Module.enc.blk.fc1.Linear.backward.1"));
  // API calls keep the innermost module the capture knows: the Linear's, or the guarded container.
  CHECK(files.construct["Aten.addmm.0.forward"] == "Module.enc.blk.fc1.Linear.forward.0");
  CHECK(files.construct["Aten.mul.0.forward"] == "Module.outer.Guarded.forward.0");
  CHECK(files.construct["Aten.relu.0.forward"].is_null());  // inside enc.blk, which no guard marks
}

TEST_CASE("an unguarded container's call number starts again when a module inside it runs again, and each step") {
  tp::Debugger<tp::Level::L0, tp::Task::Statistics, tp::MemorySink> dbg(
      tp::Options().dump_path("/tmp/torchprobe-memory-sink"));
  torch::nn::Sequential seq(Block(), torch::nn::Linear(4, 4), Block());
  dbg.start(seq);
  seq->forward(torch::randn({2, 4}));  // 0.Block, 1.Linear, 2.Block: two containers, one call each
  seq->forward(torch::randn({2, 4}));
  dbg.step();
  seq->forward(torch::randn({2, 4}));
  dbg.stop();
  const auto s0 = dbg.sink().step(0), s1 = dbg.sink().step(1);
  CHECK(s0.construct["Module.0.fc1.Linear.forward.1"] == "Module.0.Block.forward.1");
  CHECK(s0.construct["Module.2.fc2.Linear.forward.0"] == "Module.2.Block.forward.0");
  CHECK(s0.construct["Module.0.Block.forward.0"].is_null());
  CHECK_FALSE(s0.construct.contains("Module.0.Block.forward.2"));
  CHECK_FALSE(s0.construct.contains("Module.0.Block.backward.0"));  // no backward ran
  CHECK(s1.construct["Module.2.fc1.Linear.forward.0"] == "Module.2.Block.forward.0");
  CHECK_FALSE(s1.construct.contains("Module.2.Block.forward.1"));
}

TEST_CASE("task structure: forced to mix from L1 with a warning, the statistics run's construct.json, no data") {
  tptest::TempDir tmp;
  const std::string cfg = tmp / "config.json";
  std::ofstream(cfg) << R"({"task": "structure", "level": "L1", "dump_path": ")" << (tmp / "structure") << "\"}";
  TreeNet net;
  {
    tp::PrecisionDebugger dbg(cfg);
    const auto& w = dbg.config().warnings;
    CHECK(std::count_if(w.begin(), w.end(),
                        [](const std::string& s) { return s.find("changed to \"mix\"") != std::string::npos; }) == 1);
    CHECK(dbg.config().level == tp::Level::Mix);
    run_twice(dbg, net);
  }
  {
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp / "statistics"));
    run_twice(dbg, net);
  }
  const std::string rank = "/step0/proc" + std::to_string(::getpid());
  const Json dump = tptest::read_json(tmp / ("structure" + rank + "/dump.json"));
  CHECK(dump == Json{{"task", "structure"},
                     {"level", "mix"},
                     {"framework", "pytorch"},
                     {"dump_data_dir", nullptr},
                     {"data", Json::object()}});
  const Json construct = tptest::read_json(tmp / ("structure" + rank + "/construct.json"));
  CHECK(construct.size() > 40);
  CHECK(construct == tptest::read_json(tmp / ("statistics" + rank + "/construct.json")));
  CHECK(tptest::read_json(tmp / ("structure" + rank + "/stack.json")).size() ==
        tptest::read_json(tmp / ("statistics" + rank + "/stack.json")).size());
  CHECK_FALSE(std::filesystem::exists(tmp / ("structure" + rank + "/dump_tensor_data")));
}

TEST_CASE("compare's report shows the containers no guard marks in the module tree, each leaf under its own") {
  tptest::TempDir tmp;
  for (const char* side : {"a", "b"}) {  // the same weights and inputs: nothing diverges
    torch::manual_seed(2);
    TreeNet net;
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp / side));
    run_twice(dbg, net);
  }
  tp::compare::CompareOptions o;
  o.target = tmp / "a/step0";
  o.bench = tmp / "b/step0";
  o.out = tmp / "out";
  std::ostringstream log;
  CHECK(tp::compare::run_compare(o, log) == 0);
  const std::string page = tptest::read_text(tmp / "out/report.html");
  // The first call of enc.blk: the container, then its two Linears inside its <ul>, before the
  // next container of the tree.
  const auto blk = page.find(">Module.enc.blk.Block.forward.0<");
  const auto fc1 = page.find(">Module.enc.blk.fc1.Linear.forward.0<");
  const auto fc2 = page.find(">Module.enc.blk.fc2.Linear.forward.0<");
  const auto norm = page.find(">Module.enc.norm.LayerNorm.forward.0<");
  REQUIRE(blk != std::string::npos);
  REQUIRE(page.find(">Module.enc.Encoder.forward.0<") < blk);
  CHECK(page.compare(page.find('<', blk + 1), 24, "</span><ul class=\"tree\">") == 0);
  CHECK(blk < fc1);
  CHECK(fc1 < fc2);
  CHECK(fc2 < norm);
}

// The compare-twins corpus (issue 41): each model of tests/data/msprobe_twins/make_twins.py built
// again with torch::nn, its weights and inputs copied by name from twin.pt, run for the same step
// (bit-identical outputs and gradients, checked first), dumped by TorchProbe at L1 and mix, and
// compared with msprobe's committed Python dumps of the same level: `torchprobe compare` exits 0 and
// every entry of both sides is paired or explained. The same corpus with a planted fault must name it.
#include <torch/torch.h>
#include <torch/version.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "torchprobe/analysis/compare/cli.hpp"
#include "twin_run.hpp"
#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

using twins::kTwins;
using twins::load;
using twins::step;
using twins::TwinRun;

template <tp::Level L>
fs::path dump(TwinRun& r, const fs::path& dir) {
  tp::Debugger<L, tp::Task::Statistics> dbg(tp::Options().dump_path(dir.string()));
  dbg.start(r.model);
  step(r);
  dbg.stop();
  dbg.step();
  for (const auto& e : fs::directory_iterator(dir / "step0"))  // proc{pid}: no rank without c10d
    return e.path();
  FAIL("no dump under " << dir);
  return {};
}

Json compare(const fs::path& ours, const fs::path& theirs, const fs::path& out, int& status, std::string& log_text) {
  tp::compare::CompareOptions o;
  o.target = ours;
  o.bench = theirs;
  o.out = out;
  o.timestamp = "20261203000000";
  std::ostringstream log;
  status = tp::compare::run_compare(o, log);
  log_text = log.str();
  REQUIRE_MESSAGE(fs::exists(out / "first_divergence.json"), log_text);
  return tptest::read_json(out / "first_divergence.json");
}

// Python's step of every twin, run now by python3 with make_twins.py's kernels: the outputs and
// gradients as TWIN/NAME (NAME as in twin.pt). The same libtorch on the same CPU: C++ must match it
// to the bit. The committed twin.pt holds the step of the machine that made msprobe's dumps, whose
// CPU kernels (oneDNN's and ATen's vector width) may differ from this one's in the last bits.
std::map<std::string, torch::Tensor> python_steps(const fs::path& dir) {
  const fs::path out = dir / "steps.pt";
  const std::string names = [] {
    std::string s;
    for (const std::string& n : twins::names()) s += "'" + n + "', ";
    return s;
  }();
  int rc = -1;
  const std::string log = tptest::run_python(
      "import sys\nsys.path.insert(0, '" + (fs::path(TORCHPROBE_TESTS_DIR) / "data" / "msprobe_twins").string() +
          "')\nimport torch, make_twins as mt\nitems = []\n"
          "for name in [" +
          names +
          "]:\n"
          "    model, xs, _ = mt.load_twin(name, '" +
          kTwins.string() +
          "')\n"
          "    out, loss = mt.step(model, xs)\n"
          "    items += [name + '/out', out.detach(), name + '/loss', loss.detach()]\n"
          "    items += sum(([f'{name}/grad.input.{i}', x.grad] for i, x in enumerate(xs) if x.grad is not None), [])\n"
          "    items += sum(([f'{name}/grad.{k}', v.grad] for k, v in model.named_parameters()), [])\n"
          "torch.save(items, '" +
          out.string() + "')\n",
      &rc);
  REQUIRE_MESSAGE(rc == 0, "python3 could not run the twins' step: " << log);
  return twins::read_twin_file(out);
}

// |a - b| / |b| in float64 (0 when both are zero).
double relative_l2(const torch::Tensor& a, const torch::Tensor& b) {
  const double d = (a.to(torch::kDouble) - b.to(torch::kDouble)).norm().item<double>();
  const double n = b.to(torch::kDouble).norm().item<double>();
  return n == 0 ? d : d / n;
}

}  // namespace

TEST_CASE("every twin of the corpus reproduces its Python run bit for bit") {
  const tptest::ReferenceKernels kernels;  // the corpus's: one thread, no oneDNN on 2.x
  tptest::TempDir tmp;
  std::map<std::string, torch::Tensor> python = python_steps(tmp.path());
  double worst_committed = 0;
  std::string at_worst;
  for (const std::string& name : twins::names()) {
    CAPTURE(name);
    TwinRun r = load(name);
    const auto [out, loss] = step(r);
    // What C++ computed, by twin.pt's names; each must be Python's to the bit.
    std::map<std::string, torch::Tensor> ours = {{"out", out}, {"loss", loss}};
    for (std::size_t i = 0; i < r.inputs.size(); ++i)
      if (r.inputs[i].grad().defined()) ours["grad.input." + std::to_string(i)] = r.inputs[i].grad();
    for (auto& p : r.model->named_parameters()) ours["grad." + p.key()] = p.value().grad();
    for (const auto& kv : r.saved) {  // the same gradients exist on both sides
      if (kv.first.rfind("state.", 0) == 0 || kv.first.rfind("input.", 0) == 0) continue;
      CHECK_MESSAGE(ours.count(kv.first), "C++ has no " << kv.first);
      CHECK_MESSAGE(python.count(name + "/" + kv.first), "Python has no " << kv.first);
    }
    for (const auto& kv : ours) {
      CAPTURE(kv.first);
      REQUIRE(kv.second.defined());
      REQUIRE(python.count(name + "/" + kv.first));
      CHECK(torch::equal(kv.second, python[name + "/" + kv.first]));
      REQUIRE(r.saved.count(kv.first));
      const double rel = relative_l2(kv.second, r.saved[kv.first]);
      if (rel > worst_committed) {
        worst_committed = rel;
        at_worst = name + "/" + kv.first;
      }
    }
  }
  // Against the committed step: the same up to the last bits of another CPU's kernels.
  MESSAGE("largest relative L2 difference from the committed twin.pt: " << worst_committed << " (" << at_worst << ")");
  CHECK(worst_committed < 1e-5);
}

TEST_CASE(
    "every twin's C++ dump compares clean with msprobe's Python dump at L1 and mix, every entry paired or "
    "explained") {
  const tptest::ReferenceKernels kernels;  // the corpus's: one thread, no oneDNN on 2.x
  Json coverage = Json::array();
#if TORCH_VERSION_MAJOR < 2
  // msprobe's own compare read these C++ dumps (msprobe_compare.py, run where msprobe is; its
  // figures are committed): each dump must still be the one it read, entry for entry.
  const Json figures = tptest::read_json(kTwins / "msprobe_compare_figures.json");
  auto figures_of = [&](const std::string& twin, const std::string& level) {
    for (const Json& row : figures["twins"])
      if (row["twin"] == twin && row["level"] == level) return row;
    return Json();
  };
#endif
  for (const std::string& name : twins::names()) {
    for (const std::string level : {"L1", "mix"}) {
      CAPTURE(name);
      CAPTURE(level);
      tptest::TempDir tmp;
      // TORCHPROBE_TWINS_KEEP=DIR keeps the dumps and reports (DIR/TWIN/LEVEL) to look at.
      const char* keep = std::getenv("TORCHPROBE_TWINS_KEEP");
      const fs::path base = keep ? fs::path(keep) / name / level : fs::path(tmp.path());
      if (keep) tptest::remove_tree(base);
      TwinRun r = load(name);
      const fs::path ours =
          level == "L1" ? dump<tp::Level::L1>(r, base / "dump") : dump<tp::Level::Mix>(r, base / "dump");
      int status = -1;
      std::string log;
      const Json report = compare(ours, kTwins / name / level, base / "out", status, log);
      INFO(log);
      INFO(report.dump(1));
      CHECK(status == 0);
      const Json& s = report["summary"];
      CHECK(s["target_only"] == 0);
      CHECK(s["bench_only"] == 0);
#if TORCH_VERSION_MAJOR < 2
      const Json row = figures_of(name, level);
      REQUIRE_MESSAGE(row.is_object(), "no msprobe compare figures for this twin: run msprobe_compare.py");
      CHECK_MESSAGE(s["target_entries"] == row["npu_entries"],
                    "the dump is no longer the one msprobe's compare read: run msprobe_compare.py again");
      if (level == "mix") CHECK(row["msprobe_paired"].get<int>() > 0);  // msprobe paired its module entries
#endif
      coverage.push_back({{"twin", name}, {"level", level}, {"summary", s}});
    }
  }
  MESSAGE("coverage: " << coverage.dump());
}

namespace {
struct Plant {
  const char* fault;  // what is planted in the C++ twin
  const char* twin;
  const char* bench_name;  // msprobe's entry that must be named first
  const char* module;      // the module chain must hold this call (mix)
  std::function<void(TwinRun&)> apply;
};

const std::vector<Plant>& plants() {
  static const std::vector<Plant> kPlants = {
      {"block.fc1 run in bfloat16", "transformer", "Functional.linear.0.forward", "Module.block.fc1.Linear.forward.0",
       [](TwinRun& r) {
         for (auto& c : r.model->named_modules())
           if (c.key() == "block.fc1") c.value()->to(torch::kBFloat16);
         twins::planted_fault() = "bf16_fc1";
       }},
      {"every element of block.fc2.weight times (1 + 1000 * 2^-23)", "transformer", "Functional.linear.1.forward",
       "Module.block.fc2.Linear.forward.0",
       [](TwinRun& r) {
         torch::NoGradGuard no_grad;
         for (auto& p : r.model->named_parameters())
           if (p.key() == "block.fc2.weight") p.value().mul_(1 + 1000 * std::ldexp(1.0, -23));
       }},
      {"block.act: GELU with the tanh approximation instead of erf", "transformer", "Functional.gelu.0.forward",
       "Module.block.act.GELU.forward.0", [](TwinRun&) { twins::planted_fault() = "gelu_tanh"; }},
      {"dropout left in train mode", "dropout_eval", "Functional.dropout.0.forward", "Module.drop.Dropout.forward.0",
       [](TwinRun& r) {
         for (auto& c : r.model->named_modules())
           if (c.key() == "drop") c.value()->train(true);
       }},
      {"the attention block's ReLU left out", "transformer_attention", "Functional.relu.0.forward",
       "Module.block.act.ReLU.forward.0", [](TwinRun&) { twins::planted_fault() = "missing_relu"; }},
  };
  return kPlants;
}
}  // namespace

TEST_CASE("a fault planted in a C++ twin is named first, at L1 and mix, never as a divergence without a source") {
  const tptest::ReferenceKernels kernels;  // the corpus's: one thread, no oneDNN on 2.x
  Json table = Json::array();
  for (const Plant& plant : plants()) {
    for (const std::string level : {"L1", "mix"}) {
      const std::string fault = plant.fault;
      CAPTURE(fault);
      CAPTURE(level);
      tptest::TempDir tmp;
      const char* keep = std::getenv("TORCHPROBE_TWINS_KEEP");
      const fs::path base = keep ? fs::path(keep) / "planted" / std::to_string(table.size()) : fs::path(tmp.path());
      if (keep) tptest::remove_tree(base);
      TwinRun r = load(plant.twin);
      plant.apply(r);
      const fs::path ours =
          level == "L1" ? dump<tp::Level::L1>(r, base / "dump") : dump<tp::Level::Mix>(r, base / "dump");
      twins::planted_fault().clear();
      int status = -1;
      std::string log;
      const Json report = compare(ours, kTwins / plant.twin / level, base / "out", status, log);
      INFO(log);
      CHECK(status == 1);
      const Json& first = report["first_diverging_entry"];
      REQUIRE(first.is_object());
      std::string named;
      const std::string role = first["role"].get<std::string>();
      if (role.rfind("source", 0) != 0) {
        // A call one side does not make: the first divergence's inputs differ, and the call is the
        // one unmatched entry since the last clean pair.
        REQUIRE(first["unmatched_before"].is_array());
        for (const auto& u : first["unmatched_before"])
          if (u.get<std::string>() == std::string("bench: ") + plant.bench_name) named = plant.bench_name;
      } else {
        // A source: its inputs agree and its output not, or its inputs are the first difference.
        CHECK(report["first_divergence"]["entry"] == first["entry"]);
        named = first["bench_entries"][0].get<std::string>();
      }
      CHECK(named == plant.bench_name);
      std::string chain;
      for (const auto& m : first["module_chain"]) chain += m.get<std::string>() + " ";
      if (first.contains("bench_module_chain"))
        for (const auto& m : first["bench_module_chain"]) chain += m.get<std::string>() + " ";
      if (level == "mix" && std::string(plant.fault).find("ReLU") == std::string::npos)
        CHECK_MESSAGE(chain.find(plant.module) != std::string::npos, chain);
      table.push_back({{"fault", plant.fault},
                       {"level", level},
                       {"named", first["entry"]},
                       {"bench", first["bench_entries"]},
                       {"role", first["role"]},
                       {"module_chain", first["module_chain"]},
                       {"bench_module_chain", first.value("bench_module_chain", Json::array())}});
    }
  }
  MESSAGE("planted faults: " << table.dump());
}

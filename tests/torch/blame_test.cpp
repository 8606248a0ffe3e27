// Blame by replay and the second pass (issue 47), on the compare-twins corpus's transformer: the
// faithful C++ twin is the bench, the same twin with a fault planted is the target, both dumped with
// the tensor task; compare replays each diverging op on the bench's inputs and must say where the
// error starts (introduced here, parameter source) and that what follows only carries it
// (propagated). A deep stack that differs only in its summation order must blame no op.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "torchprobe/analysis/run_ut/blame_replay.hpp"
#include "torchprobe/analysis/compare/cli.hpp"
#include "torchprobe/analysis/compare/tensor_metrics.hpp"
#include "twin_run.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

using twins::only_rank;

template <tp::Level L>
fs::path tensor_dump(twins::TwinRun& r, const fs::path& dir, tp::Options options = tp::Options()) {
  tp::Debugger<L, tp::Task::Tensor> dbg(options.dump_path(dir.string()));
  dbg.start(r.model);
  twins::step(r);
  dbg.stop();
  dbg.step();
  return only_rank(dir);
}

struct Compared {
  int status = -1;
  std::string log;
  Json report;
};

Compared compare(const fs::path& target, const fs::path& bench, const fs::path& out,
                 tp::compare::JudgeMode mode = tp::compare::JudgeMode::tol, std::size_t blame = 10,
                 const fs::path& emit_config = {}, bool tensor_csv = false) {
  tp::compare::CompareOptions o;
  o.target = target;
  o.bench = bench;
  o.out = out;
  o.mode = mode;
  o.blame = blame;
  o.emit_config = emit_config;
  o.timestamp = "20261207000000";
  o.blame_fn = [](const Json& request) { return tp::run_ut::blame_replay(request); };
  // msprobe's tensor-mode CSV, as the CLI writes it (its .pt cells; the blame's columns after them)
  if (tensor_csv)
    o.pt_cells = [](const fs::path& npu, const fs::path& bench) {
      std::string error;
      return tp::compare::pt_tensor_cells(npu, bench, &error);
    };
  std::ostringstream log;
  Compared c;
  c.status = tp::compare::run_compare(o, log);
  c.log = log.str();
  REQUIRE_MESSAGE(fs::exists(out / "first_divergence.json"), c.log);
  c.report = tptest::read_json(out / "first_divergence.json");
  return c;
}

bool is_cause(const Json& b) {
  const std::string v = b.value("verdict", "");
  return v == "introduced here" || v == "parameter source" || v == "bench less exact than target";
}

// The modules around an entry, from the dump's construct.json.
std::vector<std::string> chain_of(const fs::path& rank_dir, const std::string& entry) {
  const Json c = tptest::read_json(rank_dir / "construct.json");
  std::vector<std::string> chain;
  std::string cur = entry;
  while (c.contains(cur) && c[cur].is_string()) {
    cur = c[cur].get<std::string>();
    chain.push_back(cur);
  }
  return chain;
}

struct Plant {
  const char* fault;
  const char* verdict;  // what blame must say of the planted op
  const char* module;   // the planted op's module (mix)
  const char* api;      // the planted op's API, where its module is no entry: the first cause holds it
  std::function<void(twins::TwinRun&)> apply;
};

const std::vector<Plant>& plants() {
  static const std::vector<Plant> kPlants = {
      {"block.fc1 run in bfloat16", "introduced here", "Module.block.fc1.Linear.forward.0", "",
       [](twins::TwinRun& r) {
         for (auto& c : r.model->named_modules())
           if (c.key() == "block.fc1") c.value()->to(torch::kBFloat16);
         twins::planted_fault() = "bf16_fc1";
       }},
      {"every element of block.fc2.weight times (1 + 1000 * 2^-23)", "parameter source",
       "Module.block.fc2.Linear.forward.0", "",
       [](twins::TwinRun& r) {
         torch::NoGradGuard no_grad;
         for (auto& p : r.model->named_parameters())
           if (p.key() == "block.fc2.weight") p.value().mul_(1 + 1000 * std::ldexp(1.0, -23));
       }},
      {"block.act: GELU with the tanh approximation instead of erf", "introduced here",
       "Module.block.act.GELU.forward.0", ".gelu.", [](twins::TwinRun&) { twins::planted_fault() = "gelu_tanh"; }},
  };
  return kPlants;
}

}  // namespace

TEST_CASE("blame by replay names each planted fault's op and calls every entry after it propagated") {
  const tptest::ReferenceKernels kernels;
  Json table = Json::array();
  for (const Plant& plant : plants()) {
    // The planted layer's calls: the bench's entries inside the planted module (mix's construct.json),
    // the same names at L1 (the bench is the faithful twin; the target's names are the same).
    std::set<std::string> planted;
    for (const std::string level : {"mix", "L1"}) {
      const std::string fault = plant.fault;
      CAPTURE(fault);
      CAPTURE(level);
      tptest::TempDir tmp;
      const fs::path base(tmp.path());
      twins::TwinRun bench_run = twins::load("transformer");
      const fs::path bench = level == "L1" ? tensor_dump<tp::Level::L1>(bench_run, base / "bench")
                                           : tensor_dump<tp::Level::Mix>(bench_run, base / "bench");
      twins::TwinRun target_run = twins::load("transformer");
      plant.apply(target_run);
      const fs::path target = level == "L1" ? tensor_dump<tp::Level::L1>(target_run, base / "target")
                                            : tensor_dump<tp::Level::Mix>(target_run, base / "target");
      twins::planted_fault().clear();
      if (level == "mix") {
        const Json d = tptest::read_json(bench / "dump.json");
        for (const auto& kv : d["data"].items()) {
          const auto chain = chain_of(bench, kv.key());
          // The module's forward and its backward ("Module.block.fc1.Linear.backward.0").
          std::string backward_module = plant.module;
          backward_module.replace(backward_module.find(".forward."), 9, ".backward.");
          bool by_module = false;
          for (const std::string& m : {std::string(plant.module), backward_module})
            by_module = by_module || kv.key() == m || std::find(chain.begin(), chain.end(), m) != chain.end();
          // A parameter-free module without a ModuleGuard (GELU) is no entry in C++: its call is found by name.
          if (by_module || (*plant.api && kv.key().find(plant.api) != std::string::npos)) planted.insert(kv.key());
        }
        REQUIRE(!planted.empty());
      }
      // 40 entries: the forward after the fault and the backward back through the planted layer.
      const Compared c = compare(target, bench, base / "out", tp::compare::JudgeMode::tol, 40);
      INFO(c.log);
      REQUIRE(c.status == 1);
      const Json& blame = c.report["blame"];
      INFO(blame.dump(1));
      REQUIRE(blame.is_array());
      REQUIRE(!blame.empty());
      // The first entry blamed is the planted layer's, with the planted fault's verdict, and so is every cause.
      CHECK(blame[0]["verdict"] == plant.verdict);
      if (*plant.api) CHECK(blame[0]["entry"].get<std::string>().find(plant.api) != std::string::npos);
      CHECK(c.report["blame_summary"].get<std::string>().rfind(std::string(plant.verdict) + ": ", 0) == 0);
      std::size_t after = 0;
      for (const auto& b : blame) {
        const std::string e = b["bench_entry"].get<std::string>();
        CAPTURE(e);
        if (planted.count(e)) {
          // The planted layer: the module itself and its faulty calls take the fault's verdict; a call
          // after the faulty one inside it (fc2's matmul after its weight's transpose) carries it on.
          if (e == plant.module)
            CHECK(b["verdict"] == plant.verdict);
          else
            CHECK((b["verdict"] == plant.verdict || b["verdict"] == "propagated"));
          continue;
        }
        // After the planted layer every call, forward or backward, carries the error on.
        ++after;
        CHECK(b["verdict"] == "propagated");
      }
      CHECK(after >= 5);  // --blame 10 reaches well past the planted layer
      Json row = {{"fault", fault}, {"level", level}, {"blame", Json::array()}};
      for (const auto& b : blame)
        row["blame"].push_back({{"entry", b["entry"]},
                                {"verdict", b["verdict"]},
                                {"local", b.value("local", Json())},
                                {"propagated", b.value("propagated", Json())},
                                {"target_vs_f64", b.value("target_error_vs_float64", Json())},
                                {"bench_vs_f64", b.value("bench_error_vs_float64", Json())}});
      table.push_back(row);
    }
  }
  MESSAGE("blame of the planted faults: " << table.dump());
}

namespace {

// 50 layers of x = tanh(x * s); x = x * rsqrt(mean(x^2)) on 33 x 1024 values: the mean's reduction is
// split between threads (ATen splits above 32768 elements), so two thread counts sum in two orders
// and round differently, while every op is the same.
struct DeepStackImpl : torch::nn::Module {
  DeepStackImpl() {
    torch::manual_seed(11);
    for (int i = 0; i < 50; ++i)
      scales.push_back(register_parameter("s" + std::to_string(i), 1.5 + 0.1 * torch::randn({1024})));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (const auto& s : scales) {
      x = torch::tanh(x * s);
      x = x * torch::rsqrt(x.pow(2).mean());
    }
    return x;
  }
  std::vector<torch::Tensor> scales;
};
TORCH_MODULE(DeepStack);

fs::path deep_stack_dump(int threads, const fs::path& dir) {
  const int before = at::get_num_threads();
  at::set_num_threads(threads);
  DeepStack model;
  torch::manual_seed(12);
  const torch::Tensor x = torch::randn({33, 1024});
  {
    tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(tp::Options().dump_path(dir.string()));
    dbg.start(model.ptr());
    model->forward(x);
    dbg.stop();
    dbg.step();
  }
  at::set_num_threads(before);
  return only_rank(dir);
}

}  // namespace

TEST_CASE("a 50-layer stack that differs only in its summation order has no op blamed, and the report says so") {
  tptest::TempDir tmp;
  const fs::path base(tmp.path());
  const fs::path target = deep_stack_dump(1, base / "one_thread");
  const fs::path bench = deep_stack_dump(2, base / "two_threads");
  const Compared c = compare(target, bench, base / "out", tp::compare::JudgeMode::exact, 1000);
  INFO(c.log);
  REQUIRE_MESSAGE(c.status == 1, "the two thread counts must round differently somewhere, or this test tests nothing");
  const Json& blame = c.report["blame"];
  REQUIRE(blame.is_array());
  std::size_t rounding = 0, propagated = 0;
  for (const auto& b : blame) {
    CAPTURE(b.dump());
    CHECK_FALSE(is_cause(b));
    const std::string v = b.value("verdict", "");
    rounding += v == "rounding";
    propagated += v == "propagated";
  }
  CHECK(rounding > 0);  // the means themselves: the same inputs, another order
  CHECK(rounding + propagated == blame.size());
  // The first diverging entry is a mean (the reduction ATen splits), blamed as rounding.
  REQUIRE(!blame.empty());
  CHECK(blame[0]["entry"].get<std::string>().find(".mean.") != std::string::npos);
  CHECK(blame[0]["verdict"] == "rounding");
  CHECK(c.report["blame_summary"].get<std::string>().rfind("no entry introduces an error beyond the expected rounding",
                                                           0) == 0);
  MESSAGE("deep stack: " << blame.size() << " diverging entries blamed: " << rounding << " rounding, " << propagated
                         << " propagated; " << c.report["blame_summary"].get<std::string>());
}

TEST_CASE("statistics dumps name their suspects, and --emit-config's second pass dumps just those, enough to blame") {
  const tptest::ReferenceKernels kernels;
  tptest::TempDir tmp;
  const fs::path base(tmp.path());
  const auto statistics_dump = [](twins::TwinRun& r, const fs::path& dir, tp::Options options) {
    tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(options.dump_path(dir.string()));
    dbg.start(r.model);
    twins::step(r);
    dbg.stop();
    dbg.step();
    return only_rank(dir);
  };
  twins::TwinRun bench_run = twins::load("transformer"), target_run = twins::load("transformer");
  const fs::path bench = statistics_dump(bench_run, base / "bench", tp::Options());
  twins::planted_fault() = "gelu_tanh";
  const fs::path target = statistics_dump(target_run, base / "target", tp::Options());
  twins::planted_fault().clear();
  const fs::path config = base / "second_pass.json";
  const Compared c = compare(target, bench, base / "out", tp::compare::JudgeMode::tol, 10, config);
  INFO(c.log);
  REQUIRE(c.status == 1);
  CHECK_FALSE(c.report.contains("blame"));  // statistics: nothing to replay
  const Json& suspects = c.report["suspects"];
  REQUIRE(suspects.is_array());
  REQUIRE(!suspects.empty());
  // The source's inputs agree and its output does not: an infinite amplification; the gelu.
  CHECK(suspects[0]["entry"].get<std::string>().find(".gelu.") != std::string::npos);
  CHECK(suspects[0]["amplification"] == "inf");
  CHECK(suspects[0]["arguments_differ"] == true);  // approximate="tanh" against "none"
  for (std::size_t i = 1; i < suspects.size(); ++i) {
    CAPTURE(suspects[i].dump());
    const bool forward = suspects[i]["entry"].get<std::string>().find(".forward") != std::string::npos;
    CHECK(suspects[i].contains("amplification") == forward);
    // After the source, each call gets the error with its inputs: a finite ratio.
    if (forward) CHECK(suspects[i]["amplification"].is_number());
  }

  // The two configs: msprobe's keys, each side's names, the suspects' calls only.
  const fs::path bench_config = base / "second_pass_bench.json";
  REQUIRE(fs::exists(config));
  REQUIRE(fs::exists(bench_config));
  const Json tc = tptest::read_json(config), bc = tptest::read_json(bench_config);
  CHECK(tc["task"] == "tensor");
  CHECK(tc["step"] == Json::array({0}));
  CHECK(tc["level"] == "L1");
  const auto list_of = [](const Json& cfg) { return cfg["tensor"]["list"].get<std::vector<std::string>>(); };
  // One item per call at L1: a call's forward and backward suspects share it.
  std::set<std::string> calls;
  for (const auto& x : suspects) calls.insert(tp::compare::details::list_item_of(x["entry"].get<std::string>()));
  REQUIRE(list_of(tc).size() == calls.size());
  CHECK(list_of(tc)[0] == suspects[0]["entry"].get<std::string>().substr(0, list_of(tc)[0].size()));
  CHECK(list_of(bc).size() == list_of(tc).size());
  for (const auto& item : list_of(tc)) CHECK(item.back() == '.');  // msprobe's list matches substrings
  // After the source each forward call only passes the error on: neither much damped nor amplified.
  for (const auto& x : suspects)
    if (x.contains("amplification") && x["amplification"].is_number()) {
      CAPTURE(x.dump());
      // how many times the output's error is its inputs': its definition
      CHECK(x["amplification"].get<double>() ==
            doctest::Approx(x["output_error"].get<double>() / x["input_error"].get<double>()));
      CHECK(x["amplification"].get<double>() > 0.05);
      CHECK(x["amplification"].get<double>() < 20);
    }

  // The second pass: each side run again with its config.
  twins::TwinRun bench2 = twins::load("transformer"), target2 = twins::load("transformer");
  const fs::path b2 =
      tensor_dump<tp::Level::L1>(bench2, base / "bench2", tp::Options().config_file(bench_config.string()));
  twins::planted_fault() = "gelu_tanh";
  const fs::path t2 = tensor_dump<tp::Level::L1>(target2, base / "target2", tp::Options().config_file(config.string()));
  twins::planted_fault().clear();
  for (const auto& [dir, cfg] : {std::pair<fs::path, Json>{t2, tc}, std::pair<fs::path, Json>{b2, bc}}) {
    const Json d = tptest::read_json(dir / "dump.json");
    CHECK(d["task"] == "tensor");
    for (const auto& kv : d["data"].items()) {
      bool listed = false;
      for (const auto& call : list_of(cfg)) listed = listed || kv.key().rfind(call, 0) == 0;
      CHECK_MESSAGE(listed, kv.key());
    }
    CHECK(d["data"].size() >= list_of(cfg).size());  // each listed call's forward, at least
  }
  const Compared again = compare(t2, b2, base / "out2");
  INFO(again.log);
  CHECK(again.status == 1);
  REQUIRE(again.report["blame"].is_array());
  REQUIRE(!again.report["blame"].empty());
  const Json& first = again.report["blame"][0];
  CHECK(first["entry"].get<std::string>().find(".gelu.") != std::string::npos);
  CHECK(first["verdict"] == "introduced here");
  for (std::size_t i = 1; i < again.report["blame"].size(); ++i)
    CHECK(again.report["blame"][i]["verdict"] == "propagated");
}

TEST_CASE("blame on damaged dumps: an entry it cannot replay says why, the rest is blamed, nothing else fails") {
  const tptest::ReferenceKernels kernels;
  tptest::TempDir tmp;
  const fs::path base(tmp.path());
  twins::TwinRun bench_run = twins::load("transformer"), target_run = twins::load("transformer");
  const fs::path bench = tensor_dump<tp::Level::L1>(bench_run, base / "bench");
  twins::planted_fault() = "gelu_tanh";
  const fs::path target = tensor_dump<tp::Level::L1>(target_run, base / "target");
  twins::planted_fault().clear();
  // The bench's gelu input is gone; the target's next matmul names a file outside dump_tensor_data.
  REQUIRE(fs::remove(bench / "dump_tensor_data" / "Aten.gelu.0.forward.input.0.pt"));
  Json d = tptest::read_json(target / "dump.json");
  REQUIRE(d["data"].contains("Aten.matmul.1.forward"));
  d["data"]["Aten.matmul.1.forward"]["input_args"][0]["data_name"] = "../../bench/dump.json";
  std::ofstream(target / "dump.json") << d.dump();
  // --emit-config into a directory that does not exist: said, and the rest written all the same.
  const Compared c =
      compare(target, bench, base / "out", tp::compare::JudgeMode::tol, 10, base / "no_such_dir" / "second.json", true);
  INFO(c.log);
  CHECK(c.status == 1);
  CHECK(c.log.find("no_such_dir/second.json: cannot be written") != std::string::npos);
  const Json& blame = c.report["blame"];
  REQUIRE(blame.is_array());
  REQUIRE(blame.size() >= 3);
  INFO(blame.dump(1));
  CHECK(blame[0]["entry"] == "Aten.gelu.0.forward");
  CHECK(blame[0]["verdict"] == "not replayed");
  CHECK(blame[0]["why"].get<std::string>().find("Aten.gelu.0.forward.input.0.pt") != std::string::npos);
  CHECK(blame[1]["entry"] == "Aten.matmul.1.forward");
  CHECK(blame[1]["verdict"] == "not replayed");
  CHECK(blame[1]["why"].get<std::string>().find("../../bench/dump.json") != std::string::npos);
  CHECK(blame[2]["verdict"] == "propagated");  // the next call is blamed as before
  // The CSV still has msprobe's columns and the blame's after them.
  std::string csv;
  for (const auto& e : fs::directory_iterator(base / "out"))
    if (e.path().extension() == ".csv") csv = tptest::read_text(e.path());
  CHECK(csv.substr(0, csv.find('\n')).find(",Blame,Local Err,") != std::string::npos);
}

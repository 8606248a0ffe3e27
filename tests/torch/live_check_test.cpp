// The live check (issue 47, item 3; msprobe's bench_path + diff_nums): the compare-twins corpus's
// transformer, dumped once faithfully as the reference, then run again with a fault planted and
// judged entry by entry against that reference while it runs. The check must name the entry the
// offline compare of the same two runs names, save the tensors of just the entries where a
// difference starts, and those tensors must let blame replay the divergence.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "torchprobe/analysis/compare/cli.hpp"
#include "torchprobe/analysis/run_ut/blame_replay.hpp"
#include "twin_run.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

using twins::only_rank;

// One step of the twin dumped by task T at level L; what the Debugger said on standard error in *said.
template <tp::Level L, tp::Task T>
fs::path dump(twins::TwinRun& r, const fs::path& dir, tp::Options options, std::string* said = nullptr) {
  std::ostringstream err;
  std::streambuf* const before = std::cerr.rdbuf(err.rdbuf());
  try {
    tp::Debugger<L, T> dbg(options.dump_path(dir.string()));
    dbg.start(r.model);
    twins::step(r);
    dbg.stop();
    dbg.step();
  } catch (...) {
    std::cerr.rdbuf(before);
    throw;
  }
  std::cerr.rdbuf(before);
  if (said) *said = err.str();
  return only_rank(dir);
}

Json compare(const fs::path& target, const fs::path& bench, const fs::path& out, tp::compare::JudgeMode mode) {
  tp::compare::CompareOptions o;
  o.target = target;
  o.bench = bench;
  o.out = out;
  o.mode = mode;
  o.blame = 3;
  o.timestamp = "20261207000000";
  o.blame_fn = [](const Json& request) { return tp::run_ut::blame_replay(request); };
  std::ostringstream log;
  tp::compare::run_compare(o, log);
  REQUIRE_MESSAGE(fs::exists(out / "first_divergence.json"), log.str());
  return tptest::read_json(out / "first_divergence.json");
}

struct Plant {
  const char* fault;
  const char* cause;  // blame's verdict of the first divergence
  std::function<void(twins::TwinRun&)> apply;
};

const std::vector<Plant>& plants() {
  static const std::vector<Plant> kPlants = {
      {"block.fc1 run in bfloat16", "introduced here",
       [](twins::TwinRun& r) {
         for (auto& c : r.model->named_modules())
           if (c.key() == "block.fc1") c.value()->to(torch::kBFloat16);
         twins::planted_fault() = "bf16_fc1";
       }},
      {"every element of block.fc2.weight times (1 + 1000 * 2^-23)", "parameter source",
       [](twins::TwinRun& r) {
         torch::NoGradGuard no_grad;
         for (auto& p : r.model->named_parameters())
           if (p.key() == "block.fc2.weight") p.value().mul_(1 + 1000 * std::ldexp(1.0, -23));
       }},
  };
  return kPlants;
}

// The entries of a dump.json that name a .pt file.
std::set<std::string> entries_with_files(const fs::path& rank_dir) {
  std::set<std::string> out;
  const Json d = tptest::read_json(rank_dir / "dump.json");
  for (const auto& kv : d["data"].items())
    if (kv.value().dump().find("\"data_name\"") != std::string::npos) out.insert(kv.key());
  return out;
}

}  // namespace

TEST_CASE(
    "the live check names the offline compare's first divergence, saves only where a difference starts, and "
    "blame replays it from those files") {
  const tptest::ReferenceKernels kernels;
  for (const Plant& plant : plants()) {
    for (const std::string level : {"mix", "L1"}) {
      const std::string fault = plant.fault;
      CAPTURE(fault);
      CAPTURE(level);
      tptest::TempDir tmp;
      const fs::path base(tmp.path());
      // The reference: the faithful twin, every tensor saved (so blame can replay the bench side).
      twins::TwinRun clean = twins::load("transformer");
      const fs::path bench = level == "L1"
                                 ? dump<tp::Level::L1, tp::Task::Tensor>(clean, base / "bench", tp::Options())
                                 : dump<tp::Level::Mix, tp::Task::Tensor>(clean, base / "bench", tp::Options());
      // The checked run: task tensor with bench_path (msprobe's pairing), judged against the
      // reference as it goes; three sources saved at most.
      twins::TwinRun run = twins::load("transformer");
      plant.apply(run);
      std::string said;
      const tp::Options checked = tp::Options().bench_path(bench.string()).diff_nums(3);
      const fs::path target = level == "L1"
                                  ? dump<tp::Level::L1, tp::Task::Tensor>(run, base / "target", checked, &said)
                                  : dump<tp::Level::Mix, tp::Task::Tensor>(run, base / "target", checked, &said);
      twins::planted_fault().clear();
      // The same check from a statistics run: the same findings, the same files.
      twins::TwinRun stats_run = twins::load("transformer");
      plant.apply(stats_run);
      const fs::path stats_target =
          level == "L1" ? dump<tp::Level::L1, tp::Task::Statistics>(stats_run, base / "stats", checked)
                        : dump<tp::Level::Mix, tp::Task::Statistics>(stats_run, base / "stats", checked);
      twins::planted_fault().clear();
      INFO(said);
      REQUIRE(fs::exists(target / "live_check.json"));
      const Json live = tptest::read_json(target / "live_check.json");
      INFO(live.dump(1));
      const Json offline = compare(target, bench, base / "out", tp::compare::JudgeMode::tol);
      INFO(offline.dump(1).substr(0, 4000));

      // The same first entry as the offline compare of the same runs, said on standard error as it happened.
      REQUIRE(offline["first_divergence"].is_object());
      const std::string first = offline["first_divergence"]["entry"].get<std::string>();
      REQUIRE(live["first_divergence"].is_object());
      CHECK(live["first_divergence"]["entry"] == first);
      CHECK(live["first_divergence"]["source"] == true);
      CHECK(said.find("live check: " + first) != std::string::npos);
      // C++ against C++: every name pairs but those of the calls only one run makes (the casts into
      // and out of a bfloat16 layer).
      std::size_t only_target = 0;
      const Json bench_data = tptest::read_json(bench / "dump.json")["data"];
      const Json target_data = tptest::read_json(target / "dump.json")["data"];
      for (const auto& kv : target_data.items()) only_target += bench_data.contains(kv.key()) ? 0 : 1;
      CHECK(live["entries_checked"].get<std::size_t>() - live["entries_paired"].get<std::size_t>() == only_target);
      CHECK(live["unpaired"].size() == only_target);
      CHECK(live["entries_differing"].get<int>() > 3);  // the error carries on

      // Files for the saved entries only: at most diff_nums, each a source, the first among them.
      std::set<std::string> saved_listed;
      for (const Json& d : live["differing"]) {
        if (d["saved"] == true) {
          saved_listed.insert(d["entry"].get<std::string>());
          CHECK(d["source"] == true);
        }
      }
      const std::set<std::string> with_files = entries_with_files(target);
      CHECK(with_files == saved_listed);
      CHECK(with_files.count(first) == 1);
      CHECK(with_files.size() <= 3);
      CHECK(live["entries_saved"].get<std::size_t>() == with_files.size());
      const Json stats_live = tptest::read_json(stats_target / "live_check.json");
      CHECK(stats_live["first_divergence"] == live["first_divergence"]);
      CHECK(stats_live["differing"] == live["differing"]);
      CHECK(entries_with_files(stats_target) == with_files);
      for (const auto& e : fs::directory_iterator(target / "dump_tensor_data")) {
        const std::string f = e.path().filename().string();
        bool named = false;
        for (const std::string& n : with_files) named = named || f.rfind(n + ".", 0) == 0;
        CHECK_MESSAGE(named, f << " belongs to no saved entry");
      }

      // Those files reproduce the divergence: blame replays the first entry from them and finds the fault.
      REQUIRE(offline["blame"].is_array());
      REQUIRE(!offline["blame"].empty());
      const Json& b = offline["blame"][0];
      CHECK(b["entry"] == first);
      CHECK(b["verdict"] == plant.cause);
    }
  }
}

TEST_CASE("the live check of a faithful run finds nothing and saves nothing; with checksums it is bitwise") {
  const tptest::ReferenceKernels kernels;
  tptest::TempDir tmp;
  const fs::path base(tmp.path());
  twins::TwinRun a = twins::load("transformer");
  const fs::path ref = dump<tp::Level::Mix, tp::Task::Statistics>(a, base / "ref", tp::Options());
  twins::TwinRun b = twins::load("transformer");
  const fs::path same =
      dump<tp::Level::Mix, tp::Task::Statistics>(b, base / "same", tp::Options().bench_path(ref.string()));
  const Json live = tptest::read_json(same / "live_check.json");
  CHECK(live["entries_checked"].get<int>() > 20);
  CHECK(live["entries_paired"] == live["entries_checked"]);
  CHECK(live["entries_differing"] == 0);
  CHECK(live["first_divergence"].is_null());
  // dump_tensor_data/ is made for the first file saved: here none.
  CHECK(!fs::exists(same / "dump_tensor_data"));
  // dump.json is the one a run without the check writes: no data_name, the same entries.
  CHECK(entries_with_files(same).empty());
  CHECK(tptest::read_json(same / "dump.json")["data"].size() == tptest::read_json(ref / "dump.json")["data"].size());

  // A later step where nothing differs writes no live_check.json (the first step's says the check runs).
  {
    twins::TwinRun again = twins::load("transformer");
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(
        tp::Options().dump_path((base / "two").string()).bench_path(ref.string()));
    for (int s = 0; s < 2; ++s) {
      for (auto& p : again.model->parameters()) p.mutable_grad() = torch::Tensor();  // the same gradients
      dbg.start(again.model);
      twins::step(again);
      dbg.stop();
      dbg.step();
    }
  }
  CHECK(fs::exists(only_rank(base / "two") / "live_check.json"));
  REQUIRE(fs::is_directory(base / "two" / "step1"));
  for (const auto& e : fs::directory_iterator(base / "two" / "step1")) {
    CHECK(fs::exists(e.path() / "dump.json"));
    CHECK(!fs::exists(e.path() / "live_check.json"));
  }

  // md5 against md5: the same run has equal checksums; the weight 1000 ulps off differs bitwise,
  // and the first difference is the offline compare's (exact mode: checksums).
  const tp::Options md5 = tp::Options().summary_mode("md5");
  twins::TwinRun c = twins::load("transformer");
  const fs::path md5_ref = dump<tp::Level::L1, tp::Task::Statistics>(c, base / "md5_ref", md5);
  twins::TwinRun d = twins::load("transformer");
  const fs::path md5_same =
      dump<tp::Level::L1, tp::Task::Statistics>(d, base / "md5_same", tp::Options(md5).bench_path(md5_ref.string()));
  CHECK(tptest::read_json(md5_same / "live_check.json")["entries_differing"] == 0);
  CHECK(tptest::read_json(md5_same / "live_check.json")["judged_by"] == "md5: equal checksums");
  twins::TwinRun e = twins::load("transformer");
  plants()[1].apply(e);
  const fs::path md5_fault = dump<tp::Level::L1, tp::Task::Statistics>(
      e, base / "md5_fault", tp::Options(md5).bench_path(md5_ref.string()).diff_nums(-1));
  const Json live_md5 = tptest::read_json(md5_fault / "live_check.json");
  const Json offline = compare(md5_fault, md5_ref, base / "out", tp::compare::JudgeMode::exact);
  REQUIRE(offline["first_divergence"].is_object());
  CHECK(live_md5["first_divergence"]["entry"] == offline["first_divergence"]["entry"]);
  CHECK(live_md5["diff_nums"] == -1);
  CHECK(live_md5["entries_saved"].get<int>() >= 1);
}

TEST_CASE("against msprobe's Python dump the live check pairs the modules and names the planted one") {
  const tptest::ReferenceKernels kernels;
  tptest::TempDir tmp;
  const fs::path python = twins::kTwins / "transformer" / "mix";
  twins::TwinRun clean = twins::load("transformer");
  const fs::path same = dump<tp::Level::Mix, tp::Task::Statistics>(clean, fs::path(tmp.path()) / "clean",
                                                                   tp::Options().bench_path(python.string()));
  const Json live = tptest::read_json(same / "live_check.json");
  INFO(live.dump(1));
  CHECK(live["reference_float_sums"] == true);
  CHECK(live["entries_paired"].get<int>() >= 10);  // the module entries, forward and backward
  CHECK(live["entries_paired"].get<int>() < live["entries_checked"].get<int>());  // Aten.* has no Python namesake
  CHECK(live["entries_differing"] == 0);

  twins::TwinRun run = twins::load("transformer");
  plants()[0].apply(run);
  std::string said;
  const fs::path target = dump<tp::Level::Mix, tp::Task::Statistics>(run, fs::path(tmp.path()) / "fault",
                                                                     tp::Options().bench_path(python.string()), &said);
  twins::planted_fault().clear();
  const Json found = tptest::read_json(target / "live_check.json");
  INFO(found.dump(1));
  REQUIRE(found["first_divergence"].is_object());
  CHECK(found["first_divergence"]["entry"] == "Module.block.fc1.Linear.forward.0");
  CHECK(said.find("live check: Module.block.fc1.Linear.forward.0 in Module.block.Block.forward.0 "
                  "(module path block) differs from") != std::string::npos);
}

TEST_CASE("a bench_path that cannot be read, or is no dump, is refused with the key named") {
  tptest::TempDir tmp;
  const auto refused = [&](const std::string& path) {
    try {
      tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp / "d").bench_path(path));
    } catch (const tp::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string missing = refused(tmp / "nothing_here.json");
  CHECK(missing.find("bench_path") != std::string::npos);
  CHECK(missing.find("nothing_here.json") != std::string::npos);
  { std::ofstream(tmp / "broken.json") << "{\"data\": {\"Aten.add.0.forward\": [1, 2"; }
  const std::string broken = refused(tmp / "broken.json");
  CHECK(broken.find("bench_path") != std::string::npos);
  CHECK(broken.find("not valid JSON") != std::string::npos);
  { std::ofstream(tmp / "deep.json") << std::string(100000, '[') << std::string(100000, ']'); }
  CHECK(refused(tmp / "deep.json").find("512") != std::string::npos);
  { std::ofstream(tmp / "no_data.json") << "{\"task\": \"statistics\"}"; }
  CHECK(refused(tmp / "no_data.json").find("no \"data\" object") != std::string::npos);
  CHECK(refused("").find("bench_path") != std::string::npos);
  try {
    tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(
        tp::Options().dump_path(tmp / "d").bench_path(tmp / "broken.json").diff_nums(0));
    FAIL("diff_nums 0 was accepted");
  } catch (const tp::ConfigError& e) {
    CHECK(std::string(e.what()).find("diff_nums") != std::string::npos);
  }
}

// torchprobe ranks' cross-rank view (analysis/compare/ranks.hpp) on the hand-written three-rank dump
// of tests/data/ranks, changed here one value at a time.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "torchprobe/analysis/compare/ranks.hpp"

namespace fs = std::filesystem;
namespace ranks = torchprobe::compare::ranks;

TEST_CASE("a collective whose output differs on one rank is the first disagreement: that rank, entry and output") {
  const fs::path src = fs::path(TORCHPROBE_TESTS_DIR) / "data" / "ranks" / "step0";
  const fs::path dir = fs::temp_directory_path() / ("tp_ranks_" + std::to_string(::getpid())) / "step0";
  fs::remove_all(dir.parent_path());
  fs::create_directories(dir.parent_path());
  fs::copy(src, dir, fs::copy_options::recursive);
  {  // As committed, the all-reduce's outputs agree and nothing disagrees.
    const ranks::StepView v = ranks::view_step(dir, 0);
    REQUIRE(v.collectives.size() == 1);
    CHECK(v.collectives[0].outputs_agree);
    CHECK_FALSE(v.first.has_value());
  }
  // Rank 1's all-reduce output a little off (a reduction that went wrong on that rank).
  const fs::path dump = dir / "rank1" / "dump.json";
  nlohmann::ordered_json d = nlohmann::ordered_json::parse(std::ifstream(dump));
  d["data"]["Distributed.all_reduce.0.forward"]["output"][0]["Max"] = 0.61;
  std::ofstream(dump) << d.dump(1);

  const ranks::StepView v = ranks::view_step(dir, 0);
  REQUIRE(v.collectives.size() == 1);
  CHECK(v.collectives[0].name == "Distributed.all_reduce.0.forward");
  CHECK(v.collectives[0].entered == std::vector<long>{0, 1, 2});
  CHECK_FALSE(v.collectives[0].inputs_agree);  // each rank's own gradient, as committed
  CHECK_FALSE(v.collectives[0].outputs_agree);
  REQUIRE(v.first.has_value());
  CHECK(v.first->rank == 1);
  CHECK(v.first->entry == "Distributed.all_reduce.0.forward");
  CHECK(v.first->item == "output.0");
  CHECK(v.first->agreeing == std::vector<long>{0, 2});
  std::ostringstream text;
  CHECK(ranks::print_views({v}, text) == 1);
  CHECK(text.str().find("outputs differ") != std::string::npos);
  fs::remove_all(dir.parent_path());
}

namespace {

using OJson = nlohmann::ordered_json;

OJson stat(double max, std::vector<int> shape = {4, 8}) {
  return {{"type", "torch.Tensor"}, {"dtype", "torch.float32"}, {"shape", shape},       {"Max", max}, {"Min", -max},
          {"Mean", max / 10},       {"Norm", 2 * max},          {"requires_grad", true}};
}

// A step directory of ranks, each rank's "data" given; removed at the end.
struct StepDir {
  static inline int made = 0;  // each its own folder
  fs::path root =
      fs::temp_directory_path() / ("tp_ranks_l0_" + std::to_string(::getpid()) + "_" + std::to_string(++made));
  explicit StepDir(const std::vector<OJson>& data) {
    fs::remove_all(root);
    for (std::size_t r = 0; r < data.size(); ++r) {
      const fs::path dir = root / "step0" / ("rank" + std::to_string(r));
      fs::create_directories(dir);
      OJson doc = {{"task", "statistics"},
                   {"level", "L0"},
                   {"framework", "pytorch"},
                   {"dump_data_dir", nullptr},
                   {"data", data[r]}};
      // Python's json writes an inf as the bare word Infinity (nlohmann would write null).
      std::string text = doc.dump(1);
      for (std::size_t at; (at = text.find("\"Infinity\"")) != std::string::npos;) text.replace(at, 10, "Infinity");
      for (std::size_t at; (at = text.find("\"NaN\"")) != std::string::npos;) text.replace(at, 5, "NaN");
      std::ofstream(dir / "dump.json") << text;
    }
  }
  ~StepDir() { fs::remove_all(root); }
  fs::path step() const { return root / "step0"; }
};

// An L0 module entry: its own input and output (each rank's data), its parameters.
OJson module_entry(double input, double weight, double bias) {
  return {{"input_args", {stat(input, {2, 8})}},
          {"input_kwargs", OJson::object()},
          {"output", {stat(input / 2, {2, 4})}},
          {"parameters", {{"weight", stat(weight)}, {"bias", stat(bias, {4})}}}};
}

}  // namespace

TEST_CASE("at L0, a module parameter that one rank of two holds differently is named with its module entry") {
  // Two ranks: the lone-outlier rule for other data needs three, a parameter is replicated anyway.
  {
    StepDir same({{{"Module.fc.Linear.forward.0", module_entry(1.0, 0.5, 0.1)}},
                  {{"Module.fc.Linear.forward.0", module_entry(3.0, 0.5, 0.1)}}});
    const ranks::StepView v = ranks::view_step(same.step(), 0);
    CHECK_FALSE(v.first.has_value());  // inputs and outputs are each rank's own: they may differ
    CHECK(v.replicated.parameters == 2);
    CHECK(v.replicated.collective_outputs == 0);
    std::ostringstream text;
    CHECK(ranks::print_views({v}, text) == 0);
    CHECK(text.str().find(
              "  treated as replicated: 2 module parameters, 0 outputs of all_reduce/broadcast/all_gather\n") !=
          std::string::npos);
  }
  StepDir drift({{{"Module.fc.Linear.forward.0", module_entry(1.0, 0.5, 0.1)}},
                 {{"Module.fc.Linear.forward.0", module_entry(3.0, 0.5005, 0.1)}}});
  const ranks::StepView v = ranks::view_step(drift.step(), 0);
  REQUIRE(v.first.has_value());
  CHECK(v.first->rank == 1);
  CHECK(v.first->entry == "Module.fc.Linear.forward.0");
  CHECK(v.first->item == "parameters.weight");
  CHECK(v.first->shape == "[4,8]");
  CHECK(v.first->agreeing == std::vector<long>{0});
  REQUIRE(v.first_parameter.has_value());
  CHECK(v.first_parameter->item == "parameters.weight");
  std::ostringstream text;
  CHECK(ranks::print_views({v}, text) == 1);
  CHECK(text.str().find("first disagreement: step 0, rank 1, Module.fc.Linear.forward.0 parameters.weight (shape "
                        "[4,8]) differs from ranks 0\n") != std::string::npos);
  // The parameter is the first disagreement itself: not said twice.
  CHECK(text.str().find("first module parameter that differs") == std::string::npos);
}

TEST_CASE("a parameters_grad is compared only where the dump shows it reduced before capture, or the user says so") {
  const std::string grad = "Module.fc.Linear.parameters_grad.0";
  const auto reduce = [](double own, double sum) {
    return OJson{{"input_args", {stat(own)}}, {"input_kwargs", OJson::object()}, {"output", {stat(sum)}}};
  };
  SUBCASE("a gradient without evidence of its reduction is each rank's own: left out, even with one rank off") {
    // Captured before its all_reduce, or reduced by code the dump does not show.
    StepDir d({{{grad, {{"weight", {stat(0.2)}}}}},
               {{grad, {{"weight", {stat(0.2)}}}}},
               {{grad, {{"weight", {stat(0.5)}}}}}});
    const ranks::StepView v = ranks::view_step(d.step(), 0);
    CHECK(v.replicated.gradients == 0);
    CHECK(v.replicated.own_gradients == 1);
    // Never inferred from agreement: two ranks equal and one off is each rank's own data here.
    CHECK_FALSE(v.first.has_value());
    std::ostringstream text;
    CHECK(ranks::print_views({v}, text) == 0);
    CHECK(text.str().find(", 0 parameter gradients reduced before capture (1 not: each rank's own)\n") !=
          std::string::npos);
  }
  SUBCASE("a gradient an earlier all_reduce output is replicated: the rank that changed it afterwards is named") {
    StepDir d({{{"Distributed.all_reduce.0.forward", reduce(0.2, 0.9)}, {grad, {{"weight", {stat(0.9)}}}}},
               {{"Distributed.all_reduce.0.forward", reduce(0.3, 0.9)}, {grad, {{"weight", {stat(0.9)}}}}},
               {{"Distributed.all_reduce.0.forward", reduce(0.4, 0.9)}, {grad, {{"weight", {stat(0.3)}}}}}});
    const ranks::StepView v = ranks::view_step(d.step(), 0);
    CHECK(v.replicated.gradients == 1);
    CHECK(v.replicated.collective_outputs == 1);
    REQUIRE(v.first.has_value());
    CHECK(v.first->rank == 2);
    CHECK(v.first->entry == grad);
    CHECK(v.first->item == "weight.0");
    CHECK(v.first->agreeing == std::vector<long>{0, 1});
  }
  SUBCASE("--grads-reduced: every gradient is replicated, with two ranks and no all_reduce entry") {
    StepDir d({{{grad, {{"weight", {stat(0.2)}}, {"bias", {stat(0.1, {4})}}}}},
               {{grad, {{"weight", {stat(0.2)}}, {"bias", {stat(0.7, {4})}}}}}});
    CHECK_FALSE(ranks::view_step(d.step(), 0).first.has_value());
    ranks::ViewOptions said;
    said.grads_reduced = true;
    const ranks::StepView v = ranks::view_step(d.step(), 0, said);
    CHECK(v.replicated.gradients == 2);
    REQUIRE(v.first.has_value());
    CHECK(v.first->rank == 1);
    CHECK(v.first->item == "bias.0");
    CHECK(v.first->shape == "[4]");
  }
}

TEST_CASE("the first inf is named at the rank that made it, not on every rank its all_reduce reached") {
  OJson inf = stat(1.0);
  inf["Max"] = "Infinity";  // written as Python writes it
  const auto reduce = [](const OJson& in, const OJson& out) {
    return OJson{{"input_args", {in}}, {"input_kwargs", OJson::object()}, {"output", {out}}};
  };
  const auto mul = [](const OJson& out) {
    return OJson{{"input_args", {stat(1.0)}}, {"input_kwargs", OJson::object()}, {"output", {out}}};
  };
  SUBCASE("made by an op on rank 1, carried to ranks 0 and 2 by the all_reduce") {
    StepDir d({{{"Aten.mul.0.forward", mul(stat(1.0))}, {"Distributed.all_reduce.0.forward", reduce(stat(1.0), inf)}},
               {{"Aten.mul.0.forward", mul(inf)}, {"Distributed.all_reduce.0.forward", reduce(inf, inf)}},
               {{"Aten.mul.0.forward", mul(stat(3.0))}, {"Distributed.all_reduce.0.forward", reduce(stat(3.0), inf)}}});
    const ranks::StepView v = ranks::view_step(d.step(), 0);
    REQUIRE(v.nonfinite.has_value());
    CHECK(v.nonfinite->rank == 1);
    CHECK(v.nonfinite->entry == "Aten.mul.0.forward");
    CHECK(v.nonfinite->item == "output.0");
    CHECK(v.nonfinite->inputs_finite);
    CHECK(v.nonfinite->reached == std::vector<long>{0, 2});
    CHECK(v.nonfinite->through == "Distributed.all_reduce.0.forward");
    CHECK_FALSE(v.first.has_value());  // the reduction's output is the same inf everywhere
    std::ostringstream text;
    CHECK(ranks::print_views({v}, text) == 0);
    CHECK(text.str().find("first non-finite value: step 0, rank 1, Aten.mul.0.forward output.0 (made there: its "
                          "inputs are finite); reached ranks 0,2 through Distributed.all_reduce.0.forward\n") !=
          std::string::npos);
  }
  SUBCASE("already in rank 2's all_reduce input: made by code the dump does not show") {
    StepDir d({{{"Distributed.all_reduce.0.forward", reduce(stat(1.0), inf)}},
               {{"Distributed.all_reduce.0.forward", reduce(stat(2.0), inf)}},
               {{"Distributed.all_reduce.0.forward", reduce(inf, inf)}}});
    const ranks::StepView v = ranks::view_step(d.step(), 0);
    REQUIRE(v.nonfinite.has_value());
    CHECK(v.nonfinite->rank == 2);
    CHECK(v.nonfinite->item == "input_args.0");
    CHECK_FALSE(v.nonfinite->inputs_finite);
    CHECK(v.nonfinite->reached == std::vector<long>{0, 1});
  }
  SUBCASE("a NaN every rank holds in a parameter is no disagreement; finite dumps say nothing of it") {
    OJson nan_entry = module_entry(1.0, 0.5, 0.1);
    nan_entry["parameters"]["weight"]["Mean"] = "NaN";  // written as Python writes it
    StepDir same({{{"Module.fc.Linear.forward.0", nan_entry}}, {{"Module.fc.Linear.forward.0", nan_entry}}});
    CHECK_FALSE(ranks::view_step(same.step(), 0).first.has_value());
    StepDir one(
        {{{"Module.fc.Linear.forward.0", nan_entry}}, {{"Module.fc.Linear.forward.0", module_entry(1.0, 0.5, 0.1)}}});
    const ranks::StepView off = ranks::view_step(one.step(), 0);
    REQUIRE(off.first.has_value());
    CHECK(off.first->item == "parameters.weight");
    StepDir d({{{"Module.fc.Linear.forward.0", module_entry(1.0, 0.5, 0.1)}},
               {{"Module.fc.Linear.forward.0", module_entry(2.0, 0.5, 0.1)}}});
    const ranks::StepView v = ranks::view_step(d.step(), 0);
    CHECK_FALSE(v.nonfinite.has_value());
    std::ostringstream text;
    ranks::print_views({v}, text);
    CHECK(text.str().find("non-finite") == std::string::npos);
  }
}

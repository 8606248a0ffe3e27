// torchprobe ranks' cross-rank view (analysis/compare/ranks.hpp) on the hand-written three-rank dump
// of tests/data/ranks, changed here one value at a time.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
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

// ---- ranks_digest.bin (io/rank_digest.hpp): what the probe writes beside each rank's dump.json ----

namespace {

namespace io = torchprobe::io;

// Each rank's ranks_digest.bin made from its dump.json as compare reads it (Python's NaN and
// Infinity included), as the probe makes it from the same entries at dump time.
void write_digests(const StepDir& d, std::size_t ranks) {
  for (std::size_t r = 0; r < ranks; ++r) {
    const fs::path dir = d.step() / ("rank" + std::to_string(r));
    const OJson doc = torchprobe::compare::read_json_file(dir / "dump.json");
    io::RankDigestBuilder digest;
    for (auto it = doc["data"].begin(); it != doc["data"].end(); ++it)
      digest.add<io::rank_items::NlohmannNodes>(it.key(), &it.value());
    std::ofstream(dir / io::kRankDigestFile, std::ios::binary) << io::encode_rank_digest(digest.digest());
  }
}

std::string printed(const ranks::StepView& v) {
  std::ostringstream text;
  ranks::print_views({v}, text);
  return text.str();
}

ranks::StepView without_digests(const fs::path& step) {
  ranks::ViewOptions o;
  o.digests = false;
  return ranks::view_step(step, 0, o);
}

// The facts of a view that do not depend on where it was read from.
void same_verdict(const ranks::StepView& a, const ranks::StepView& b) {
  REQUIRE(a.first.has_value() == b.first.has_value());
  if (a.first) {
    CHECK(a.first->rank == b.first->rank);
    CHECK(a.first->entry == b.first->entry);
    CHECK(a.first->item == b.first->item);
    CHECK(a.first->shape == b.first->shape);
    CHECK(a.first->agreeing == b.first->agreeing);
  }
  REQUIRE(a.nonfinite.has_value() == b.nonfinite.has_value());
  if (a.nonfinite) {
    CHECK(a.nonfinite->rank == b.nonfinite->rank);
    CHECK(a.nonfinite->entry == b.nonfinite->entry);
    CHECK(a.nonfinite->item == b.nonfinite->item);
    CHECK(a.nonfinite->inputs_finite == b.nonfinite->inputs_finite);
    CHECK(a.nonfinite->reached == b.nonfinite->reached);
    CHECK(a.nonfinite->through == b.nonfinite->through);
  }
  CHECK(a.replicated.parameters == b.replicated.parameters);
  CHECK(a.replicated.collective_outputs == b.replicated.collective_outputs);
  CHECK(a.replicated.gradients == b.replicated.gradients);
  CHECK(a.replicated.own_gradients == b.replicated.own_gradients);
  REQUIRE(a.collectives.size() == b.collectives.size());
  for (std::size_t i = 0; i < a.collectives.size(); ++i) {
    CHECK(a.collectives[i].name == b.collectives[i].name);
    CHECK(a.collectives[i].entered == b.collectives[i].entered);
    CHECK(a.collectives[i].inputs_agree == b.collectives[i].inputs_agree);
    CHECK(a.collectives[i].outputs_agree == b.collectives[i].outputs_agree);
  }
}

OJson reduce_entry(const OJson& in, const OJson& out) {
  return {{"input_args", {in}}, {"input_kwargs", OJson::object()}, {"output", {out}}};
}

}  // namespace

TEST_CASE("read from the ranks' digests, the view reaches the verdicts it reaches from dump.json, and says so") {
  OJson inf = stat(1.0);
  inf["Max"] = "Infinity";
  const std::string grad = "Module.fc.Linear.parameters_grad.0";
  SUBCASE("a parameter one rank of two holds differently (L0)") {
    StepDir d({{{"Module.fc.Linear.forward.0", module_entry(1.0, 0.5, 0.1)}},
               {{"Module.fc.Linear.forward.0", module_entry(3.0, 0.5005, 0.1)}}});
    const ranks::StepView json = ranks::view_step(d.step(), 0);
    const std::string json_text = printed(json);
    write_digests(d, 2);
    const ranks::StepView digest = ranks::view_step(d.step(), 0);
    CHECK(digest.source.digests);
    REQUIRE(digest.first.has_value());
    CHECK(digest.first->item == "parameters.weight");
    same_verdict(digest, json);
    CHECK(printed(digest).find("  read from the ranks' ranks_digest.bin (") != std::string::npos);
    // --no-digest: the text of the view before the digests were there, byte for byte.
    CHECK(printed(without_digests(d.step())) == json_text);
  }
  SUBCASE("a gradient shown reduced, which one rank changed after the reduction") {
    StepDir d(
        {{{"Distributed.all_reduce.0.forward", reduce_entry(stat(0.2), stat(0.9))}, {grad, {{"weight", {stat(0.9)}}}}},
         {{"Distributed.all_reduce.0.forward", reduce_entry(stat(0.3), stat(0.9))}, {grad, {{"weight", {stat(0.9)}}}}},
         {{"Distributed.all_reduce.0.forward", reduce_entry(stat(0.4), stat(0.9))},
          {grad, {{"weight", {stat(0.3)}}}}}});
    const ranks::StepView json = ranks::view_step(d.step(), 0);
    write_digests(d, 3);
    const ranks::StepView digest = ranks::view_step(d.step(), 0);
    CHECK(digest.source.digests);
    REQUIRE(digest.first.has_value());
    CHECK(digest.first->entry == grad);
    same_verdict(digest, json);
  }
  SUBCASE("an inf made on rank 1 and carried to the others by the all_reduce") {
    const auto mul = [](const OJson& out) { return reduce_entry(stat(1.0), out); };
    StepDir d(
        {{{"Aten.mul.0.forward", mul(stat(1.0))}, {"Distributed.all_reduce.0.forward", reduce_entry(stat(1.0), inf)}},
         {{"Aten.mul.0.forward", mul(inf)}, {"Distributed.all_reduce.0.forward", reduce_entry(inf, inf)}},
         {{"Aten.mul.0.forward", mul(stat(3.0))}, {"Distributed.all_reduce.0.forward", reduce_entry(stat(3.0), inf)}}});
    const ranks::StepView json = ranks::view_step(d.step(), 0);
    write_digests(d, 3);
    const ranks::StepView digest = ranks::view_step(d.step(), 0);
    CHECK(digest.source.digests);
    REQUIRE(digest.nonfinite.has_value());
    CHECK(digest.nonfinite->entry == "Aten.mul.0.forward");  // not kept in the digest, but found while writing it
    same_verdict(digest, json);
  }
}

TEST_CASE("a digest keeps collectives, module parameters and gradients: each rank's own data stays in dump.json") {
  // Rank 2's op input differs where ranks 0 and 1 agree (the lone-outlier rule of dump.json), and
  // rank 2 holds the module's weight differently.
  const auto op = [](double x) { return reduce_entry(stat(x), stat(2 * x)); };
  StepDir d({{{"Aten.t.0.forward", op(0.5)}, {"Module.fc.Linear.forward.0", module_entry(1.0, 0.5, 0.1)}},
             {{"Aten.t.0.forward", op(0.5)}, {"Module.fc.Linear.forward.0", module_entry(2.0, 0.5, 0.1)}},
             {{"Aten.t.0.forward", op(0.7)}, {"Module.fc.Linear.forward.0", module_entry(3.0, 0.7, 0.1)}}});
  write_digests(d, 3);
  const io::RankDigest rank2 = io::read_rank_digest((d.step() / "rank2" / io::kRankDigestFile).string());
  CHECK(rank2.dump_entries == 2);
  REQUIRE(rank2.entries.size() == 1);  // the module's entry; Aten.t is the rank's own data
  CHECK(rank2.strings[rank2.entries[0].name] == "Module.fc.Linear.forward.0");
  REQUIRE(rank2.entries[0].items == 2);  // its parameters, not its input and output
  CHECK(rank2.strings[rank2.items[0].site] == "parameters.weight");
  CHECK(rank2.strings[rank2.items[0].shape] == "[4,8]");
  CHECK(rank2.strings[rank2.items[1].site] == "parameters.bias");

  const ranks::StepView json = without_digests(d.step());
  REQUIRE(json.first.has_value());
  CHECK(json.first->entry == "Aten.t.0.forward");
  const ranks::StepView digest = ranks::view_step(d.step(), 0);
  REQUIRE(digest.first.has_value());
  CHECK(digest.first->rank == 2);
  CHECK(digest.first->entry == "Module.fc.Linear.forward.0");
  CHECK(digest.first->item == "parameters.weight");
  CHECK(printed(digest).find("each rank's own data is only in dump.json (--no-digest reads it)") != std::string::npos);
}

TEST_CASE("a step where a rank has dump.json and no digest is read from dump.json, and the view says which rank") {
  StepDir d({{{"Module.fc.Linear.forward.0", module_entry(1.0, 0.5, 0.1)}},
             {{"Module.fc.Linear.forward.0", module_entry(1.0, 0.5, 0.1)}},
             {{"Module.fc.Linear.forward.0", module_entry(1.0, 0.5, 0.1)}}});
  write_digests(d, 3);
  fs::remove(d.step() / "rank1" / io::kRankDigestFile);
  const ranks::StepView v = ranks::view_step(d.step(), 0);
  CHECK_FALSE(v.source.digests);
  CHECK(printed(v).find("  ranks 1 have no ranks_digest.bin: every rank is read from dump.json\n") !=
        std::string::npos);
  // A rank with its digest only (its dump.json not gathered) counts as present.
  write_digests(d, 3);
  fs::remove(d.step() / "rank2" / "dump.json");
  const ranks::StepView gathered = ranks::view_step(d.step(), 0);
  CHECK(gathered.source.digests);
  CHECK(gathered.ranks == std::vector<long>{0, 1, 2});
}

TEST_CASE("a digest cut short, altered, of another version or made up is refused with its path and what is wrong") {
  StepDir d({{{"Distributed.all_reduce.0.forward", reduce_entry(stat(0.2), stat(0.9))}},
             {{"Distributed.all_reduce.0.forward", reduce_entry(stat(0.3), stat(0.9))}}});
  write_digests(d, 2);
  const fs::path file = d.step() / "rank1" / io::kRankDigestFile;
  std::string good;
  {
    std::ifstream in(file, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  REQUIRE(good.size() > 24);
  namespace raw = io::rank_digest_details;
  const auto u32 = [](std::uint32_t v) {
    std::string s;
    raw::put32(s, v);
    return s;
  };
  std::string version2 = good;
  version2[4] = 2;
  std::string flipped = good;
  flipped[16] ^= 0x20;  // the checksum
  // Payloads of valid files (right header, size and checksum) whose content lies.
  const std::string no_strings = u32(0) + std::string(8, '\0');  // ... then the entry count is missing
  const std::string bad_id = u32(1) + u32(1) + "x" + std::string(8, '\0') + u32(1) + u32(7) + u32(0);
  const std::string big_count = u32(0xfffffff0u);
  const std::string trailing = u32(0) + std::string(8, '\0') + u32(0) + std::string(1, '\0') + u32(0xffffffffu) + "!";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {good.substr(0, 10), "does not begin with TorchProbe's digest header"},
      {good.substr(0, good.size() - 3), "bytes of data where its header says"},
      {"TPRX" + good.substr(4), "does not begin with TorchProbe's digest header"},
      {version2, "its version is 2; this build reads version 1"},
      {flipped, "its checksum does not match its data"},
      {raw::pack(no_strings), "it ends inside entries"},
      {raw::pack(bad_id), "entry name is string 7, past the 1 strings"},
      {raw::pack(big_count), "its count of strings (4294967280) is more than the file holds"},
      {raw::pack(trailing), "it has bytes after its end"},
  };
  for (const auto& [bytes, why] : cases) {
    CAPTURE(why);
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    try {
      (void)io::read_rank_digest(file.string());
      FAIL("read");
    } catch (const io::RankDigestError& e) {
      const std::string what = e.what();
      CHECK(what.find(file.string() + ": not a readable ranks_digest.bin: ") == 0);
      CHECK(what.find(why) != std::string::npos);
    }
    // Every rank has its dump.json: the step is read from them, and the view says why.
    const ranks::StepView v = ranks::view_step(d.step(), 0);
    CHECK_FALSE(v.source.digests);
    CHECK(v.source.note.find(why) != std::string::npos);
    CHECK(v.source.note.find("; every rank is read from dump.json") != std::string::npos);
    CHECK(v.collectives.size() == 1);
  }
  // Without rank 1's dump.json there is nothing to fall back on: an error that names the file.
  fs::remove(d.step() / "rank1" / "dump.json");
  try {
    (void)ranks::view_step(d.step(), 0);
    FAIL("viewed");
  } catch (const torchprobe::compare::InputError& e) {
    CHECK(std::string(e.what()).find(file.string() + ": not a readable ranks_digest.bin: ") == 0);
  }
}

TEST_CASE("a list of more than 16 ranks is printed with its runs as ranges; a shorter one as it always was") {
  CHECK(ranks::join({0, 1, 2, 3}) == "0,1,2,3");
  CHECK(ranks::join({}) == "-");
  std::vector<long> many;
  for (long r = 0; r < 4096; ++r)
    if (r != 7 && r != 9) many.push_back(r);
  CHECK(ranks::join(many) == "0-6,8,10-4095");
  CHECK(ranks::join({0, 1, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 19}) == "0,1,3-5,7-17,19");
}

// Issue 48, item 2: msprobe's offline NaN/inf analyzer (nan_analyze), run on a TorchProbe dump of 4
// Gloo ranks where rank 1 wrote an inf into its gradient before the all_reduce; its output is
// committed beside the dump (tests/data/nan_analyze/README.md says how both were made).
TEST_CASE("the dump's first inf is at the rank and op where msprobe's own nan_analyze puts it") {
  const fs::path root = fs::path(TORCHPROBE_TESTS_DIR) / "data" / "nan_analyze" / "inf_mix";
  const OJson msprobe = torchprobe::compare::read_json_file(root / "msprobe" / "anomaly_analyze.json");
  REQUIRE(msprobe.size() == 1);  // one rank made it: msprobe names that rank's first anomalous op
  const std::string key = msprobe.begin().key();
  REQUIRE(key.rfind("rank_", 0) == 0);
  const long rank = std::stol(key.substr(5));
  const std::string op = msprobe.begin().value().at(0).at("op_name").get<std::string>();
  CHECK(rank == 1);
  CHECK(op.rfind("Aten.fill_.", 0) == 0);
  for (const bool digests : {true, false}) {
    CAPTURE(digests);
    ranks::ViewOptions options;
    options.digests = digests;
    const ranks::StepView v = ranks::view_step(root / "step1", 1, options);
    CHECK(v.source.digests == digests);
    REQUIRE(v.nonfinite.has_value());
    CHECK(v.nonfinite->rank == rank);
    CHECK(v.nonfinite->entry == op);
    CHECK(v.nonfinite->inputs_finite);  // made there: fill_'s inf is a scalar argument, not a tensor's
    CHECK(v.nonfinite->reached == std::vector<long>{0, 2, 3});
  }
}

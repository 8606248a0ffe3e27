// The group form of `torchprobe compare --map`: API calls against sequences of calls, with an
// argument map, forward and backward (hand-written dumps of tests/unit/compare_support.hpp).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "compare_support.hpp"
#include "torchprobe/analysis/compare/cli.hpp"

namespace {
namespace fs = std::filesystem;
using namespace torchprobe::compare;
using namespace tp_compare_test;

// The bench computes fc3 with one fused call whose arguments are (x, W, b) where the target has
// Aten.t(W) then Aten.addmm(b, x, W^T); its backward gives the gradients of (x, W, b).
Dir fused_fc3(double bias_scale) {
  const Dir same = three_linear(Variant::same);
  Dir d;
  for (auto it = same.data.begin(); it != same.data.end(); ++it) {
    const std::string& k = it.key();
    const Json& e = it.value();
    const char* parent =
        same.construct[k].is_null() ? nullptr : same.construct[k].get_ref<const std::string&>().c_str();
    if (k == "Aten.t.2.forward") continue;
    if (k == "Aten.addmm.2.forward") {  // addmm(b, x, W^T) -> fused(x, W, b)
      const Json& w = same.data["Aten.t.2.forward"]["input_args"][0];
      Json f = e;
      Json bias = e["input_args"][0];
      for (const char* s : {"Max", "Min", "Mean", "Norm"}) bias[s] = bias[s].get<double>() * bias_scale;
      f["input_args"] = Json::array({e["input_args"][1], w, bias});
      d.add("Custom.fused_linear.0.forward", f, parent);
    } else if (k == "Aten.addmm.2.backward") {  // grads of (b, x, W^T) -> grads of (x, W, b)
      Json f = e;
      Json gw = e["output"][2];
      gw["shape"] = Json::array({gw["shape"][1], gw["shape"][0]});
      f["output"] = Json::array({e["output"][1], gw, e["output"][0]});
      d.add("Custom.fused_linear.0.backward", f, parent);
    } else {
      d.add(k, e, parent);
    }
  }
  return d;
}

struct Compared {
  int status;
  nlohmann::ordered_json report;
  std::string log;
};

Compared run(const fs::path& dir, const std::string& map_text, const std::string& out) {
  std::ofstream(dir / (out + ".yaml")) << map_text;
  CompareOptions o = parse_compare_args({(dir / "a").string(), (dir / "b").string(), "-o", (dir / out).string(),
                                         "--map", (dir / (out + ".yaml")).string()});
  std::ostringstream log;
  Compared c{run_compare(o, log), {}, log.str()};
  if (fs::exists(dir / out / "first_divergence.json")) c.report = read_json_file(dir / out / "first_divergence.json");
  return c;
}

const char* kFusedMap =
    "# fc3: t + addmm in the target, one fused call in the bench\n"
    "[Aten.t, Aten.addmm]: Custom.fused_linear {1.input.1: input.0, 0.input.0: input.1, 1.input.0: input.2, "
    "1.output.0: output.0}\n";

}  // namespace

TEST_CASE("a group item pairs t + addmm with one fused call, forward and backward, through its argument map") {
  const fs::path dir = temp_dir("group");
  three_linear(Variant::same).write(dir / "a");
  fused_fc3(1.0).write(dir / "b");
  const Compared c = run(dir, kFusedMap, "out");
  INFO(c.log);
  CHECK(c.status == 0);
  CHECK(c.report["summary"]["target_only"] == 0);
  CHECK(c.report["summary"]["bench_only"] == 0);
  CHECK(c.report["summary"]["paired_map"] == 2);  // the forward run and the backward entry

  // The same bench with fc3's bias scaled: only the argument map links addmm's input.0 to the fused
  // call's input.2, so the divergence is found exactly there.
  fused_fc3(1.5).write(dir / "b");
  const Compared d = run(dir, kFusedMap, "out2");
  INFO(d.log);
  CHECK(d.status == 1);
  const auto& first = d.report["first_diverging_entry"];
  REQUIRE(first.is_object());
  CHECK(first["entry"] == "Aten.t.2.forward");
  CHECK(first["target_group"] == Json::array({"Aten.t.2.forward", "Aten.addmm.2.forward"}));
  CHECK(first["bench_entries"] == Json::array({"Custom.fused_linear.0.forward"}));
  CHECK(first["match"] == "map");
  CHECK(first["worst_input_row"] == "Aten.addmm.2.forward.input.0");
  fs::remove_all(dir);
}

TEST_CASE("a group item of API names pairs every call of one with the same call of the other, in order") {
  const fs::path dir = temp_dir("group_api");
  three_linear(Variant::same).write(dir / "a");
  Dir b = three_linear(Variant::same);
  Json renamed = Json::object();
  for (auto it = b.data.begin(); it != b.data.end(); ++it) {
    std::string k = it.key();
    if (k.rfind("Aten.relu.", 0) == 0) k = "Aten.my_relu." + k.substr(10);
    renamed[k] = it.value();
  }
  b.data = renamed;
  b.write(dir / "b");
  const Compared c = run(dir, "Aten.relu: Aten.my_relu\n", "out");
  INFO(c.log);
  CHECK(c.status == 0);
  CHECK(c.report["summary"]["paired_map"] == 2);
  CHECK(c.report["summary"].value("paired_value", 0) == 0);
  fs::remove_all(dir);
}

TEST_CASE("a bad group item is bad input naming the file, the line and what is expected") {
  const fs::path dir = temp_dir("group_bad");
  const std::pair<const char*, const char*> cases[] = {
      {"Functional.linear: [Aten.t, Aten.addmm\n", "a group item is"},
      {"[Aten.t, Aten.mm]: [Aten.t, Aten.addmm]\n", "a list on one side at most"},
      {"Functional.linear: [Aten.t, Aten.addmm] {input.0: 2.input.1}\n", "argument 'input.0: 2.input.1'"},
      {"Functional.linear: [Aten.t, Aten.addmm] {weight: 0.input.0}\n", "is not '[k.]input.N"},
      {"Functional.linear: Aten.linear {input.0: input.0\n", "must end with '}'"},
  };
  for (const auto& [text, needle] : cases) {
    CAPTURE(text);
    std::ofstream(dir / "m.yaml") << "# first line\n" << text;
    std::string what;
    try {
      read_user_map(dir / "m.yaml");
    } catch (const InputError& e) {
      what = e.what();
    }
    CHECK(what.find((dir / "m.yaml").string() + ":2: ") != std::string::npos);
    CHECK(what.find(needle) != std::string::npos);
  }
  fs::remove_all(dir);
}

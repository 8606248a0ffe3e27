// TorchProbe against msprobe's own dumps of the same programs, entry by entry: the md5 (CRC-32)
// and xor checksums of the quick-start model (md5_mix, xor_L1) and every field of the program of
// argument kinds (types_L1), where TorchProbe's deliberate differences must be exactly those.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "reference_program.hpp"
#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using Ptr = Json::json_pointer;

namespace {

// Python's json writes NaN, Infinity and -Infinity as bare tokens, which nlohmann refuses: they are
// read as the strings "NaN", "Infinity" and "-Infinity" (no string value of dump.json is one).
Json read_python_json(const std::string& path) {
  const std::string text = tptest::read_text(path);
  REQUIRE_MESSAGE(!text.empty(), path);
  std::string out;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\')
        out += text[++i];
      else if (c == '"')
        in_string = false;
      continue;
    }
    in_string = c == '"';
    const char* token = nullptr;
    for (const char* t : {"-Infinity", "Infinity", "NaN"})
      if (!token && text.compare(i, std::strlen(t), t) == 0) token = t;
    if (!token) {
      out += c;
      continue;
    }
    out += std::string("\"") + token + "\"";
    i += std::strlen(token) - 1;
  }
  return Json::parse(out);
}

// msprobe's dump.json "data" of step `s` in tests/data/reference-dumps/{name} (one process folder per step).
Json reference(const std::string& name, int s) {
  const std::string dir =
      std::string(TORCHPROBE_TESTS_DIR) + "/data/reference-dumps/" + name + "/step" + std::to_string(s);
  std::vector<fs::path> procs{fs::directory_iterator(dir), fs::directory_iterator()};
  REQUIRE(procs.size() == 1);
  return read_python_json((procs[0] / "dump.json").string())["data"];
}

Json ours_step(const tptest::TempDir& tmp, int s) {
  return read_python_json(tmp.path() + "/step" + std::to_string(s) + "/proc" + std::to_string(::getpid()) +
                          "/dump.json")["data"];
}

// Calls visit(pointer, item) for every item ({"type": ...}: a tensor or another value) of an entry.
void for_each_item(const Json& j, const Ptr& at, const std::function<void(const Ptr&, const Json&)>& visit) {
  if (j.is_object() && j.contains("type")) {
    visit(at, j);
  } else if (j.is_array()) {
    for (std::size_t k = 0; k < j.size(); ++k) for_each_item(j[k], at / k, visit);
  } else if (j.is_object()) {
    for (const auto& kv : j.items()) for_each_item(kv.value(), at / kv.key(), visit);
  }
}

std::vector<std::string> keys_of(const Json& j) {
  std::vector<std::string> keys;
  for (const auto& kv : j.items()) keys.push_back(kv.key());
  return keys;
}

// ---- md5_mix and xor_L1: the quick-start model, seed 1234, two steps -------------------------

// Where the C++ program's dump holds the tensor msprobe's Python dump has at (entry, pointer). The
// pairing follows the tensors each call receives (compare-spec §4): modules and parameters_grad keep
// their names; {Functional,Tensor}.{api}.{n} is Aten.{api}.{n} with the same slots; F.linear(x, W, b)
// is the C++ frontend's addmm(b, x, t(W)), so x and b are Aten.addmm's inputs 1 and 0, W is
// Aten.t's input, and the output and the backward ([db, dx, dWᵀ] on both sides) are addmm's.
std::pair<std::string, Ptr> ours_of(const std::string& entry, const Ptr& ptr) {
  if (entry.rfind("Module.", 0) == 0) return {entry, ptr};
  const std::string api = entry.substr(entry.find('.') + 1);  // "linear.0.forward"
  if (api.rfind("linear.", 0) != 0) return {"Aten." + api, ptr};
  const std::string count_and_direction = api.substr(std::strlen("linear."));
  if (ptr == Ptr("/input_args/1")) return {"Aten.t." + count_and_direction, Ptr("/input_args/0")};
  if (ptr == Ptr("/input_args/0")) return {"Aten.addmm." + count_and_direction, Ptr("/input_args/1")};
  if (ptr == Ptr("/input_args/2")) return {"Aten.addmm." + count_and_direction, Ptr("/input_args/0")};
  return {"Aten.addmm." + count_and_direction, ptr};
}

// Runs msprobe's program (start(model), x = randn(2, 8), relu(fc(x)).sum().backward(), stop, step;
// twice) under TorchProbe; returns the two steps' dump.json data.
template <tp::Level L>
std::vector<Json> run_quick_start(const char* summary_mode) {
  tptest::TempDir tmp;
  tptest::run_reference_program<L>(tmp.path(), summary_mode);
  return {ours_step(tmp, 0), ours_step(tmp, 1)};
}

// Compares every tensor of msprobe's step with the one ours pairs it with: type, dtype, shape,
// requires_grad and the "md5" key (CRC-32, or XOR / the 0-d value) exactly, and with `statistics`
// Max/Min exactly and Mean/Norm within 1e-6. Returns how many tensors were compared; adds the
// entries of ours that were paired to `paired`.
int compare_checksums(const Json& theirs, const Json& ours, bool statistics, std::set<std::string>& paired) {
  int compared = 0;
  for (const auto& e : theirs.items()) {
    for_each_item(e.value(), Ptr(), [&](const Ptr& ptr, const Json& their_item) {
      const std::pair<std::string, Ptr> mapped = ours_of(e.key(), ptr);
      const std::string& name = mapped.first;
      const Ptr& at = mapped.second;
      CAPTURE(e.key());
      CAPTURE(ptr.to_string());
      CAPTURE(name);
      CAPTURE(at.to_string());
      REQUIRE(ours.contains(name));
      REQUIRE(ours[name].contains(at));
      Json o = ours[name][at], t = their_item;  // non-const: a missing key reads as null
      CHECK(t["type"] == "torch.Tensor");
      for (const char* key : {"type", "dtype", "shape", "requires_grad", "md5"}) {
        CAPTURE(std::string(key));
        CHECK(o[key] == t[key]);
      }
      if (statistics) tptest::check_same_statistics(o, t, /*extrema_rel=*/0.0);
      paired.insert(name);
      ++compared;
    });
  }
  return compared;
}

}  // namespace

TEST_CASE(
    "summary_mode md5 at level mix: every CRC-32 equals the one msprobe wrote for the same tensor of the quick-start "
    "model") {
  std::vector<Json> ours = run_quick_start<tp::Level::Mix>("md5");
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    Json theirs = reference("md5_mix", s);
    std::set<std::string> paired;
    // All of msprobe's tensors: linear 4 + fc forward 4 + relu 2 + sum 2 (forward); sum 2, relu 2,
    // linear 4, parameters_grad 2, fc backward 2.
    CHECK(compare_checksums(theirs, ours[s], /*statistics=*/true, paired) == 24);
    CHECK(theirs.size() == 9);
    // Ours has one more entry, the backward of the transpose: its input is dWᵀ, the tensor msprobe
    // gives as the third output of linear's backward.
    std::set<std::string> unpaired;
    for (const auto& kv : ours[s].items())
      if (!paired.count(kv.key())) unpaired.insert(kv.key());
    CHECK(unpaired == std::set<std::string>{"Aten.t.0.backward"});
    CHECK(ours[s]["Aten.t.0.backward"]["input"][0]["md5"] ==
          theirs["Functional.linear.0.backward"]["output"][2]["md5"]);
  }
  // The two steps differ where the tensors do (x, and the accumulated gradients of step 1).
  CHECK(ours[0]["Aten.addmm.0.forward"]["input_args"][1]["md5"] !=
        ours[1]["Aten.addmm.0.forward"]["input_args"][1]["md5"]);
  CHECK(ours[0]["Module.fc.Linear.parameters_grad.0"]["weight"][0]["md5"] !=
        ours[1]["Module.fc.Linear.parameters_grad.0"]["weight"][0]["md5"]);
}

TEST_CASE(
    "summary_mode xor at L1: every XOR word, and the value of the 0-d loss, equal what msprobe wrote for the same "
    "tensor") {
  std::vector<Json> ours = run_quick_start<tp::Level::L1>("xor");
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    Json theirs = reference("xor_L1", s);
    std::set<std::string> paired;
    // linear 4, relu 2, sum 2 (forward); sum 2, relu 2, linear 4 (backward)
    CHECK(compare_checksums(theirs, ours[s], /*statistics=*/false, paired) == 16);
    CHECK(paired == std::set<std::string>{"Aten.t.0.forward", "Aten.addmm.0.forward", "Aten.relu.0.forward",
                                          "Aten.sum.0.forward", "Aten.sum.0.backward", "Aten.relu.0.backward",
                                          "Aten.addmm.0.backward"});
    CHECK(ours[s].size() == 8);  // and Aten.t.0.backward
    CHECK(ours[s]["Aten.t.0.backward"]["input"][0]["md5"] ==
          theirs["Functional.linear.0.backward"]["output"][2]["md5"]);
    // xor mode writes no statistics, as msprobe
    for (const char* key : {"Max", "Min", "Mean", "Norm"})
      CHECK_FALSE(ours[s]["Aten.relu.0.forward"]["output"][0].contains(key));
  }
}

// ---- types_L1: one step of many argument kinds at L1 ------------------------------------------

namespace {

// msprobe's entry, ours, and where ours holds an item msprobe wrote elsewhere: C++ has no keyword
// arguments for these ops, so ATen's schema makes Python's keywords positional. An empty target
// means no counterpart: F.pad's mode (constant_pad_nd is the constant mode), and x.to("cpu")'s
// string, which C++ passes as a torch.device keyword.
struct EntryPair {
  const char* theirs;
  const char* ours;
  std::map<std::string, std::string> moved;
};

const std::vector<EntryPair> kTypesPairs = {
    {"Torch.add.0.forward", "Aten.add.0.forward", {{"/input_kwargs/alpha", "/input_args/2"}}},
    {"Tensor.to.0.forward", "Aten.to.0.forward", {}},  // msprobe wrote {} for the positional dtype
    {"Tensor.to.1.forward", "Aten.to.1.forward", {{"/input_kwargs/dtype", "/input_args/1"}}},
    {"Tensor.__mul__.0.forward", "Aten.mul.0.forward", {}},
    {"Tensor.to.2.forward", "Aten.to.2.forward", {{"/input_args/1", ""}}},
    {"Torch.cat.0.forward", "Aten.cat.0.forward", {{"/input_kwargs/dim", "/input_args/1"}}},
    {"Torch.full.0.forward", "Aten.full.0.forward", {}},
    {"Torch.mul.0.forward", "Aten.mul.1.forward", {}},
    {"Torch.add.1.forward", "Aten.add.1.forward", {}},
    {"Torch.arange.0.forward", "Aten.arange.0.forward", {}},
    {"Torch.add.2.forward", "Aten.add.2.forward", {}},
    {"Torch.gt.0.forward", "Aten.gt.0.forward", {}},
    {"Torch.add.3.forward", "Aten.add.3.forward", {}},
    {"Torch.mul.1.forward", "Aten.mul.2.forward", {}},
    {"Torch.einsum.0.forward", "Aten.einsum.0.forward", {{"/input_args/1", "/input_args/1/0"}}},
    {"Functional.pad.0.forward",
     "Aten.constant_pad_nd.0.forward",
     {{"/input_kwargs/mode", ""}, {"/input_kwargs/value", "/input_args/2"}}},
    {"Torch.add.4.forward", "Aten.add.4.forward", {}},
    {"Torch.sum.0.forward",
     "Aten.sum.0.forward",
     {{"/input_kwargs/dim", "/input_args/1"}, {"/input_kwargs/keepdim", "/input_args/2"}}},
};

double as_double(const Json& v) {
  if (v.is_string()) return v == "NaN" ? NAN : v == "Infinity" ? INFINITY : -INFINITY;
  return v.get<double>();
}

// v rounded to a dtype, as a double.
double rounded(double v, at::ScalarType dtype) {
  return torch::tensor(v, at::kDouble).to(dtype).to(at::kDouble).item<double>();
}

struct TypesResult {
  int tensors = 0, values = 0, unpaired = 0;
  int deliberate = 0;        // Mean/Norm that msprobe leaves null or computes in fp16/bf16
  int float32_rounding = 0;  // Mean/Norm one float32 rounding apart
};

// Mean and Norm of a tensor item. msprobe 26 reduces in the tensor's dtype and leaves integer and
// float64 tensors null; TorchProbe accumulates every real dtype in double (docs/statistics.md).
// For the tensors of `known`, whose dtype is one of those, the difference is asserted to be there.
void compare_mean_norm(Json o, Json t, const at::Tensor* known, TypesResult& r) {
  const std::string dtype = t["dtype"].get<std::string>();
  const bool reduced =
      t["shape"].size() > 0 && t["dtype"] != "torch.bool" && !t["Max"].is_null();  // not 0-d, bool, empty
  const bool deliberate = reduced && (dtype == "torch.int64" || dtype == "torch.float64" || dtype == "torch.float16" ||
                                      dtype == "torch.bfloat16");
  REQUIRE_MESSAGE((known != nullptr) == deliberate,
                  "a tensor of a deliberate difference must be known, and only those");
  for (const char* key : {"Mean", "Norm"}) {
    CAPTURE(std::string(key));
    if (deliberate) {
      const at::Tensor d = known->to(at::kDouble);
      const double want = key == std::string("Mean") ? d.mean().item<double>() : d.norm().item<double>();
      REQUIRE(o[key].is_number());
      CHECK(o[key].get<double>() == doctest::Approx(want).epsilon(1e-12));  // ours: double accumulation
      if (dtype == "torch.int64" || dtype == "torch.float64") {
        CHECK(t[key].is_null());
      } else {
        CHECK(t[key].get<double>() == rounded(o[key].get<double>(), known->scalar_type()));
        CHECK(t[key] != o[key]);
      }
      ++r.deliberate;
    } else if (o[key] != t[key] && reduced && dtype == "torch.float32") {
      // msprobe's torch.mean / torch.norm in float32: our double value rounded, within one float32 step
      const float ours = static_cast<float>(as_double(o[key])), theirs = static_cast<float>(as_double(t[key]));
      CHECK(static_cast<double>(theirs) == as_double(t[key]));
      CHECK((theirs == ours || theirs == std::nextafter(ours, INFINITY) || theirs == std::nextafter(ours, -INFINITY)));
      ++r.float32_rounding;
    } else {
      CHECK(o[key] == t[key]);
    }
  }
}

// Every item msprobe wrote for the types program against ours; `known` maps "entry pointer" to the
// C++ tensor of each deliberate difference.
TypesResult compare_types(const Json& theirs, const Json& ours, const std::map<std::string, at::Tensor>& known) {
  TypesResult r;
  for (const EntryPair& p : kTypesPairs) {
    CAPTURE(std::string(p.theirs));
    REQUIRE(theirs.contains(p.theirs));
    REQUIRE(ours.contains(p.ours));
    for_each_item(theirs[p.theirs], Ptr(), [&](const Ptr& ptr, const Json& their_item) {
      CAPTURE(ptr.to_string());
      std::string at = ptr.to_string();
      for (const auto& move : p.moved)
        if (at.rfind(move.first, 0) == 0) at = move.second.empty() ? "" : move.second + at.substr(move.first.size());
      if (at.empty()) {
        ++r.unpaired;
        return;
      }
      CAPTURE(at);
      REQUIRE(ours[p.ours].contains(Ptr(at)));
      Json o = ours[p.ours][Ptr(at)], t = their_item;
      if (t["type"] != "torch.Tensor") {
        CHECK(o == t);
        ++r.values;
        return;
      }
      CHECK(keys_of(o) == keys_of(t));
      for (const char* key : {"type", "dtype", "shape", "Max", "Min", "requires_grad"}) {
        CAPTURE(std::string(key));
        CHECK(o[key] == t[key]);
      }
      const auto k = known.find(std::string(p.theirs) + " " + ptr.to_string());
      compare_mean_norm(o, t, k == known.end() ? nullptr : &k->second, r);
      ++r.tensors;
    });
  }
  return r;
}

}  // namespace

TEST_CASE(
    "types_L1: every field of msprobe's dump of many argument kinds, with only TorchProbe's deliberate Mean/Norm "
    "differences") {
  tptest::TempDir tmp;
  std::map<std::string, at::Tensor> known;
  {
    tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp.path()).extra_info(false));
    // run_types.py, in C++. Its inputs made outside msprobe's hooks are made before start();
    // the lines msprobe wrote nothing for (view, slicing, complex) are left out.
    torch::manual_seed(0);
    const at::Tensor x = torch::randn({2, 4});
    const at::Tensor nan = torch::tensor({NAN, 1.0f});
    const at::Tensor e = torch::empty({0});
    const at::Tensor sc = torch::tensor(-3.0f);
    const at::Tensor z = torch::zeros({2}, torch::dtype(at::kDouble).device(at::kCPU));
    dbg.start();
    torch::add(x, 2, 0.5);
    const at::Tensor h = x.to(at::kHalf);
    const at::Tensor bf = x.to(at::kBFloat16);
    const at::Tensor m = bf * 3;
    x.to(at::kCPU);
    torch::cat({x, x}, 0);
    const at::Tensor inf = torch::full({3}, INFINITY);
    torch::mul(inf, -1);
    torch::add(nan, 1);
    const at::Tensor ints = torch::arange(5);
    const at::Tensor i2 = torch::add(ints, 1);
    torch::gt(x, 0);
    torch::add(e, 1);
    torch::mul(sc, 2);
    torch::einsum("ij->ji", {x});
    at::constant_pad_nd(x, {1, 1}, 0.0);  // F.pad(x, (1, 1), mode="constant", value=0.0)
    const at::Tensor zz = torch::add(z, 1);
    torch::sum(x, at::IntArrayRef{0, 1}, false);
    dbg.stop();
    known = {{"Tensor.to.0.forward /output/0", h},           {"Tensor.to.1.forward /output/0", bf},
             {"Tensor.__mul__.0.forward /input_args/0", bf}, {"Tensor.__mul__.0.forward /output/0", m},
             {"Torch.arange.0.forward /output/0", ints},     {"Torch.add.2.forward /input_args/0", ints},
             {"Torch.add.2.forward /output/0", i2},          {"Torch.add.4.forward /input_args/0", z},
             {"Torch.add.4.forward /output/0", zz}};
  }
  const Json theirs = reference("types_L1", 0);
  const Json ours = ours_step(tmp, 0);
  std::vector<std::string> want_names;
  for (const EntryPair& p : kTypesPairs) want_names.push_back(p.ours);
  CHECK(keys_of(ours) == want_names);
  CHECK(theirs.size() == kTypesPairs.size());
  const TypesResult r = compare_types(theirs, ours, known);
  CHECK(r.tensors == 35);  // all of msprobe's tensor items
  CHECK(r.values == 22);   // and its 24 other values but the two without a counterpart
  CHECK(r.unpaired == 2);
  CHECK(r.deliberate == 2 * 9);  // Mean and Norm of the 9 items of `known`: 4 fp16/bf16, 3 int64, 2 float64
  MESSAGE("types_L1: " << r.tensors << " tensors, " << r.values << " other values compared; " << r.float32_rounding
                       << " float32 Mean/Norm one rounding apart");
}

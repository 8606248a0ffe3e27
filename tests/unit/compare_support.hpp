#pragma once
// Small dumps for the compare tests, written by hand: a three-Linear net (fc1 -> relu -> fc2 ->
// relu -> fc3) at level mix with TorchProbe's C++ names (Aten.t + Aten.addmm inside each Linear),
// and the variants the issue plants in fc2.
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "torchprobe/io/python_json.hpp"

namespace tp_compare_test {

using Json = nlohmann::ordered_json;
namespace fs = std::filesystem;

struct Stats {
  std::string dtype;
  std::vector<int> shape;
  double max, min, mean, norm;
  bool requires_grad = true;
};

inline Json tensor(const Stats& s) {
  Json t;
  t["type"] = "torch.Tensor";
  t["dtype"] = s.dtype;
  t["shape"] = s.shape;
  t["Max"] = s.max;
  t["Min"] = s.min;
  t["Mean"] = s.mean;
  t["Norm"] = s.norm;
  t["requires_grad"] = s.requires_grad;
  return t;
}

// The same tensor with every statistic scaled (a value change) or its dtype changed.
inline Stats scaled(Stats s, double f) {
  s.max *= f;
  s.min *= f;
  s.mean *= f;
  s.norm *= f;
  return s;
}
inline Stats as_dtype(Stats s, const std::string& dtype) {
  s.dtype = dtype;
  return s;
}

inline Json entry(const std::vector<Stats>& inputs, const std::vector<Stats>& outputs) {
  Json e;
  e["input_args"] = Json::array();
  for (const auto& s : inputs) e["input_args"].push_back(tensor(s));
  e["input_kwargs"] = Json::object();
  e["output"] = Json::array();
  for (const auto& s : outputs) e["output"].push_back(tensor(s));
  return e;
}

struct Dir {
  Json data = Json::object();
  Json construct = Json::object();
  Json stack = Json::object();
  bool python = false;  // stack frames as msprobe's Python dump writes them (net.py), else C++ ones
  void add(const std::string& name, Json e, const char* parent = nullptr) {
    data[name] = std::move(e);
    construct[name] = parent ? Json(parent) : Json();
    stack[std::to_string(stack.size())] = Json::array(
        {Json::array({name}), Json::array({std::string("File net.") + (python ? "py" : "cpp") + ", line " +
                                           std::to_string(stack.size() + 10) + ", in forward, \n " + name})});
  }
  fs::path write(const fs::path& dir, const std::string& task = "statistics") const {
    fs::create_directories(dir);
    Json d;
    d["task"] = task;
    d["level"] = "mix";
    d["framework"] = "pytorch";
    d["dump_data_dir"] = nullptr;
    d["data"] = data;
    std::ofstream out(dir / "dump.json");
    torchprobe::io::write_python_json(out, d, 1);  // NaN and Infinity as Python's json writes them
    std::ofstream(dir / "construct.json") << construct.dump(1);
    std::ofstream(dir / "stack.json") << stack.dump(1);
    return dir / "dump.json";
  }
};

// What is planted in fc2 of the bench-side dump.
enum class Variant { same, bf16_fc2, overflow_fc2, ulp_fc3 };

// fc1 -> relu -> fc2 -> relu -> fc3, forward, then the loss's backward through fc3.
inline Dir three_linear(Variant v) {
  const std::string f32 = "torch.float32", bf16 = "torch.bfloat16";
  const Stats x{f32, {8, 64}, 3.1, -2.9, 0.02, 22.5, false};
  const Stats w1{f32, {64, 64}, 0.125, -0.125, 0.001, 4.6}, b1{f32, {64}, 0.12, -0.12, 0.003, 0.56};
  const Stats h1{f32, {8, 64}, 1.9, -2.2, 0.05, 13.1}, r1{f32, {8, 64}, 1.9, 0.0, 0.41, 9.3};
  const Stats w2{f32, {64, 64}, 0.124, -0.125, -0.002, 4.61}, b2{f32, {64}, 0.11, -0.12, 0.001, 0.55};
  Stats h2{f32, {8, 64}, 1.2, -1.3, 0.03, 7.7};
  const Stats w3{f32, {16, 64}, 0.125, -0.124, 0.0005, 2.3}, b3{f32, {16}, 0.1, -0.1, 0.002, 0.23};
  const auto wt = [](Stats w) {  // W^T: same statistics, reversed shape
    std::swap(w.shape[0], w.shape[1]);
    return w;
  };
  Dir d;
  d.add("Aten.t.0.forward", entry({w1}, {wt(w1)}), "Module.fc1.Linear.forward.0");
  d.add("Aten.addmm.0.forward", entry({b1, x, wt(w1)}, {h1}), "Module.fc1.Linear.forward.0");
  Json m1 = entry({x}, {h1});
  m1["parameters"] = {{"weight", tensor(w1)}, {"bias", tensor(b1)}};
  d.add("Module.fc1.Linear.forward.0", m1);
  d.add("Aten.relu.0.forward", entry({h1}, {r1}));
  const char* fc2 = "Module.fc2.Linear.forward.0";
  Stats h2_out = h2;  // what fc2 returns
  if (v == Variant::bf16_fc2) {
    // casts inside fc2's forward: input, weight and bias to bf16, the result back to fp32
    d.add("Aten.to.0.forward", entry({r1}, {as_dtype(r1, bf16)}), fc2);
    d.add("Aten.to.1.forward", entry({w2}, {as_dtype(w2, bf16)}), fc2);
    d.add("Aten.to.2.forward", entry({b2}, {as_dtype(b2, bf16)}), fc2);
    d.add("Aten.t.1.forward", entry({as_dtype(w2, bf16)}, {as_dtype(wt(w2), bf16)}), fc2);
    const Stats h2b = as_dtype(scaled(h2, 1.002), bf16);  // bf16 rounding: 0.2 %
    d.add("Aten.addmm.1.forward", entry({as_dtype(b2, bf16), as_dtype(r1, bf16), as_dtype(wt(w2), bf16)}, {h2b}), fc2);
    h2_out = scaled(h2, 1.002);
    d.add("Aten.to.3.forward", entry({h2b}, {h2_out}), fc2);
  } else {
    d.add("Aten.t.1.forward", entry({w2}, {wt(w2)}), fc2);
    d.add("Aten.addmm.1.forward", entry({b2, r1, wt(w2)}, {h2}), fc2);
    if (v == Variant::overflow_fc2) {
      h2_out = h2;
      h2_out.max = h2_out.norm = INFINITY;
      h2_out.min = -INFINITY;
      h2_out.mean = NAN;
      d.add("Aten.mul.0.forward", entry({h2}, {h2_out}), fc2);
    }
  }
  Json m2 = entry({r1}, {h2_out});
  m2["parameters"] = {{"weight", tensor(w2)}, {"bias", tensor(b2)}};
  d.add(fc2, m2);
  const Stats r2 = scaled(Stats{f32, {8, 64}, h2_out.max, 0.0, 0.3, 5.2}, 1.0);
  d.add("Aten.relu.1.forward", entry({h2_out}, {r2}));
  Stats h3{f32, {8, 16}, 0.9, -0.8, 0.01, 2.9};
  if (v == Variant::bf16_fc2) h3 = scaled(h3, 1.003);
  if (v == Variant::ulp_fc3) h3.mean = std::nextafter(std::nextafter(h3.mean, 1.0), 1.0);  // kernel-order noise
  d.add("Aten.t.2.forward", entry({w3}, {wt(w3)}), "Module.fc3.Linear.forward.0");
  d.add("Aten.addmm.2.forward", entry({b3, r2, wt(w3)}, {h3}), "Module.fc3.Linear.forward.0");
  Json m3 = entry({r2}, {h3});
  m3["parameters"] = {{"weight", tensor(w3)}, {"bias", tensor(b3)}};
  d.add("Module.fc3.Linear.forward.0", m3);
  const Stats g{f32, {8, 16}, 1.0, 1.0, 1.0, std::sqrt(128.0), false};
  const Stats gx{f32, {8, 64}, 0.4, -0.4, 0.001, 3.3, false};
  d.add("Aten.addmm.2.backward",
        entry({g}, {Stats{f32, {16}, 8, 8, 8, 32, false}, gx, Stats{f32, {64, 16}, 2, -2, 0.1, 9, false}}),
        "Module.fc3.Linear.backward.0");
  return d;
}

inline fs::path temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("tp_compare_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

}  // namespace tp_compare_test

#pragma once
// One recorded call made callable again from its dump (blame_replay.hpp): its operator, its
// arguments rebuilt from dump.json and the .pt files, its recorded outputs; run forward as it is,
// or forward and back with given output gradients (a backward entry's replay).
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "torchprobe/analysis/run_ut/api_case.hpp"
#include "torchprobe/analysis/run_ut/inputs.hpp"
#include "torchprobe/analysis/run_ut/op_resolver.hpp"

namespace torchprobe::run_ut::replayed {

using OJson = nlohmann::ordered_json;
namespace ru = torchprobe::run_ut;

// One side's call as the replay needs it: its op, its arguments rebuilt from the dump (tensors from
// the .pt files), and its recorded outputs.
struct Call {
  std::string name;  // the entry's base name, "Aten.addmm.0"
  ru::OpTarget target;
  std::vector<ru::Arg> args;
  ru::Kwargs kwargs;
  std::vector<at::Tensor> outputs;  // the dumped outputs, flattened in row order
};

inline std::string base_name(const std::string& entry) {
  const std::string suffix = ".forward";
  return entry.size() > suffix.size() && entry.compare(entry.size() - suffix.size(), suffix.size(), suffix) == 0
             ? entry.substr(0, entry.size() - suffix.size())
             : entry;
}

// A tensor's dump.json item (a Parameter is one too): the replay needs its .pt file, never the random
// stand-in run_ut makes of a statistics-only item.
inline bool is_tensor_item(const OJson& j) {
  if (!j.contains("type") || !j["type"].is_string()) return false;
  const std::string& t = j["type"].get_ref<const std::string&>();
  return t == "torch.Tensor" || t == "torch.nn.parameter.Parameter";
}

inline void collect_outputs(const OJson& item, ru::InputBuilder& build, std::vector<at::Tensor>& out) {
  if (item.is_array()) {
    for (const auto& e : item) collect_outputs(e, build, out);
  } else if (item.is_object() && is_tensor_item(item)) {
    if (!item.contains("data_name") || !item["data_name"].is_string())
      throw ru::NotReplayable("an output tensor has no .pt file (dump it with the tensor task)");
    out.push_back(build.build(item).value.toTensor());
  } else if (item.is_object() && !item.contains("type")) {
    for (const auto& kv : item.items()) collect_outputs(kv.value(), build, out);
  }
}

inline Call read_call(const OJson& data, const std::string& entry, const std::string& data_dir) {
  if (!data.contains(entry) || !data[entry].is_object()) throw ru::NotReplayable("the dump has no entry " + entry);
  const OJson& e = data[entry];
  Call c;
  c.name = base_name(entry);
  std::string type, api;
  if (!ru::split_api_name(c.name, type, api)) throw ru::NotReplayable(c.name + " does not split into Type.api.n");
  c.target = ru::target_of(type, api);
  ru::InputBuilder build(data_dir, c.name);
  const OJson args = e.contains("input_args") ? e["input_args"] : OJson::array();
  const OJson kwargs = e.contains("input_kwargs") ? e["input_kwargs"] : OJson::object();
  if (!args.is_array() || !kwargs.is_object()) throw ru::NotReplayable(entry + ": malformed input_args/input_kwargs");
  if (kwargs.contains("out")) throw ru::NotReplayable(entry + " writes into out=, which is not replayed");
  const auto needs_file = [&](const OJson& j, const auto& self) -> void {
    if (j.is_array())
      for (const auto& x : j) self(x, self);
    else if (j.is_object() && is_tensor_item(j) && !(j.contains("data_name") && j["data_name"].is_string()))
      throw ru::NotReplayable("an input tensor of " + entry + " has no .pt file (dump it with the tensor task)");
  };
  for (const auto& a : args) {
    needs_file(a, needs_file);
    c.args.push_back(build.build(a));
  }
  for (const auto& kv : kwargs.items()) {
    needs_file(kv.value(), needs_file);
    c.kwargs.emplace_back(kv.key(), build.build(kv.value()));
  }
  if (type == "Functional") ru::adapt_functional_kwargs(c.kwargs);
  c.kwargs.erase(std::remove_if(c.kwargs.begin(), c.kwargs.end(), [](const auto& kv) { return kv.first == "device"; }),
                 c.kwargs.end());
  for (const auto& x : c.target.extra_args) c.args.push_back(x);
  collect_outputs(e.contains("output") ? e["output"] : OJson(), build, c.outputs);
  if (c.outputs.empty()) throw ru::NotReplayable(entry + " has no output tensor to compare");
  return c;
}

// The argument a row names: "input.1" (input_args[1]), "input.1.0" (an element of a tensor list),
// "input.weight" (a keyword argument). Null when the row is no tensor argument of the call.
inline ru::Arg* locate(Call& c, const std::string& row) {
  std::vector<std::string> parts;
  for (std::size_t at = 0; at <= row.size();) {
    const std::size_t dot = std::min(row.find('.', at), row.size());
    parts.push_back(row.substr(at, dot - at));
    at = dot + 1;
  }
  if (parts.size() < 2 || parts[0] != "input") return nullptr;
  ru::Arg* a = nullptr;
  const bool digits = parts[1].find_first_not_of("0123456789") == std::string::npos;
  if (digits) {
    const std::size_t i = std::stoul(parts[1]);
    if (i < c.args.size()) a = &c.args[i];
  } else {
    for (auto& kv : c.kwargs)
      if (kv.first == parts[1]) a = &kv.second;
  }
  for (std::size_t k = 2; a != nullptr && k < parts.size(); ++k) {
    if (parts[k].find_first_not_of("0123456789") != std::string::npos) return nullptr;
    const std::size_t i = std::stoul(parts[k]);
    a = i < a->items.size() ? &a->items[i] : nullptr;
  }
  return a != nullptr && a->kind == ru::ArgKind::tensor ? a : nullptr;
}

inline void for_each_tensor(Call& c, const std::function<void(ru::Arg&)>& fn) {
  const auto visit = [&](ru::Arg& a) {
    if (a.kind == ru::ArgKind::tensor) fn(a);
    for (auto& e : a.items)
      if (e.kind == ru::ArgKind::tensor) fn(e);
  };
  for (auto& a : c.args) visit(a);
  for (auto& kv : c.kwargs) visit(kv.second);
}

// Runs the op of `c` on its arguments as they are now (the first output tensors, flattened as the
// dump lists them, `count` of them).
inline std::vector<at::Tensor> run(Call c, const ru::ResolvedOp& op, std::size_t count) {
  // On copies: an in-place op (add_) would change the arguments the next replay is given.
  for_each_tensor(c, [](ru::Arg& a) { a.value = a.value.toTensor().clone(); });
  int unused = 0;
  const auto stack = ru::bind_schema(op.handle.schema(), c.args, c.kwargs, unused);
  if (!stack) throw ru::NotReplayable("the replayed arguments no longer fit " + c.name);
  at::NoGradGuard no_grad;
  std::vector<c10::IValue> s = *stack;
  op.handle.callBoxed(&s);
  std::vector<at::Tensor> out;
  for (const auto& v : s) {
    if (v.isTensor())
      out.push_back(v.toTensor());
    else if (v.isTensorList())
      for (const auto& t : v.toTensorVector()) out.push_back(t);
  }
  if (out.size() < count) throw ru::NotReplayable(c.name + " replayed gives fewer outputs than the dump holds");
  out.resize(count);
  for (auto& t : out) t = t.detach().cpu();
  return out;
}

inline void to_float64(Call& c) {
  for_each_tensor(c, [](ru::Arg& a) {
    const at::Tensor t = a.value.toTensor();
    if (t.is_floating_point()) a.value = t.to(at::kDouble);
  });
}

// A backward entry's tensors: the gradients it was given ("input") and those it made ("output": one
// per tensor argument of its call in order, null where an argument got none).
struct Gradients {
  std::vector<at::Tensor> given, made;
};

inline Gradients read_gradients(const OJson& data, const std::string& entry, const std::string& data_dir) {
  if (!data.contains(entry) || !data[entry].is_object()) throw ru::NotReplayable("the dump has no entry " + entry);
  const OJson& e = data[entry];
  ru::InputBuilder build(data_dir, base_name(entry));
  // One tensor per item, in order: a null item (an output no gradient reached, an argument that got
  // none) keeps its place as an undefined tensor.
  const auto per_item = [&](const char* key, std::vector<at::Tensor>& into) {
    const OJson list = e.contains(key) ? e[key] : OJson::array();
    if (!list.is_array()) throw ru::NotReplayable(entry + ": its " + key + " is not a list of gradients");
    for (const auto& item : list) {
      std::vector<at::Tensor> one;
      if (item.is_object()) collect_outputs(item, build, one);
      into.push_back(one.size() == 1 ? one.front() : at::Tensor());
    }
  };
  Gradients g;
  per_item("input", g.given);
  per_item("output", g.made);
  return g;
}

// The backward of a replayed call: its floating tensor arguments made leaves that require grad, its op
// run forward, and autograd taken back from its outputs with `given` (cast to each output's dtype).
// One gradient per tensor argument, in order; undefined where none reaches it.
inline std::vector<at::Tensor> run_backward(Call c, const ru::ResolvedOp& op, const std::vector<at::Tensor>& given) {
  std::vector<at::Tensor> leaves;
  for_each_tensor(c, [&](ru::Arg& a) {
    at::Tensor t = a.value.toTensor().detach().clone();
    if (t.is_floating_point()) t.requires_grad_(true);
    leaves.push_back(t);
    // The op gets a copy: an in-place op (add_) may not write into a leaf that requires grad.
    a.value = t.requires_grad() ? t.clone() : t;
  });
  at::AutoGradMode grad_mode(true);
  int unused = 0;
  const auto stack = ru::bind_schema(op.handle.schema(), c.args, c.kwargs, unused);
  if (!stack) throw ru::NotReplayable("the replayed arguments no longer fit " + c.name);
  std::vector<c10::IValue> s = *stack;
  op.handle.callBoxed(&s);
  std::vector<at::Tensor> outputs, grads;
  std::size_t k = 0;
  for (const auto& v : s) {
    if (!v.isTensor()) continue;
    const at::Tensor o = v.toTensor();
    if (k < given.size() && given[k].defined() && o.requires_grad()) {
      outputs.push_back(o);
      grads.push_back(given[k].to(o.options()).reshape(o.sizes()));
    }
    ++k;
  }
  std::vector<at::Tensor> wanted;
  for (const at::Tensor& t : leaves)
    if (t.requires_grad()) wanted.push_back(t);
  std::vector<at::Tensor> got;
  if (!outputs.empty() && !wanted.empty())
    got = torch::autograd::grad(outputs, wanted, grads, /*retain_graph=*/false, /*create_graph=*/false,
                                /*allow_unused=*/true);
  std::vector<at::Tensor> per_argument;
  std::size_t w = 0;
  for (const at::Tensor& t : leaves)
    per_argument.push_back(t.requires_grad() && w < got.size() ? got[w++].detach().cpu() : at::Tensor());
  return per_argument;
}

}  // namespace torchprobe::run_ut::replayed

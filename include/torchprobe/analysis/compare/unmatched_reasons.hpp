#pragma once
// Why an entry has no partner, when it is in one dump by nature (issue 41, items 2 and 4): a C++
// dump against msprobe's Python dump of the same model has calls that only one side can record.
// Such entries are listed with their reason (first_divergence.json's unmatched.by_nature), never
// as data missing from the other side; everything else stays target-only or bench-only.
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "torchprobe/analysis/compare/dump_reader.hpp"
#include "torchprobe/analysis/compare/entries.hpp"
#include "torchprobe/analysis/compare/statistics_origin.hpp"
#include "torchprobe/analysis/compare/templates.hpp"

namespace torchprobe::compare {

namespace details {

// msprobe 26's LOW_RISK_API_SET (msprobe/pytorch/dump/api_dump/api_risk_level.py): APIs its dump
// leaves out by default. A copy of msprobe's list, kept as msprobe spells it.
inline const std::set<std::string>& msprobe_low_risk_apis() {
  // clang-format off
  static const std::set<std::string> kLowRisk = {
      "squeeze", "unsqueeze", "reshape", "reshape_as", "view", "view_as", "flatten", "unflatten", "expand",
      "expand_as", "repeat", "repeat_interleave", "tile", "transpose", "permute", "moveaxis", "movedim", "swapaxes",
      "swapdims", "chunk", "unsafe_chunk", "split", "split_with_sizes", "unsafe_split", "unsafe_split_with_sizes",
      "tensor_split", "hsplit", "vsplit", "dsplit", "unbind", "stack", "cat", "concat", "concatenate", "hstack",
      "vstack", "dstack", "column_stack", "row_stack", "align_as", "align_to", "atleast_1d", "atleast_2d",
      "atleast_3d", "ravel", "clamp", "unfold", "type_as", "to", "float", "double", "int", "long", "half", "bfloat16",
      "byte", "char", "bool", "cfloat", "numpy", "empty", "empty_like", "zeros", "zeros_like", "ones", "ones_like",
      "full", "full_like", "arange", "linspace", "logspace", "eye", "identity", "diag", "diagflat", "diag_embed",
      "triu", "tril", "triu_indices", "tril_indices", "clone", "__bool__", "stride"};
  // clang-format on
  return kLowRisk;
}

// ATen calls of the C++ frontend that Python makes where msprobe cannot see them.
inline const char* cpp_only_reason(const std::string& api) {
  static const std::map<std::string, const char*> kReasons = {
      {"lstm", "Python's nn.LSTM calls torch._VF.lstm, which msprobe does not hook"},
      {"gru", "Python's nn.GRU calls torch._VF.gru, which msprobe does not hook"},
      {"rnn_tanh", "Python's nn.RNN calls torch._VF.rnn_tanh, which msprobe does not hook"},
      {"rnn_relu", "Python's nn.RNN calls torch._VF.rnn_relu, which msprobe does not hook"},
      {"equal", "C++'s multi_head_attention_forward tests torch::equal(query, key); Python tests `query is key`"},
      {"broadcast_tensors",
       "C++'s mse_loss, l1_loss and smooth_l1_loss broadcast with torch::broadcast_tensors; Python's do it "
       "inside the loss call"},
  };
  const auto it = kReasons.find(api);
  return it == kReasons.end() ? nullptr : it->second;
}

// Every entry construct.json names, as a key or as a parent.
inline std::unordered_set<std::string> structure_names(const Dump& d) {
  std::unordered_set<std::string> names;
  for (const auto& kv : d.parents) {
    names.insert(std::string(kv.first));
    names.insert(std::string(kv.second));
  }
  return names;
}

}  // namespace details

// The entries one side has by nature, taken out of target_only/bench_only. Only when
// one side is msprobe's Python dump and the other TorchProbe's: two dumps of one kind have the
// same capture, so whatever one lacks is a difference.
inline std::vector<ExplainedEntry> explain_unmatched(Matching& m, const std::vector<Entry>& target_entries,
                                                     const std::vector<Entry>& bench_entries, const Dump& t,
                                                     const Dump& b, StatsOrigin to, StatsOrigin bo) {
  std::vector<ExplainedEntry> out;
  const bool mixed = (to == StatsOrigin::msprobe && bo == StatsOrigin::torchprobe) ||
                     (to == StatsOrigin::torchprobe && bo == StatsOrigin::msprobe);
  if (!mixed) return out;
  const bool python_target = to == StatsOrigin::msprobe;
  // msprobe dropped its low-risk APIs unless some of them are in its dump.
  bool low_risk_dumped = false;
  const auto t_structure = details::structure_names(t), b_structure = details::structure_names(b);
  for (const Entry& e : python_target ? target_entries : bench_entries) {
    if (!e.is_module() && details::msprobe_low_risk_apis().count(std::get<1>(details::api_parts(e))))
      low_risk_dumped = true;
  }
  const auto reason = [&](const Entry& e, bool target_side) -> std::string {
    const auto& other = target_side ? b_structure : t_structure;
    const bool python_side = target_side == python_target;
    if (e.is_module()) {
      std::string base(e.name);
      for (const char* d : {".forward.", ".backward.", ".parameters_grad."}) {
        const auto at = base.rfind(d);
        if (at != std::string::npos) base = base.substr(0, at);
      }
      const std::string fwd = base + ".forward." + details::split_dots(e.name).back();
      if (other.count(std::string(e.name)) || other.count(fwd))
        return "present in the other side's structure only (construct.json: a module inferred from its calls, "
               "with no ModuleGuard in C++)";
      return python_side ? "module call seen by msprobe's module hooks only: C++ sees a torch::nn module through "
                           "its parameters or a ModuleGuard, and this one has neither (its API calls are compared)"
                         : "module seen in C++ through the parameters its calls use; Python never calls it as a "
                           "module (its parent uses the weights directly)";
    }
    if (python_side || e.name.rfind("Aten.", 0) != 0) return "";
    const std::string api = std::get<1>(details::api_parts(e));
    if (const char* r = details::cpp_only_reason(api)) return r;
    if (!low_risk_dumped && details::msprobe_low_risk_apis().count(api))
      return "msprobe 26 leaves its low-risk APIs (views, reshapes, creation ops: api_risk_level.py) out of "
             "the dump";
    return "";
  };
  const auto sweep = [&](std::vector<const Entry*>& list, bool target_side) {
    std::vector<const Entry*> keep;
    for (const Entry* e : list) {
      std::string r = reason(*e, target_side);
      if (r.empty())
        keep.push_back(e);
      else
        out.push_back({e, target_side, std::move(r)});
    }
    list = std::move(keep);
  };
  sweep(m.target_only, true);
  sweep(m.bench_only, false);
  return out;
}

}  // namespace torchprobe::compare

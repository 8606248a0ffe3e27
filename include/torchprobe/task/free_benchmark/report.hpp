#pragma once
// What free_benchmark writes per step (msprobe-reference.md §7.4):
//  - free_benchmark.csv, one row per inconsistent output, byte-compatible with msprobe's
//    (`rank,pert_mode,stage,step,api_name,max_rel,dtype,shape,output_index`, Python's csv module
//    with its \r\n line ends); only written when a row exists;
//  - free_benchmark_summary.json (TorchProbe's own): per API, how many calls were checked and
//    flagged, the worst ratio and the call it came from, worst first.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "torchprobe/config/types.hpp"
#include "torchprobe/core/tensor_json.hpp"
#include "torchprobe/io/json_text.hpp"
#include "torchprobe/io/python_csv.hpp"
#include "torchprobe/task/free_benchmark/comparison.hpp"
#include "torchprobe/task/free_benchmark/preheat.hpp"

namespace torchprobe::free_benchmark {

// One checked call: its entry name ("Aten.mul.0.forward") and its compared outputs.
struct CheckedCall {
  std::string name;
  std::vector<Comparison> outputs;
  std::optional<Sample> sample;  // preheat: the call was sampled
  std::vector<Comparison> cpu;   // preheat steps: its outputs against the CPU's

  bool flagged() const {
    return std::any_of(outputs.begin(), outputs.end(), [](const Comparison& c) { return !c.consistent; });
  }
  double score() const {
    double s = 0;
    for (const Comparison& c : outputs) s = std::max(s, c.score);
    return s;
  }
};

// str(torch.Size(shape)): "torch.Size([])", "torch.Size([4])", "torch.Size([64, 64])".
inline std::string torch_size_text(const std::vector<int64_t>& shape) {
  std::string s = "torch.Size([";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "])";
}

// "Aten.mul.0.forward" -> "Aten.mul".
inline std::string api_of(const std::string& name) {
  std::string s = name;
  for (int k = 0; k < 2; ++k) {
    const auto dot = s.rfind('.');
    if (dot == std::string::npos) break;
    s.resize(dot);
  }
  return s;
}

// The CSV text, or empty when no call was flagged.
inline std::string csv_text(const std::vector<CheckedCall>& calls, const FreeBenchmarkConfig& cfg, int64_t step,
                            int64_t rank) {
  std::string rows;
  auto row = [&](const CheckedCall& call, const Comparison* c) {
    std::string max_rel;
    if (c && c->flipped)
      max_rel = "symbol_flipping";
    else if (c && c->ratio && cfg.pert_mode != PertMode::ToCpu)
      max_rel = io::python_float_repr(*c->ratio - 1.0);
    const std::vector<std::string> fields = {std::to_string(rank),
                                             std::string(pert_mode_name(cfg.pert_mode)),
                                             cfg.fuzz_stage == FuzzStage::Backward ? "backward" : "forward",
                                             std::to_string(step),
                                             call.name,
                                             max_rel,
                                             c ? dtype_name(c->dtype) : std::string(),
                                             c ? torch_size_text(c->shape) : std::string(),
                                             c && c->index ? std::to_string(*c->index) : std::string()};
    for (std::size_t i = 0; i < fields.size(); ++i) rows += (i ? "," : "") + io::csv_field(fields[i]);
    rows += "\r\n";
  };
  for (const CheckedCall& call : calls) {
    bool sequence_flagged = false;
    for (const Comparison& c : call.outputs) {
      if (c.consistent) continue;
      if (c.in_sequence)
        sequence_flagged = true;
      else
        row(call, &c);
    }
    if (sequence_flagged) row(call, nullptr);  // msprobe: the output is not a tensor, so no dtype/shape
  }
  if (rows.empty()) return rows;
  return "rank,pert_mode,stage,step,api_name,max_rel,dtype,shape,output_index\r\n" + rows;
}

// free_benchmark_summary.json: per API, worst first (symbol flipping before any ratio).
inline nlohmann::ordered_json summary_json(const std::vector<CheckedCall>& calls, const FreeBenchmarkConfig& cfg,
                                           int64_t step) {
  struct Api {
    int64_t checked = 0, flagged = 0;
    double worst = -1;
    bool flipped = false;
    std::string worst_call;
  };
  std::map<std::string, Api> apis;
  int64_t flagged_calls = 0;
  for (const CheckedCall& call : calls) {
    Api& a = apis[api_of(call.name)];
    ++a.checked;
    const bool flagged = call.flagged();
    if (flagged) {
      ++a.flagged;
      ++flagged_calls;
    }
    const double s = call.score();
    if (s > a.worst) {
      a.worst = s;
      a.worst_call = call.name;
      a.flipped = std::any_of(call.outputs.begin(), call.outputs.end(), [](const Comparison& c) { return c.flipped; });
    }
  }
  std::vector<std::pair<std::string, Api>> sorted(apis.begin(), apis.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& x, const auto& y) { return x.second.worst > y.second.worst; });
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["step"] = step;
  j["pert_mode"] = std::string(pert_mode_name(cfg.pert_mode));
  j["handler_type"] = cfg.handler_type == FuzzHandler::Fix ? "fix" : "check";
  // For to_cpu the measure is the worst error over its bound (> 1 is flagged), else max(a/b, b/a).
  j["measure"] = cfg.pert_mode == PertMode::ToCpu ? "error_over_bound" : "ratio";
  j["checked_calls"] = static_cast<int64_t>(calls.size());
  j["flagged_calls"] = flagged_calls;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& [name, a] : sorted) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["api"] = name;
    e["checked"] = a.checked;
    e["flagged"] = a.flagged;
    if (a.flipped)
      e["worst"] = "symbol_flipping";
    else if (std::isfinite(a.worst))
      e["worst"] = a.worst;
    else
      e["worst"] = "inf";
    e["worst_call"] = a.worst_call;
    list.push_back(std::move(e));
  }
  j["apis"] = std::move(list);
  return j;
}

}  // namespace torchprobe::free_benchmark

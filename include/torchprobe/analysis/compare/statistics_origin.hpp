#pragma once
// How a dump computed its Mean and Norm, and how far that lets two dumps' Mean and Norm differ.
//
// TorchProbe sums in float64 (exact to the float32 result for any tensor that fits in memory).
// msprobe's Python dump calls torch.mean / torch.norm on the tensor, which sum in the tensor's own
// float type: on CPU, torch 1.13's float32 norm is off by 0.8 ε at 10^3 elements, 88 ε at 10^6,
// 3058 ε at 10^7 and 14156 ε at 3·10^7 (ε = 2^-23; worst of standard normal, uniform and shifted
// normal tensors, tools/measure_norm_error.py) -- at most 0.47e-3 · n ε, growing faster than √n
// because small squares vanish against a large running sum. So when a side's statistics are such
// float sums, Mean and Norm of a float32/float16/bfloat16 tensor of n elements may differ by
//
//     n / 1024 epsilons of the tensor's dtype (twice the worst error measured),
//
// beyond the judging threshold; Max and Min are elements of the tensor, exact in every tool, and
// keep the plain threshold. A tensor under 65,536 elements gets less than the default threshold
// (64 ε) from this, so it changes nothing there; a planted fault (a layer in bfloat16, a weight
// scaled by 1 + 1000·2^-23) moves Max and Min by hundreds of ε or more and stays visible.
#include <string>
#include <string_view>

#include "torchprobe/analysis/compare/dump_reader.hpp"
#include "torchprobe/core/stat_tolerance.hpp"

namespace torchprobe::compare {

enum class StatsOrigin {
  torchprobe,  // float64 sums: exact
  msprobe,     // torch.mean / torch.norm in the tensor's float type (Python)
  unknown,     // nothing tells: judged as if float sums
};

inline const char* stats_origin_text(StatsOrigin o) {
  return o == StatsOrigin::torchprobe ? "TorchProbe: Mean and Norm summed in float64 (exact)"
         : o == StatsOrigin::msprobe  ? "msprobe (Python): Mean and Norm summed by torch in the tensor's float type"
                                      : "unknown producer: Mean and Norm judged as float sums";
}

// The dump's producer, from what only one of them writes: Python frames in stack.json or
// msprobe's Python API families mean msprobe; C++ frames, or ATen entries without Python
// families, mean TorchProbe. A module-only dump without stack.json says nothing.
inline StatsOrigin stats_origin(const Dump& d) {
  bool cpp_frames = false;
  for (const auto& [entry, frames] : d.stacks) {
    (void)entry;
    if (!frames.is_array()) continue;
    for (const auto& f : frames) {
      if (!f.is_string()) continue;
      if (f.get_ref<const std::string&>().find(".py, line ") != std::string::npos) return StatsOrigin::msprobe;
      cpp_frames = true;
    }
  }
  bool aten = false;
  for (const auto& kv : d.data.items()) {
    const std::string& n = kv.key();
    for (const char* family : {"Functional.", "Tensor.", "Torch.", "NPU.", "VF.", "Jit."})
      if (n.rfind(family, 0) == 0) return StatsOrigin::msprobe;
    aten = aten || n.rfind("Aten.", 0) == 0;
  }
  return cpp_frames || aten ? StatsOrigin::torchprobe : StatsOrigin::unknown;
}

// Elements of a tensor from its shape as msprobe's table writes it ("[4, 8]"; "[]" is one).
inline double shape_elements(std::string_view shape) {
  double n = 1;
  std::size_t i = 0;
  while (i < shape.size()) {
    if (shape[i] >= '0' && shape[i] <= '9') {
      double v = 0;
      while (i < shape.size() && shape[i] >= '0' && shape[i] <= '9') v = v * 10 + (shape[i++] - '0');
      n *= v;
    } else {
      ++i;
    }
  }
  return n;
}

// The allowance above, in the dtype's epsilons, for a Mean or Norm of a tensor of this shape.
inline double accumulation_allowance(std::string_view shape) {
  return kAccumulationEpsilonsPerElement * shape_elements(shape);
}

}  // namespace torchprobe::compare

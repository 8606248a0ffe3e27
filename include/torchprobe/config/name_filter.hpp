#pragma once
// NameFilter: which entries a run dumps, decided name by name in execution order from the config's
// scope and list (msprobe's data_dump/scope.py), plus which ATen ops
// risk_level lets through. step, rank and data_mode are plain lookups on Config and are not here.
//
// A filter is stateful (the scope range is on or off) and not thread-safe: one per capturing thread.
#include <algorithm>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "torchprobe/config/types.hpp"
#include "torchprobe/core/names.hpp"

namespace torchprobe {

namespace details {

// "aten::add_.Tensor" -> "add_": risk tables are keyed by the short name that API entries use.
inline std::string_view aten_short_name(std::string_view op) {
  if (const auto p = op.rfind("::"); p != std::string_view::npos) op.remove_prefix(p + 2);
  if (const auto p = op.find('.'); p != std::string_view::npos) op = op.substr(0, p);
  return op;
}

// Ops that FOCUS drops: they move, reshape, copy, cast or create data without arithmetic that could
// differ between devices, so their dumps rarely explain an accuracy problem and mostly add volume.
// Adapted from msprobe's LOW_RISK_API_SET (Python API names) to the ATen names TorchProbe records,
// adding ATen-only spellings (_reshape_alias, _unsafe_view, _to_copy, slice, select, copy_, fill_, ...).
inline bool is_low_risk_op(std::string_view op) {
  static const std::unordered_set<std::string_view> kLowRisk = {
      // views and shape changes
      "view", "view_as", "_unsafe_view", "reshape", "reshape_as", "_reshape_alias", "flatten", "unflatten", "ravel",
      "squeeze", "unsqueeze", "expand", "expand_as", "transpose", "t", "permute", "movedim", "moveaxis", "swapaxes",
      "swapdims", "unfold", "as_strided", "alias", "narrow", "slice", "select", "contiguous", "detach", "lift_fresh",
      "align_as", "align_to", "atleast_1d", "atleast_2d", "atleast_3d",
      // copies, gathers by index, repeats
      "clone", "copy", "_copy_from", "_copy_from_and_resize", "index_select", "repeat", "repeat_interleave", "tile",
      // joins and splits
      "cat", "_cat", "concat", "concatenate", "stack", "_stack", "hstack", "vstack", "dstack", "column_stack",
      "row_stack", "split", "split_with_sizes", "unsafe_split", "unsafe_split_with_sizes", "tensor_split", "hsplit",
      "vsplit", "dsplit", "chunk", "unsafe_chunk", "unbind",
      // dtype and device conversion
      "to", "_to_copy", "type_as", "float", "double", "half", "bfloat16", "int", "long", "short", "byte", "char",
      "bool", "cfloat",
      // creation and filling
      "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
      "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "fill", "zero", "arange", "linspace",
      "logspace", "eye", "scalar_tensor", "resize", "resize_as", "set", "diag", "diagflat", "diag_embed", "triu",
      "tril", "triu_indices", "tril_indices",
      // clamping (a comparison, no rounding) and reading scalars or metadata
      "clamp", "clamp_min", "clamp_max", "clip", "item", "_local_scalar_dense", "is_nonzero", "size", "stride"};
  op = aten_short_name(op);
  return kLowRisk.count(op) > 0 || kLowRisk.count(without_inplace_mark(op)) > 0;
}

// Ops that CORE keeps: the compute-heavy families where accuracy problems usually start. Adapted from
// msprobe's CORE_API_SET: matmul family, linear, convolution, normalization layers, embedding and
// attention, plus the softmax family. Families are matched by substring so that ATen's many
// backend-specific spellings (cudnn_convolution, native_layer_norm, _scaled_dot_product_flash_attention,
// _log_softmax, embedding_bag, ...) are covered. Plain "norm" (a vector norm), "renorm" and "normal"
// (random) are deliberately not normalization layers.
inline bool is_core_op(std::string_view op) {
  static const std::unordered_set<std::string_view> kCore = {"matmul",
                                                             "__matmul__",
                                                             "mm",
                                                             "bmm",
                                                             "addmm",
                                                             "_addmm_activation",
                                                             "addbmm",
                                                             "baddbmm",
                                                             "mv",
                                                             "addmv",
                                                             "addr",
                                                             "dot",
                                                             "einsum",
                                                             "tensordot",
                                                             "chain_matmul",
                                                             "linalg_matmul",
                                                             "linalg_multi_dot",
                                                             "linalg_vecdot",
                                                             "_scaled_mm",
                                                             "_fused_adam",
                                                             "_fused_adamw"};
  op = without_inplace_mark(aten_short_name(op));
  if (kCore.count(op) > 0) return true;
  auto has = [op](std::string_view part) { return op.find(part) != std::string_view::npos; };
  if (has("conv") && !has("convert")) return true;     // conv1d.., conv_transpose*, convolution, _convolution
  if (has("linear") && !has("upsample")) return true;  // linear, bilinear, mkldnn_linear (not interpolation)
  for (std::string_view family : {"batch_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm",
                                  "local_response_norm", "weight_norm", "embedding", "attention", "softmax"})
    if (has(family)) return true;
  return false;
}

}  // namespace details

class NameFilter {
 public:
  explicit NameFilter(const Config& config)
      : level_(config.level),
        risk_level_(config.risk_level),
        exact_scope_(config.task == Task::FreeBenchmark),
        scope_(config.scope),
        list_(config.list) {}

  // Called once per entry name in execution order (API names like "Aten.relu.0.forward", their backward
  // names, module names like "Module.fc.Linear.forward.0"); returns whether the entry is dumped.
  // scope is an inclusive [start, end] range: on when start is seen, off after end. list keeps names that
  // contain any of its strings; with a scope it filters inside the range.
  bool admit(const std::string& name) {
    if (exact_scope_)  // free_benchmark: scope is a set of exact names (msprobe's ListScope)
      return (scope_.empty() || std::find(scope_.begin(), scope_.end(), name) != scope_.end()) && in_list(name);
    if (scope_.empty()) return in_list(name);
    if (name == scope_.front()) in_range_ = true;
    const bool admitted = in_range_ && in_list(name);
    // An L0 module range stays open until the end module's forward finishes, when exit_module says so.
    if (name == scope_.back() && !end_module_open_) in_range_ = false;
    return admitted;
  }

  // Optional module lifetime notifications (forward pre-hook / forward end, with the module's forward
  // name). Without them admit() works on names alone; with them the module-scoped rules of msprobe hold:
  //  - L0: a scope ending at a module covers everything executed inside that module;
  //  - mix: a module whose name matches the list switches on everything executed inside it.
  void enter_module(const std::string& name) {
    if (exact_scope_) return;
    if (!scope_.empty() && name == scope_.front()) in_range_ = true;
    if (level_ == Level::L0 && !scope_.empty() && name == scope_.back()) end_module_open_ = true;
    if (level_ == Level::Mix && matches_list(name)) open_list_modules_.push_back(name);
  }
  void exit_module(const std::string& name) {
    if (exact_scope_) return;
    if (!scope_.empty() && name == scope_.back()) {
      in_range_ = false;
      end_module_open_ = false;
    }
    auto it = std::find(open_list_modules_.begin(), open_list_modules_.end(), name);
    if (it != open_list_modules_.end()) open_list_modules_.erase(it);
  }

  // risk_level for an ATen op ("addmm", "aten::view.default", ...). It only applies at L1 and mix, and
  // only when neither scope nor list is set: naming what to dump overrides the risk table (as in msprobe).
  bool admits_op(std::string_view aten_op) const {
    if ((level_ != Level::L1 && level_ != Level::Mix) || !scope_.empty() || !list_.empty()) return true;
    switch (risk_level_) {
      case RiskLevel::All: return true;
      case RiskLevel::Focus: return !details::is_low_risk_op(aten_op);
      case RiskLevel::Core: return details::is_core_op(aten_op);
    }
    return true;
  }

  // At step(): the range closes, as entry numbering restarts.
  void reset() {
    in_range_ = false;
    end_module_open_ = false;
    open_list_modules_.clear();
  }

 private:
  bool matches_list(const std::string& name) const {
    return std::any_of(list_.begin(), list_.end(),
                       [&](const std::string& part) { return name.find(part) != std::string::npos; });
  }
  bool in_list(const std::string& name) const {
    return list_.empty() || !open_list_modules_.empty() || matches_list(name);
  }

  Level level_;
  RiskLevel risk_level_;
  bool exact_scope_;
  std::vector<std::string> scope_, list_;
  bool in_range_ = false;
  bool end_module_open_ = false;                // L0: the scope's end module has entered and not yet exited
  std::vector<std::string> open_list_modules_;  // mix: modules matching the list that are still running
};

}  // namespace torchprobe

#pragma once
// Python API <-> ATen: which name is which, and which argument is which (issue 41, item 1).
//
// msprobe's Python dump records the outermost Python call (Functional.embedding(input, weight,
// ...)); TorchProbe's C++ dump records the outermost ATen call (aten::embedding(weight, indices,
// ...)). Both are one call under two names and two argument orders. This table says, for each API
// whose ATen schema differs from its Python signature, which Python argument is which ATen
// argument; an API not listed keeps its positions (relu(input) is relu(self)).
//
// Backward entries: msprobe records as a backward entry's outputs the gradients of the inputs of
// the API's *last autograd node*; TorchProbe records the gradients of the ATen call's arguments.
// For an op with its own derivative they are the same list in ATen's argument order (with the
// gradients no argument gets left out: embedding's [dW] against [dW, null]); for a composite op
// (l1_loss is abs(x - t).mean(), bilinear is a trilinear plus a bias add) msprobe's are the
// gradients of an intermediate tensor and are not compared (`kLastNodeGradients`).
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace torchprobe::compare::details {

// One name for a call on either side: the Python API's and its ATen op's (layer_norm and
// native_layer_norm are both "layer_norm"). conv1d/2d/3d keep their names: C++'s frontend calls
// them as Python does, and one shared name would let a conv1d pair with a conv2d.
inline std::string canonical_api(const std::string& api) {
  static const std::map<std::string, std::string> kCanon = {
      {"native_layer_norm", "layer_norm"},
      {"_softmax", "softmax"},
      {"_log_softmax", "log_softmax"},
      {"native_dropout", "dropout"},
      {"cross_entropy", "cross_entropy_loss"},  // F.cross_entropy: torch._C._nn.cross_entropy_loss
      {"nll_loss_nd", "nll_loss"},              // F.nll_loss: torch._C._nn.nll_loss_nd
      {"nll_loss2d", "nll_loss"},
      {"constant_pad_nd", "pad"},  // F.pad's constant mode
  };
  const auto it = kCanon.find(api);
  return it == kCanon.end() ? api : it->second;
}

// Forward argument links of a Python API against its ATen op: {Python position, ATen position}.
// Positions not listed are not linked (a Python-only argument such as `inplace`, or an ATen-only
// one such as `cudnn_enabled`).
inline const std::vector<std::pair<int, int>>* argument_map(const std::string& canon) {
  using Links = std::vector<std::pair<int, int>>;
  // F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps) against
  // aten::batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn);
  // instance_norm's two signatures have the same shape.
  static const Links kNorm = {{0, 0}, {1, 3}, {2, 4}, {3, 1}, {4, 2}, {5, 5}, {6, 6}, {7, 7}};
  static const std::map<std::string, Links> kMaps = {
      {"embedding", {{0, 1}, {1, 0}}},              // (input, weight, ...) / (weight, indices, ...)
      {"embedding_bag", {{0, 1}, {1, 0}, {2, 2}}},  // (input, weight, offsets) / (weight, indices, offsets)
      {"batch_norm", kNorm},
      {"instance_norm", kNorm},
      {"layer_norm", {{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 4}}},  // + cudnn_enable
      {"group_norm", {{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 4}}},  // + cudnn_enabled
      {"elu", {{0, 0}, {1, 1}}},               // (input, alpha, inplace) / (self, alpha, scale, input_scale)
      {"leaky_relu", {{0, 0}, {1, 1}}},        // + inplace
      {"hardtanh", {{0, 0}, {1, 1}, {2, 2}}},  // + inplace
      {"relu", {{0, 0}}},                      // + inplace
      {"softmax", {{0, 0}, {1, 1}}},           // (input, dim, _stacklevel, dtype) / (self, dim, dtype)
      {"log_softmax", {{0, 0}, {1, 1}}},
      {"dropout", {{0, 0}, {1, 1}, {2, 2}}},                             // + inplace
      {"max_pool1d", {{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 4}, {5, 5}}},  // + return_indices
      {"max_pool2d", {{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 4}, {5, 5}}},
      {"max_pool3d", {{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 4}, {5, 5}}},
      {"adaptive_max_pool1d", {{0, 0}, {1, 1}}},  // + return_indices
      {"adaptive_max_pool2d", {{0, 0}, {1, 1}}},
      {"adaptive_max_pool3d", {{0, 0}, {1, 1}}},
      // (input, target, size_average, reduce, reduction[, beta]) / (self, target, reduction[, beta])
      {"mse_loss", {{0, 0}, {1, 1}}},
      {"l1_loss", {{0, 0}, {1, 1}}},
      {"smooth_l1_loss", {{0, 0}, {1, 1}}},
      {"binary_cross_entropy", {{0, 0}, {1, 1}, {2, 2}}},
      // (input, target, weight, size_average, reduce, reduction, pos_weight) / (self, target, weight, pos_weight,
      // reduction)
      {"binary_cross_entropy_with_logits", {{0, 0}, {1, 1}, {2, 2}, {6, 3}}},
      // (input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing) /
      // (self, target, weight, reduction, ignore_index, label_smoothing)
      {"cross_entropy_loss", {{0, 0}, {1, 1}, {2, 2}, {4, 4}, {7, 5}}},
      {"nll_loss", {{0, 0}, {1, 1}, {2, 2}, {4, 4}}},  // (input, target, weight, size_average, ignore_index, ...)
      {"gelu", {{0, 0}}},                              // approximate: a keyword in Python
      {"pad", {{0, 0}, {1, 1}}},                       // (input, pad, mode, value) / constant_pad_nd(self, pad, value)
  };
  const auto it = kMaps.find(canon);
  return it == kMaps.end() ? nullptr : &it->second;
}

// Keyword arguments (msprobe names them ".input.weight") of a Python API against ATen positions:
// nn.CrossEntropyLoss, NLLLoss and BCEWithLogitsLoss pass their weights by keyword.
inline const std::vector<std::pair<std::string, int>>* keyword_map(const std::string& canon) {
  using Links = std::vector<std::pair<std::string, int>>;
  static const std::map<std::string, Links> kMaps = {
      {"cross_entropy_loss", {{"weight", 2}, {"ignore_index", 4}, {"label_smoothing", 5}}},
      {"nll_loss", {{"weight", 2}, {"ignore_index", 4}}},
      {"binary_cross_entropy_with_logits", {{"weight", 2}, {"pos_weight", 3}}},
      {"binary_cross_entropy", {{"weight", 2}}},
      {"embedding_bag", {{"offsets", 2}, {"per_sample_weights", 6}}},
      {"batch_norm", {{"weight", 1}, {"bias", 2}, {"training", 5}, {"momentum", 6}, {"eps", 7}}},
      {"instance_norm", {{"weight", 1}, {"bias", 2}, {"use_input_stats", 5}, {"momentum", 6}, {"eps", 7}}},
      {"layer_norm", {{"weight", 2}, {"bias", 3}, {"eps", 4}}},
      {"group_norm", {{"weight", 2}, {"bias", 3}, {"eps", 4}}},
      {"softmax", {{"dim", 1}}},
      {"log_softmax", {{"dim", 1}}},
      {"dropout", {{"p", 1}, {"training", 2}}},
  };
  const auto it = kMaps.find(canon);
  return it == kMaps.end() ? nullptr : &it->second;
}

// Composite Python APIs whose msprobe backward outputs are the gradients of an intermediate
// tensor, not of the API's arguments (see the top of this file). Found on the twin corpus
// (tests/data/msprobe_twins), where both runs are bit-identical, as rows that differ only there.
inline bool last_node_gradients(const std::string& canon) {
  // scaled_dot_product_attention: on the CPU with gradients torch 2.x takes its math path, whose last
  // node is an UnsafeViewBackward0 (its "gradients" are the output's own).
  static const std::set<std::string> kComposite = {"l1_loss", "bilinear", "cross_entropy_loss", "instance_norm",
                                                   "scaled_dot_product_attention"};
  return kComposite.count(canon) > 0;
}

}  // namespace torchprobe::compare::details

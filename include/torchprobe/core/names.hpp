#pragma once
// Names that more than one part of TorchProbe must spell the same way.
#include <cstdint>
#include <string>
#include <string_view>

namespace torchprobe {

// The folder of a rank directory that holds the tensor files (msprobe's name).
inline constexpr std::string_view kTensorDir = "dump_tensor_data";

// How deep nested values (lists, tuples, dicts) are followed before they are cut to null:
// msprobe's DUMP_MAX_DEPTH.
inline constexpr int kMaxDepth = 400;

// {rank_directory}/dump_tensor_data
inline std::string tensor_data_directory(const std::string& rank_directory) {
  return rank_directory + "/" + std::string(kTensorDir);
}

// The .pt file of one tensor of an entry: "{entry}.{file_key}.pt", msprobe's name
// ("Aten.add.0.forward.input.0.pt"); without the key when it is empty, as for save()'s
// "y.0.debug.pt". Not yet a safe path component: io::safe_component makes it one.
inline std::string tensor_file_name(const std::string& entry, const std::string& file_key) {
  std::string name = entry;
  if (!file_key.empty()) name.append(".").append(file_key);
  return name.append(".pt");
}

// save()'s entries in debug.json: "{name}.{count}.debug" (msprobe's names); the gradients of a
// saved value are "{name}_grad.{count}.debug".
inline constexpr std::string_view kSaveSuffix = ".debug";
inline std::string save_entry_name(const std::string& name, std::int64_t count) {
  return name + "." + std::to_string(count) + std::string(kSaveSuffix);
}
inline bool is_save_entry(std::string_view entry) {
  return entry.size() > kSaveSuffix.size() && entry.substr(entry.size() - kSaveSuffix.size()) == kSaveSuffix;
}

// ATen's in-place variants: "add_" (the op's name with one trailing underscore) and the
// augmented-assignment operators "__iand__", "__ilshift__", ... ("__and__" is not one).
constexpr bool is_dunder(std::string_view op) {
  return op.size() > 4 && op.substr(0, 2) == "__" && op.substr(op.size() - 2) == "__";
}
constexpr bool is_inplace_op(std::string_view op) {
  if (is_dunder(op)) return op[2] == 'i' && op.size() > 5;
  return op.size() > 1 && op.back() == '_' && op[op.size() - 2] != '_';
}

// "unsqueeze_" -> "unsqueeze": the op an in-place variant updates in place. The special methods
// are returned as they are (no list of op names TorchProbe keeps names one).
constexpr std::string_view without_inplace_mark(std::string_view op) {
  return is_inplace_op(op) && !is_dunder(op) ? op.substr(0, op.size() - 1) : op;
}

}  // namespace torchprobe

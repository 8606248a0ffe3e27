#pragma once
// The parts of a tensor's dump.json item that every task writes: type, dtype, shape, the
// statistics slots and requires_grad, in msprobe's key order.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <c10/util/SmallVector.h>

#include <cstdint>
#include <string>
#include <utility>

#include "torchprobe/core/tensor_stats.hpp"

namespace torchprobe {

// Python's str(torch.dtype) for each ATen scalar type.
inline std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kByte: return "torch.uint8";
    case at::kChar: return "torch.int8";
    case at::kShort: return "torch.int16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    case at::kComplexHalf: return "torch.complex32";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    case at::kQInt8: return "torch.qint8";
    case at::kQUInt8: return "torch.quint8";
    case at::kQInt32: return "torch.qint32";
    case at::kQUInt4x2: return "torch.quint4x2";
    default: {
      // Newer dtypes (float8 variants, unsigned ints of torch 2.x): ATen's name, lower-cased.
      std::string s = c10::toString(t);
      for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return "torch." + s;
    }
  }
}

// {"type", "dtype", "shape"}: the keys that lead every tensor item.
inline nlohmann::ordered_json tensor_header(const at::Tensor& t) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j.get_ref<nlohmann::ordered_json::object_t&>().reserve(8);  // the item's usual eight keys, without regrowth
  j["type"] = "torch.Tensor";
  j["dtype"] = dtype_name(t.scalar_type());
  j["shape"] = t.sizes().vec();
  return j;
}

inline void put_stats(nlohmann::ordered_json& j, const TensorStats& s) {
  j["Max"] = s.max;
  j["Min"] = s.min;
  j["Mean"] = s.mean;
  j["Norm"] = s.norm;
}

// A statistics item in compact form: what the statistics task keeps of a CPU tensor while a call
// is captured. Its JSON is built only when the entry is written (capture/captured_call.hpp), so the
// training thread neither allocates nor frees a JSON tree per tensor.
struct TensorSummary {
  at::ScalarType dtype = at::kFloat;
  bool requires_grad = false;
  c10::SmallVector<std::int64_t, 4> shape;  // most tensors have at most four dimensions
  TensorStats stats;
};

// The item exactly as tensor_header + put_stats + requires_grad write it.
inline nlohmann::ordered_json tensor_item(const TensorSummary& s) {
  using object_t = nlohmann::ordered_json::object_t;
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  object_t& o = j.get_ref<object_t&>();
  o.reserve(8);
  // Keys are appended in msprobe's order; the item is new, so there is nothing to look up.
  o.emplace_back("type", "torch.Tensor");
  o.emplace_back("dtype", dtype_name(s.dtype));
  o.emplace_back("shape", nlohmann::ordered_json(std::vector<std::int64_t>(s.shape.begin(), s.shape.end())));
  o.emplace_back("Max", s.stats.max);
  o.emplace_back("Min", s.stats.min);
  o.emplace_back("Mean", s.stats.mean);
  o.emplace_back("Norm", s.stats.norm);
  o.emplace_back("requires_grad", s.requires_grad);
  return j;
}

}  // namespace torchprobe

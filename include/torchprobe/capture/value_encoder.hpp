#pragma once
// Turns the boxed arguments and results of an ATen call into msprobe's JSON, as msprobe's
// data processor (core/dump/data_dump/data_processor/pytorch_processor.py) writes non-tensor values.
// Tensors are handed to the task's describer; everything else is encoded here.
#include <ATen/core/ivalue.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <nlohmann/json.hpp>

#include <string>

#include "torchprobe/capture/op_registry.hpp"
#include "torchprobe/core/names.hpp"
#include "torchprobe/core/site.hpp"
#include "torchprobe/core/tensor_json.hpp"

namespace torchprobe::capture {

inline std::string layout_name(c10::Layout l) {
  switch (l) {
    case c10::kStrided: return "torch.strided";
    case c10::kSparse: return "torch.sparse_coo";
    case c10::kMkldnn: return "torch._mkldnn";
    default: return "torch.layout";
  }
}

// Python's str of a torch.memory_format without the "torch." prefix, as msprobe writes it.
inline std::string memory_format_name(c10::MemoryFormat f) {
  switch (f) {
    case c10::MemoryFormat::Contiguous: return "contiguous_format";
    case c10::MemoryFormat::Preserve: return "preserve_format";
    case c10::MemoryFormat::ChannelsLast: return "channels_last";
    case c10::MemoryFormat::ChannelsLast3d: return "channels_last_3d";
    default: return "unknown_format";
  }
}

inline nlohmann::ordered_json typed(const char* type, nlohmann::ordered_json value) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["type"] = type;
  j["value"] = std::move(value);
  return j;
}

// DescribeTensor: callable(const at::Tensor&, const Site&) -> nlohmann::ordered_json
template <class DescribeTensor>
class ValueEncoder {
 public:
  explicit ValueEncoder(DescribeTensor& describe) : describe_(describe) {}

  nlohmann::ordered_json encode(const c10::IValue& v, ArgKind kind, const Site& site, int depth = 0) {
    if (depth > kMaxDepth) return nullptr;
    if (v.isNone()) return nullptr;
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) return nullptr;
      return describe_(t, site);
    }
    if (v.isBool()) return typed("bool", v.toBool());
    if (v.isInt()) return encode_int(v.toInt(), kind);
    if (v.isDouble()) return typed("float", v.toDouble());
    if (v.isString()) return typed("str", v.toStringRef());
    if (v.isDevice()) return typed("torch.device", v.toDevice().str());
    if (v.isList()) return encode_sequence(v.toListRef(), kind, site, depth);
    if (v.isTuple()) return encode_sequence(v.toTupleRef().elements(), kind, site, depth);
    if (v.isGenericDict()) {
      nlohmann::ordered_json out = nlohmann::ordered_json::object();
      for (const auto& kv : v.toGenericDict()) {
        const std::string key = kv.key().isString() ? kv.key().toStringRef() : c10::IValue(kv.key()).tagKind();
        out[key] = encode(kv.value(), ArgKind::Generic, site.child(key), depth + 1);
      }
      return out;
    }
    return nullptr;  // generators, objects, storages...: msprobe writes null for what it cannot analyse
  }

 private:
  template <class Elements>
  nlohmann::ordered_json encode_sequence(const Elements& elements, ArgKind kind, const Site& site, int depth) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    std::size_t k = 0;
    for (const c10::IValue& e : elements) out.push_back(encode(e, kind, site.child(std::to_string(k++)), depth + 1));
    return out;
  }

  static nlohmann::ordered_json encode_int(std::int64_t i, ArgKind kind) {
    switch (kind) {
      case ArgKind::ScalarType: return typed("torch.dtype", dtype_name(static_cast<at::ScalarType>(i)));
      case ArgKind::Layout: return typed("torch.layout", layout_name(static_cast<c10::Layout>(i)));
      case ArgKind::MemoryFormat: {
        nlohmann::ordered_json j = nlohmann::ordered_json::object();
        j["type"] = "torch.memory_format";
        j["format"] = memory_format_name(static_cast<c10::MemoryFormat>(i));
        return j;
      }
      case ArgKind::Generic: break;
    }
    return typed("int", i);
  }

  DescribeTensor& describe_;
};

}  // namespace torchprobe::capture

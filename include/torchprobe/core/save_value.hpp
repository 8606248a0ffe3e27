#pragma once
// SaveValue: what save(value, name) accepts -- msprobe's "tensor, int, float, str, or nested
// list/tuple/dict of them" in C++ terms. Built implicitly from a tensor, a number, a string, a
// std::vector or std::map of such values, or a c10::IValue:
//
//   dbg.save(y, "y");
//   dbg.save(std::vector<torch::Tensor>{a, b}, "pair");
//   dbg.save(tp::SaveValue::dict({{"a", y}, {"b", tp::SaveValue::list({1, 2.5, "s"})}}), "mix");
//
// dict() keeps the order given (as a Python dict does); a std::map gives its sorted order.
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchprobe {

class SaveValue {
 public:
  enum class Kind { None, Tensor, Bool, Int, Float, String, List, Dict };

  SaveValue() = default;  // None: written as null
  SaveValue(std::nullptr_t) {}
  SaveValue(at::Tensor t) : kind_(t.defined() ? Kind::Tensor : Kind::None), tensor_(std::move(t)) {}
  SaveValue(bool b) : kind_(Kind::Bool), int_(b) {}
  template <class I, std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>, int> = 0>
  SaveValue(I i) : kind_(Kind::Int), int_(static_cast<std::int64_t>(i)) {}
  template <class F, std::enable_if_t<std::is_floating_point_v<F>, int> = 0>
  SaveValue(F f) : kind_(Kind::Float), float_(static_cast<double>(f)) {}
  SaveValue(const char* s) : kind_(s ? Kind::String : Kind::None), string_(s ? s : "") {}
  SaveValue(std::string s) : kind_(Kind::String), string_(std::move(s)) {}
  SaveValue(std::string_view s) : kind_(Kind::String), string_(s) {}

  template <class T, std::enable_if_t<std::is_constructible_v<SaveValue, const T&>, int> = 0>
  SaveValue(const std::vector<T>& items) : kind_(Kind::List) {
    items_.reserve(items.size());
    for (const T& v : items) items_.emplace_back(v);
  }
  template <class T, std::enable_if_t<std::is_constructible_v<SaveValue, const T&>, int> = 0>
  SaveValue(const std::map<std::string, T>& items) : kind_(Kind::Dict) {
    for (const auto& kv : items) {
      keys_.push_back(kv.first);
      items_.emplace_back(kv.second);
    }
  }

  // A boxed value: tensors, bool/int/double, strings, lists, tuples (as lists) and dicts with
  // string keys; anything else (a device, an object) becomes None, written as null like msprobe does.
  SaveValue(const c10::IValue& v) {
    if (v.isTensor()) {
      *this = SaveValue(v.toTensor());
    } else if (v.isBool()) {
      *this = SaveValue(v.toBool());
    } else if (v.isInt()) {
      *this = SaveValue(v.toInt());
    } else if (v.isDouble()) {
      *this = SaveValue(v.toDouble());
    } else if (v.isString()) {
      *this = SaveValue(v.toStringRef());
    } else if (v.isList() || v.isTuple()) {
      kind_ = Kind::List;
      if (v.isList()) {
        for (const c10::IValue& e : v.toListRef()) items_.emplace_back(e);
      } else {
        for (const c10::IValue& e : v.toTupleRef().elements()) items_.emplace_back(e);
      }
    } else if (v.isGenericDict()) {
      kind_ = Kind::Dict;
      for (const auto& kv : v.toGenericDict()) {
        keys_.push_back(kv.key().isString() ? kv.key().toStringRef() : c10::IValue(kv.key()).tagKind());
        items_.emplace_back(kv.value());
      }
    }
  }

  static SaveValue list(std::vector<SaveValue> items) {
    SaveValue v;
    v.kind_ = Kind::List;
    v.items_ = std::move(items);
    return v;
  }
  // Keys in the order given.
  static SaveValue dict(std::vector<std::pair<std::string, SaveValue>> items) {
    SaveValue v;
    v.kind_ = Kind::Dict;
    for (auto& kv : items) {
      v.keys_.push_back(std::move(kv.first));
      v.items_.push_back(std::move(kv.second));
    }
    return v;
  }

  Kind kind() const { return kind_; }
  const at::Tensor& tensor() const { return tensor_; }
  bool as_bool() const { return int_ != 0; }
  std::int64_t as_int() const { return int_; }
  double as_float() const { return float_; }
  const std::string& as_string() const { return string_; }
  // List items, or dict values (keys() names them).
  const std::vector<SaveValue>& items() const { return items_; }
  const std::vector<std::string>& keys() const { return keys_; }

 private:
  Kind kind_ = Kind::None;
  at::Tensor tensor_;
  std::int64_t int_ = 0;
  double float_ = 0;
  std::string string_;
  std::vector<SaveValue> items_;
  std::vector<std::string> keys_;
};

}  // namespace torchprobe

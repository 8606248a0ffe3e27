#pragma once
// What the probe knows about an operator, looked up once per operator (overload) and cached.
//
// RecordFunction hands the observer the operator's name as a `const char*` that points into the
// operator's schema, so the pointer identifies the overload for the life of the process; the
// cache is keyed by it and the schema is read only on the first call.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "torchprobe/core/op_info.hpp"

namespace torchprobe::capture {

// Ops that a C++ training step runs without the user asking for them: autograd bookkeeping,
// allocation, the implicit ones_like of loss.backward(), zero_grad's zero_. They still hide the
// ops nested inside them, but are not recorded. msprobe leaves them out of its wrap list too.
inline const std::unordered_set<std::string_view>& infrastructure_ops() {
  static const std::unordered_set<std::string_view> ops = {"detach",
                                                           "detach_",
                                                           "alias",
                                                           "lift",
                                                           "lift_fresh",
                                                           "lift_fresh_copy",
                                                           "empty",
                                                           "empty_like",
                                                           "empty_strided",
                                                           "new_empty",
                                                           "new_empty_strided",
                                                           "ones_like",
                                                           "zero_",
                                                           "set_",
                                                           "resize_",
                                                           "resize_as_",
                                                           "record_stream",
                                                           "_version",
                                                           "data",
                                                           "set_data",
                                                           "is_leaf",
                                                           "output_nr",
                                                           "requires_grad_",
                                                           "retain_grad",
                                                           "retains_grad",
                                                           "_backward",
                                                           "_fw_primal",
                                                           "_make_dual",
                                                           "_has_compatible_shallow_copy_type"};
  return ops;
}

// Namespaces of operators that are not user APIs: TorchScript and profiler internals, collectives
// (named Distributed.* on a path of their own), backend kernels and decompositions. Operators of every other
// namespace but aten:: are custom operators (TORCH_LIBRARY) and are captured as APIs of their own.
inline bool internal_namespace(std::string_view ns) {
  static const std::unordered_set<std::string_view> names = {"prim",
                                                             "autograd",
                                                             "profiler",
                                                             "_caffe2",
                                                             "c10d",
                                                             "c10d_functional",
                                                             "_c10d_functional",
                                                             "_c10d_functional_autograd",
                                                             "cuda",
                                                             "mkldnn",
                                                             "mkl",
                                                             "onednn",
                                                             "xnnpack",
                                                             "fbgemm",
                                                             "quantized",
                                                             "_quantized",
                                                             "inductor",
                                                             "_inductor",
                                                             "prims",
                                                             "_prims",
                                                             "debugprims",
                                                             "rngprims",
                                                             "higher_order",
                                                             "_test",
                                                             "_nested",
                                                             "static_runtime",
                                                             "fuser",
                                                             "tensorexpr",
                                                             "vulkan",
                                                             "metal",
                                                             "_torchbind",
                                                             "_dtensor",
                                                             "sparse",
                                                             "_export",
                                                             "_quant"};
  return names.count(ns) != 0;
}

// "mylib::scale.out" -> "mylib", "scale.out"; nullopt for a name without a namespace.
inline std::optional<std::pair<std::string_view, std::string_view>> split_qualified(std::string_view q) {
  const auto sep = q.find("::");
  if (sep == std::string_view::npos || sep == 0) return std::nullopt;
  return std::make_pair(q.substr(0, sep), q.substr(sep + 2));
}

// The entry prefix of a custom namespace, as msprobe names API families: "mylib" -> "Mylib".
inline std::string api_family(std::string_view ns) {
  std::string family(ns);
  if (family[0] >= 'a' && family[0] <= 'z') family[0] = static_cast<char>(family[0] - 'a' + 'A');
  return family;
}

namespace details {

inline ArgKind kind_of(const c10::TypePtr& declared) {
  c10::TypePtr t = declared;
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  switch (t->kind()) {
    case c10::TypeKind::ScalarTypeType: return ArgKind::ScalarType;
    case c10::TypeKind::LayoutType: return ArgKind::Layout;
    case c10::TypeKind::MemoryFormatType: return ArgKind::MemoryFormat;
    default: return ArgKind::Generic;
  }
}

inline std::unique_ptr<OpInfo> op_info_of(const at::RecordFunction& fn) {
  auto info = std::make_unique<OpInfo>();
  info->qualified = fn.name();
  constexpr std::string_view ns = "aten::";
  const std::string_view q = info->qualified;
  if (q.substr(0, ns.size()) == ns) {
    info->api = std::string(q.substr(ns.size()));
    info->key = "Aten." + info->api + ".";
    info->user_api = infrastructure_ops().count(info->api) == 0;
  } else if (const auto parts = split_qualified(q)) {  // a custom operator (OpRegistry::lookup checked)
    info->api = std::string(parts->second);
    info->key = api_family(parts->first) + "." + info->api + ".";
    info->user_api = true;
  }
  if (const auto opname = fn.operator_name()) {
    if (const auto handle = c10::Dispatcher::singleton().findSchema(*opname)) {
      info->schema_known = true;
      for (const auto& a : handle->schema().arguments())
        info->args.push_back(
            {a.name(), a.kwarg_only(), kind_of(a.real_type()), a.alias_info() && a.alias_info()->isWrite()});
      info->returns = handle->schema().returns().size();
      info->handle = *handle;
    }
  }
  return info;
}

}  // namespace details

// Process-wide cache, shared by all threads; entries are never freed (operators live as long as
// the process), so a returned reference stays valid.
class OpRegistry {
 public:
  static const OpInfo& lookup(const at::RecordFunction& fn) {
    const char* key = fn.name();
    // Records that are not operators (autograd's evaluate_function, user scopes) carry names in
    // short-lived strings: never cache those pointers. An operator's name lives in its schema.
    if (std::strncmp(key, "aten::", 6) != 0 && !is_custom_operator(fn, key)) return not_an_api();
    thread_local std::unordered_map<const char*, const OpInfo*> local;
    if (auto it = local.find(key); it != local.end() && it->second->qualified == key) return *it->second;
    const OpInfo& info = instance().find_or_add(fn, key);
    local[key] = &info;
    return info;
  }

 private:
  // A dispatcher operator (it has a schema) of a namespace that is neither aten nor internal.
  static bool is_custom_operator(const at::RecordFunction& fn, const char* name) {
    const auto parts = split_qualified(name);
    if (!parts || internal_namespace(parts->first) || parts->first.find(' ') != std::string_view::npos) return false;
    return fn.operator_name().has_value();
  }

  static OpRegistry& instance() {
    static OpRegistry* r = new OpRegistry();  // never destroyed: callbacks may outlive statics
    return *r;
  }
  const OpInfo& find_or_add(const at::RecordFunction& fn, const char* key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = ops_[key];
    if (slot && slot->qualified != key) retired_.push_back(std::move(slot));  // other threads may still point at it
    if (!slot) {
      slot = details::op_info_of(fn);
      // Overloads (add.Tensor, add.Scalar) share one counter, as they share one name.
      slot->key_id = key_ids_.emplace(slot->key, key_ids_.size()).first->second;
    }
    return *slot;
  }

 public:
  // An API with no operator of its own ("Distributed.all_reduce": collectives are recorded by
  // wrappers, not by the observer): its info, with a counter key of its own.
  static const OpInfo& named(const std::string& family, const std::string& api) {
    OpRegistry& r = instance();
    std::lock_guard<std::mutex> lock(r.mutex_);
    auto& slot = r.named_[family + "." + api];
    if (!slot) {
      slot = std::make_unique<OpInfo>();
      slot->qualified = family + "::" + api;
      slot->api = api;
      slot->key = family + "." + api + ".";
      slot->user_api = true;
      slot->key_id = r.key_ids_.emplace(slot->key, r.key_ids_.size()).first->second;
    }
    return *slot;
  }

 private:
  static const OpInfo& not_an_api() {
    static const OpInfo none{};
    return none;
  }
  std::mutex mutex_;
  std::unordered_map<const char*, std::unique_ptr<OpInfo>> ops_;
  std::vector<std::unique_ptr<OpInfo>> retired_;
  std::unordered_map<std::string, std::unique_ptr<OpInfo>> named_;
  std::unordered_map<std::string, std::size_t> key_ids_;
};

}  // namespace torchprobe::capture

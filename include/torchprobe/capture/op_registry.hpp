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
#include <vector>

namespace torchprobe::capture {

// How an argument's IValue must be read: ScalarType/Layout/MemoryFormat travel boxed as plain
// ints, so only the schema says that an int is really a dtype.
enum class ArgKind { Generic, ScalarType, Layout, MemoryFormat };

struct ArgInfo {
  std::string name;
  bool kwarg_only = false;
  ArgKind kind = ArgKind::Generic;
  bool written = false;  // the op writes into it (in-place self, out=)
};

struct OpInfo {
  std::string qualified;   // "aten::add"
  std::string api;         // "add": the ATen name without namespace and overload
  std::string key;         // "Aten.add.": the per-API counter key and name prefix
  std::size_t key_id = 0;  // the same key as a small number, shared by all overloads of the API
  bool user_api = false;   // an aten:: op that is not on the infrastructure list
  bool schema_known = false;
  std::vector<ArgInfo> args;
  std::size_t returns = 0;                    // how many values the schema returns
  std::optional<c10::OperatorHandle> handle;  // to call the op again (free_benchmark)
};

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

namespace detail {

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

}  // namespace detail

// Process-wide cache, shared by all threads; entries are never freed (operators live as long as
// the process), so a returned reference stays valid.
class OpRegistry {
 public:
  static const OpInfo& lookup(const at::RecordFunction& fn) {
    const char* key = fn.name();
    // Records that are not ATen operators (autograd's evaluate_function, user scopes) carry
    // names in short-lived strings: never cache those pointers.
    if (std::strncmp(key, "aten::", 6) != 0) return not_an_api();
    thread_local std::unordered_map<const char*, const OpInfo*> local;
    if (auto it = local.find(key); it != local.end() && it->second->qualified == key) return *it->second;
    const OpInfo& info = instance().find_or_add(fn, key);
    local[key] = &info;
    return info;
  }

 private:
  static OpRegistry& instance() {
    static OpRegistry* r = new OpRegistry();  // never destroyed: callbacks may outlive statics
    return *r;
  }
  const OpInfo& find_or_add(const at::RecordFunction& fn, const char* key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = ops_[key];
    if (slot && slot->qualified != key) retired_.push_back(std::move(slot));  // other threads may still point at it
    if (!slot) {
      slot = detail::op_info_of(fn);
      // Overloads (add.Tensor, add.Scalar) share one counter, as they share one name.
      slot->key_id = key_ids_.emplace(slot->key, key_ids_.size()).first->second;
    }
    return *slot;
  }
  static const OpInfo& not_an_api() {
    static const OpInfo none{};
    return none;
  }
  std::mutex mutex_;
  std::unordered_map<const char*, std::unique_ptr<OpInfo>> ops_;
  std::vector<std::unique_ptr<OpInfo>> retired_;
  std::unordered_map<std::string, std::size_t> key_ids_;
};

}  // namespace torchprobe::capture

#pragma once
// From a recorded API to the operator that replays it: the name gives the operator (Aten.{op}.{n},
// and msprobe's Torch./Tensor./Functional. names are ATen functions too), the recorded arguments
// pick the overload when the dump does not name it (as torch.ops.aten.{op}(*args) does in msprobe),
// and the arguments are bound to that schema's stack for callBoxed.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <cctype>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "torchprobe/analysis/run_ut/inputs.hpp"

namespace torchprobe::run_ut {

using Kwargs = std::vector<std::pair<std::string, Arg>>;

// What to call: "aten::add" and an overload ("" = resolve from the arguments), plus arguments the
// name implies (Tensor.float is aten::to with dtype float32).
struct OpTarget {
  std::string qualified;
  std::string overload;
  bool resolve = true;
  std::vector<Arg> extra_args;
};

// Why an API is not replayed (msprobe's SKIP messages where it has one).
struct NotReplayable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline OpTarget target_of(const std::string& type, const std::string& api) {
  if (type == "Distributed" || type == "MindSpeed")
    throw NotReplayable("API " + api + " not support for run ut. SKIP.");
  OpTarget t;
  std::string op = api;
  if (type == "Aten") {
    const auto dot = api.find('.');
    if (dot != std::string::npos) {  // Aten.add.Tensor.0: the overload is in the name
      op = api.substr(0, dot);
      t.overload = api.substr(dot + 1);
      t.resolve = false;
    }
    t.qualified = "aten::" + op;
    return t;
  }
  static const std::pair<const char*, const char*> dunders[] = {
      {"__add__", "add"},   {"__iadd__", "add_"},       {"__radd__", "add"},      {"__sub__", "sub"},
      {"__isub__", "sub_"}, {"__mul__", "mul"},         {"__imul__", "mul_"},     {"__rmul__", "mul"},
      {"__div__", "div"},   {"__truediv__", "div"},     {"__idiv__", "div_"},     {"__matmul__", "matmul"},
      {"__neg__", "neg"},   {"__and__", "bitwise_and"}, {"__or__", "bitwise_or"}, {"__eq__", "eq"},
      {"__ne__", "ne"},     {"__lt__", "lt"},           {"__le__", "le"},         {"__gt__", "gt"},
      {"__ge__", "ge"},     {"__pow__", "pow"}};
  for (const auto& [from, to] : dunders)
    if (api == from) op = to;
  static const std::pair<const char*, c10::ScalarType> casts[] = {
      {"float", at::kFloat}, {"double", at::kDouble}, {"half", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"int", at::kInt},     {"long", at::kLong},     {"bool", at::kBool}};
  if (type == "Tensor") {
    for (const auto& [name, dtype] : casts)
      if (api == name) {
        t.qualified = "aten::to";
        t.overload = "dtype";
        t.resolve = false;
        t.extra_args.push_back(make_arg(ArgKind::dtype, static_cast<int64_t>(dtype)));
        return t;
      }
  }
  if (type == "Torch" || type == "Tensor" || type == "Functional" || type == "NPU") {
    t.qualified = "aten::" + op;
    return t;
  }
  // Any other prefix names an operator namespace: "Mylib.noisy.0" replays mylib::noisy.
  std::string ns = type;
  for (auto& ch : ns) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  t.qualified = ns + "::" + op;
  return t;
}

// torch.nn.functional keywords that ATen spells differently or does not have.
inline void adapt_functional_kwargs(Kwargs& kwargs) {
  Kwargs out;
  for (auto& [k, v] : kwargs) {
    if (k == "inplace" || k == "_stacklevel") continue;
    out.emplace_back(k == "training" ? "train" : k, std::move(v));
  }
  kwargs = std::move(out);
}

namespace details {

inline std::optional<c10::IValue> convert(const Arg& a, c10::TypePtr type, c10::TypePtr real, int& penalty) {
  using K = c10::TypeKind;
  if (type->kind() == K::OptionalType) {
    if (a.kind == ArgKind::none) return c10::IValue();
    type = type->expectRef<c10::OptionalType>().getElementType();
    if (real->kind() == K::OptionalType) real = real->expectRef<c10::OptionalType>().getElementType();
  }
  if (a.kind == ArgKind::none) return std::nullopt;
  switch (real->kind()) {
    case K::ScalarTypeType: return a.kind == ArgKind::dtype ? std::optional<c10::IValue>(a.value) : std::nullopt;
    case K::MemoryFormatType:
      return a.kind == ArgKind::memory_format ? std::optional<c10::IValue>(a.value) : std::nullopt;
    case K::LayoutType: return a.kind == ArgKind::layout ? std::optional<c10::IValue>(a.value) : std::nullopt;
    default: break;
  }
  switch (type->kind()) {
    case K::TensorType: return a.kind == ArgKind::tensor ? std::optional<c10::IValue>(a.value) : std::nullopt;
    case K::IntType:
    case K::SymIntType: return a.kind == ArgKind::integer ? std::optional<c10::IValue>(a.value) : std::nullopt;
    case K::FloatType:
      if (a.kind == ArgKind::real) return a.value;
      if (a.kind == ArgKind::integer) return c10::IValue(static_cast<double>(a.value.toInt()));
      return std::nullopt;
    case K::NumberType:  // Scalar: a tensor overload is preferred when both fit
      ++penalty;
      if (a.kind == ArgKind::integer || a.kind == ArgKind::real || a.kind == ArgKind::boolean) return a.value;
      return std::nullopt;
    case K::BoolType: return a.kind == ArgKind::boolean ? std::optional<c10::IValue>(a.value) : std::nullopt;
    case K::StringType: return a.kind == ArgKind::text ? std::optional<c10::IValue>(a.value) : std::nullopt;
    case K::DeviceObjType: return a.kind == ArgKind::device ? std::optional<c10::IValue>(a.value) : std::nullopt;
    case K::ListType: {
      const auto elem = type->expectRef<c10::ListType>().getElementType();
      const auto ek = elem->kind();
      if (ek == K::IntType || ek == K::SymIntType) {
        if (a.kind == ArgKind::int_list) return a.value;
        if (a.kind == ArgKind::integer) return c10::IValue(c10::List<int64_t>({a.value.toInt()}));
        return std::nullopt;
      }
      if (ek == K::FloatType && (a.kind == ArgKind::real_list || a.kind == ArgKind::int_list)) {
        c10::List<double> l;
        for (const auto& e : a.value.toListRef())
          l.push_back(e.isInt() ? static_cast<double>(e.toInt()) : e.toDouble());
        return c10::IValue(l);
      }
      if (ek == K::BoolType && a.kind == ArgKind::bool_list) return a.value;
      if (a.kind != ArgKind::tensor_list) return std::nullopt;
      if (ek == K::TensorType) {
        c10::List<at::Tensor> l;
        for (const auto& e : a.items) {
          if (e.kind != ArgKind::tensor) return std::nullopt;
          l.push_back(e.value.toTensor());
        }
        return c10::IValue(l);
      }
      if (ek == K::OptionalType) {
        c10::List<c10::optional<at::Tensor>> l;
        for (const auto& e : a.items)
          l.push_back(e.kind == ArgKind::tensor ? c10::optional<at::Tensor>(e.value.toTensor()) : c10::nullopt);
        return c10::IValue(l);
      }
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}

}  // namespace details

// The stack of `schema` for these arguments, or nullopt when they do not fit it. `defaults`
// counts the defaulted arguments and Scalar conversions (fewer is a closer fit).
inline std::optional<std::vector<c10::IValue>> bind_exact(const c10::FunctionSchema& schema,
                                                          const std::vector<Arg>& args, const Kwargs& kwargs,
                                                          int& defaults) {
  defaults = 0;
  const auto& params = schema.arguments();
  std::vector<c10::IValue> stack;
  std::size_t used_kwargs = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    const Arg* given = nullptr;
    if (i < args.size()) {
      if (p.kwarg_only()) return std::nullopt;
      given = &args[i];
    } else {
      for (const auto& [k, v] : kwargs)
        if (k == p.name()) given = &v;
      if (given) ++used_kwargs;
    }
    if (!given) {
      if (!p.default_value()) return std::nullopt;
      stack.push_back(*p.default_value());
      ++defaults;
      continue;
    }
    auto v = details::convert(*given, p.type(), p.real_type(), defaults);
    if (!v) return std::nullopt;
    stack.push_back(std::move(*v));
  }
  if (args.size() > params.size() || used_kwargs != kwargs.size()) return std::nullopt;
  return stack;
}

// Python varargs: x.view(2, 4), x.permute(1, 0), torch.einsum("ij->ji", a) pass as separate
// arguments what the schema takes as one list; when the arguments do not fit as they are, the
// trailing ones are gathered into the first list parameter they reach.
inline std::optional<std::vector<c10::IValue>> bind_schema(const c10::FunctionSchema& schema,
                                                           const std::vector<Arg>& args, const Kwargs& kwargs,
                                                           int& defaults) {
  if (auto stack = bind_exact(schema, args, kwargs, defaults)) return stack;
  const auto& params = schema.arguments();
  for (std::size_t i = 0; i < params.size() && i < args.size(); ++i) {
    if (params[i].kwarg_only()) break;
    if (params[i].type()->kind() != c10::TypeKind::ListType) continue;
    const ArgKind k = args[i].kind;
    if (k != ArgKind::integer && k != ArgKind::tensor) return std::nullopt;
    std::vector<Arg> packed(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(i));
    Arg list = make_arg(k == ArgKind::integer ? ArgKind::int_list : ArgKind::tensor_list, c10::IValue());
    c10::List<int64_t> ints;
    for (std::size_t j = i; j < args.size(); ++j) {
      if (args[j].kind != k) return std::nullopt;
      if (k == ArgKind::integer)
        ints.push_back(args[j].value.toInt());
      else
        list.items.push_back(args[j]);
    }
    if (k == ArgKind::integer) list.value = ints;
    packed.push_back(std::move(list));
    return bind_exact(schema, packed, kwargs, defaults);
  }
  return std::nullopt;
}

struct ResolvedOp {
  c10::OperatorHandle handle;
  std::string overload;
};

// The overload these arguments call; out= overloads are never chosen.
inline ResolvedOp resolve(const OpTarget& t, const std::vector<Arg>& args, const Kwargs& kwargs) {
  const auto sym = c10::Symbol::fromQualString(t.qualified);
  const auto& ops = torch::jit::getAllOperatorsFor(sym);
  if (ops.empty()) throw NotReplayable("operator " + t.qualified + " is unknown to this libtorch");
  const c10::FunctionSchema* best = nullptr;
  int best_defaults = 1 << 30;
  for (const auto& op : ops) {
    const c10::FunctionSchema& s = op->schema();
    if (!t.resolve && s.overload_name() != t.overload) continue;
    if (t.resolve && s.overload_name().find("out") != std::string::npos) continue;
    int defaults = 0;
    if (bind_schema(s, args, kwargs, defaults) && defaults < best_defaults) {
      best = &s;
      best_defaults = defaults;
    }
  }
  if (!best)
    throw NotReplayable("no overload of " + t.qualified + (t.resolve ? "" : "." + t.overload) +
                        " takes the recorded arguments");
  auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(t.qualified.c_str(), best->overload_name().c_str());
  return {handle, best->overload_name()};
}

}  // namespace torchprobe::run_ut

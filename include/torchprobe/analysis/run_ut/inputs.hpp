#pragma once
// The arguments of one recorded call, rebuilt from its dump.json description (spec B.3): tensors
// from their .pt file (torch.save zip, msprobe's or TorchProbe's), or, in a statistics dump,
// generated within [Min, Max]; scalars, lists, dtypes and memory formats from their typed values.
// Random inputs use a seed made from the API's name, so filters never change other APIs' inputs
// (msprobe seeds once and draws in API order: spec C9).
#include <torch/serialize.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <utility>
#include <iterator>
#include <string>
#include <vector>

#include "torchprobe/analysis/run_ut/api_case.hpp"
#include "torchprobe/io/data_file_name.hpp"
#include "torchprobe/io/pt_reader.hpp"

namespace torchprobe::run_ut {

// What an argument is, beyond its IValue: an int may stand for a dtype or a memory format.
enum class ArgKind {
  none,
  tensor,
  integer,
  real,
  boolean,
  text,
  dtype,
  memory_format,
  layout,
  device,
  int_list,
  real_list,
  bool_list,
  tensor_list
};

struct Arg {
  ArgKind kind = ArgKind::none;
  c10::IValue value;
  bool requires_grad = false;  // a tensor the dump marked requires_grad
  std::vector<Arg> items;      // the elements of a tensor list
};

inline Arg make_arg(ArgKind kind, c10::IValue value) {
  Arg a;
  a.kind = kind;
  a.value = std::move(value);
  return a;
}

inline c10::ScalarType dtype_from_name(const std::string& name) {
  static const std::pair<const char*, c10::ScalarType> table[] = {{"torch.float32", at::kFloat},
                                                                  {"torch.float", at::kFloat},
                                                                  {"torch.float64", at::kDouble},
                                                                  {"torch.double", at::kDouble},
                                                                  {"torch.float16", at::kHalf},
                                                                  {"torch.half", at::kHalf},
                                                                  {"torch.bfloat16", at::kBFloat16},
                                                                  {"torch.int64", at::kLong},
                                                                  {"torch.long", at::kLong},
                                                                  {"torch.int32", at::kInt},
                                                                  {"torch.int", at::kInt},
                                                                  {"torch.int16", at::kShort},
                                                                  {"torch.int8", at::kChar},
                                                                  {"torch.uint8", at::kByte},
                                                                  {"torch.bool", at::kBool},
                                                                  {"torch.complex64", at::kComplexFloat},
                                                                  {"torch.complex128", at::kComplexDouble}};
  for (const auto& [n, t] : table)
    if (name == n) return t;
  throw RunUtError("unsupported dtype '" + name + "'");
}

inline at::Tensor load_pt(const std::string& file) {
  if (!std::ifstream(file)) throw RunUtError("tensor file missing: " + file);
  c10::IValue v;
  try {
    v = io::read_pt_file(file);
  } catch (const io::PtFileError& e) {
    throw RunUtError(e.what());
  }
  if (!v.isTensor()) throw RunUtError(file + " does not hold a tensor");
  return v.toTensor();
}

inline std::uint64_t name_seed(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// An integer of the dump (a value, a size, a dim). JSON may write it as 3, 3.0 or 1e30; nlohmann's
// get<int64_t>() casts a float blindly (undefined beyond int64's range), so it is checked here.
inline int64_t json_int(const Json& v, const char* what) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
  if (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return static_cast<int64_t>(v.get<uint64_t>());
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // [-2^63, 2^63): the doubles that convert to int64 exactly.
    if (std::isfinite(d) && d == std::trunc(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0)
      return static_cast<int64_t>(d);
  }
  throw RunUtError(std::string(what) + " is " + v.dump() + ": not an integer that fits in int64");
}

inline std::vector<int64_t> json_int_list(const Json& v, const char* what) {
  if (!v.is_array()) throw RunUtError(std::string(what) + " is " + v.dump() + ": not a list of integers");
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (const auto& e : v) out.push_back(json_int(e, what));
  return out;
}

// The integer bounds [Min, Max] of an integer tensor, from the recorded statistics (doubles in a
// dump). A bound beyond the dtype's range is the dtype's bound: a statistic of int64 written as a
// float may round past it (9223372036854775807 reads as 2^63). Not a number or infinite: refused.
inline std::pair<int64_t, int64_t> integer_bounds(double lo, double hi, c10::ScalarType dtype) {
  if (!std::isfinite(lo) || !std::isfinite(hi))
    throw RunUtError("Min " + c10::str(lo) + " and Max " + c10::str(hi) + " of a " + c10::toString(dtype) +
                     " tensor: an integer tensor's bounds must be finite");
  if (lo > hi) throw RunUtError("Min " + c10::str(lo) + " is above Max " + c10::str(hi));
  int64_t least = std::numeric_limits<int64_t>::min(), most = std::numeric_limits<int64_t>::max();
  switch (dtype) {
    case at::kByte: least = 0, most = 255; break;
    case at::kChar: least = -128, most = 127; break;
    case at::kShort: least = -32768, most = 32767; break;
    case at::kInt: least = std::numeric_limits<int32_t>::min(), most = std::numeric_limits<int32_t>::max(); break;
    default: break;
  }
  const auto clamp = [&](double d) {
    if (d <= static_cast<double>(least)) return least;
    if (d >= static_cast<double>(most)) return most;  // for int64 that is 2^63: caught before the cast
    return static_cast<int64_t>(d);
  };
  return {clamp(lo), clamp(hi)};
}

// The most bytes one rebuilt tensor may take: this machine's memory. A dump entry is a file from
// elsewhere; its shape is checked before anything is allocated, never trusted.
inline std::int64_t machine_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::int64_t>(pages) * page : std::int64_t(1) << 34;
}

// Refuses a shape with a negative size, more dimensions than ATen takes, or more bytes than `most`.
inline void check_shape(const std::vector<int64_t>& shape, c10::ScalarType dtype, std::int64_t most) {
  const auto shown = [&] { return "shape " + c10::str(c10::IntArrayRef(shape)); };
  if (shape.size() > 64) throw RunUtError(shown() + " has more than 64 dimensions");
  std::int64_t bytes = static_cast<std::int64_t>(c10::elementSize(dtype));
  for (const int64_t d : shape) {
    if (d < 0) throw RunUtError(shown() + " has a negative size");
    if (d != 0 && bytes > most / d)
      bytes = most + 1;  // keeps the product from overflowing
    else
      bytes *= d;
  }
  if (bytes > most)
    throw RunUtError(shown() + " of " + c10::toString(dtype) + " needs more than " + std::to_string(most) +
                     " bytes (the most one rebuilt tensor may take)");
}

// A tensor of the recorded shape and dtype within [Min, Max], first element Min and last Max.
inline at::Tensor random_tensor(const Json& spec, at::Generator& gen,
                                std::int64_t most_bytes = machine_memory_bytes()) {
  std::vector<int64_t> shape = json_int_list(spec.at("shape"), "a tensor's \"shape\"");
  const c10::ScalarType dtype = dtype_from_name(spec.at("dtype").get<std::string>());
  check_shape(shape, dtype, most_bytes);
  const auto num = [&](const char* k, double dflt) {
    const auto& v = spec.contains(k) ? spec[k] : Json();
    return v.is_number() ? v.get<double>() : dflt;
  };
  const double lo = num("Min", 0), hi = num("Max", 1);
  at::Tensor t;
  if (dtype == at::kBool) {
    t = at::randint(0, 2, shape, gen, at::TensorOptions().dtype(at::kLong)).gt(0);
  } else if (!c10::isFloatingType(dtype)) {
    const auto [least, most] = integer_bounds(lo, hi, dtype);
    // randint's upper bound is exclusive; at int64's top the last element below is set to Max anyway.
    t = least == most ? at::full(shape, least, at::TensorOptions().dtype(at::kLong))
                      : at::randint(least, most < std::numeric_limits<int64_t>::max() ? most + 1 : most, shape, gen,
                                    at::TensorOptions().dtype(at::kLong));
    t = t.to(dtype);
    if (t.numel() > 0) {
      at::Tensor flat = t.view(-1);
      flat[0] = least;
      flat[-1] = most;
    }
    return t;
  } else {
    t = (at::rand(shape, gen, at::TensorOptions().dtype(at::kDouble)) * (hi - lo) + lo).to(dtype);
  }
  if (t.numel() > 0 && dtype != at::kBool) {
    at::Tensor flat = t.view(-1);
    flat[0] = lo;
    flat[-1] = hi;
  }
  return t;
}

class InputBuilder {
 public:
  InputBuilder(std::string data_dir, const std::string& api_name) : dir_(std::move(data_dir)) {
    gen_ = at::detail::createCPUGenerator(name_seed(api_name));
  }

  // The most bytes one rebuilt tensor may take (default: this machine's memory).
  void set_max_tensor_bytes(std::int64_t most) { max_tensor_bytes_ = most; }

  Arg build(const Json& j) {
    Arg a;
    if (j.is_null()) return a;
    if (j.is_array()) return list(j);
    if (!j.is_object() || !j.contains("type")) throw RunUtError("argument without a \"type\": " + j.dump());
    const std::string type = j["type"].get<std::string>();
    if (type == "torch.Tensor" || type == "torch.nn.parameter.Parameter") {
      a.kind = ArgKind::tensor;
      a.requires_grad = j.value("requires_grad", false);
      if (j.contains("data_name") && j["data_name"].is_string() && !dir_.empty()) {
        const std::string name = j["data_name"].get<std::string>();
        if (const auto problem = io::data_file_name_problem(name))
          throw RunUtError("data_name \"" + name + "\" is not a file in " + dir_ + ": " + *problem);
        a.value = load_pt(dir_ + "/" + name);
      } else {
        a.value = random_tensor(j, gen_, max_tensor_bytes_);
      }
      return a;
    }
    const Json& v = j.contains("value") ? j["value"] : Json();
    if (type == "int") return make_arg(ArgKind::integer, json_int(v, "an \"int\" argument's \"value\""));
    if (type == "float")
      return make_arg(ArgKind::real, v.is_number() ? v.get<double>() : std::stod(v.get<std::string>()));
    if (type == "bool") return make_arg(ArgKind::boolean, v.get<bool>());
    if (type == "str") return make_arg(ArgKind::text, v.get<std::string>());
    if (type == "torch.dtype")
      return make_arg(ArgKind::dtype, static_cast<int64_t>(dtype_from_name(v.get<std::string>())));
    if (type == "torch.device") return make_arg(ArgKind::device, c10::Device(v.get<std::string>()));
    if (type == "torch.Size")
      return make_arg(ArgKind::int_list, c10::List<int64_t>(json_int_list(v, "a \"torch.Size\" argument's \"value\"")));
    if (type == "torch.memory_format") {
      const std::string f = j.value("format", "preserve_format");
      c10::MemoryFormat m = c10::MemoryFormat::Preserve;
      if (f == "contiguous_format")
        m = c10::MemoryFormat::Contiguous;
      else if (f == "channels_last")
        m = c10::MemoryFormat::ChannelsLast;
      else if (f == "channels_last_3d")
        m = c10::MemoryFormat::ChannelsLast3d;
      return make_arg(ArgKind::memory_format, static_cast<int64_t>(m));
    }
    throw RunUtError("argument type '" + type + "' cannot be rebuilt");
  }

 private:
  Arg list(const Json& j) {
    std::vector<Arg> items;
    for (const auto& e : j) items.push_back(build(e));
    bool ints = true, reals = true, bools = true, tensors = true;
    for (const auto& e : items) {
      ints = ints && e.kind == ArgKind::integer;
      reals = reals && (e.kind == ArgKind::real || e.kind == ArgKind::integer);
      bools = bools && e.kind == ArgKind::boolean;
      tensors = tensors && (e.kind == ArgKind::tensor || e.kind == ArgKind::none);
    }
    Arg a;
    if (ints) {  // an empty list too: most empty lists are dims
      c10::List<int64_t> l;
      for (const auto& e : items) l.push_back(e.value.toInt());
      return make_arg(ArgKind::int_list, l);
    }
    if (reals) {
      c10::List<double> l;
      for (const auto& e : items)
        l.push_back(e.value.isInt() ? static_cast<double>(e.value.toInt()) : e.value.toDouble());
      return make_arg(ArgKind::real_list, l);
    }
    if (bools) {
      c10::List<bool> l;
      for (const auto& e : items) l.push_back(e.value.toBool());
      return make_arg(ArgKind::bool_list, l);
    }
    if (tensors) {
      a.kind = ArgKind::tensor_list;
      for (const auto& e : items) a.requires_grad = a.requires_grad || e.requires_grad;
      a.items = std::move(items);  // the IValue is made when bound: Tensor[] or Tensor?[]
      return a;
    }
    throw RunUtError("a list mixing argument kinds cannot be rebuilt");
  }

  std::string dir_;
  at::Generator gen_;
  std::int64_t max_tensor_bytes_ = machine_memory_bytes();
};

}  // namespace torchprobe::run_ut

#pragma once
// The four statistics msprobe writes per tensor (Max, Min, Mean, Norm) as plain host values.
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>

namespace torchprobe {

// One statistic. Max/Min keep the tensor's own kind (an int64 max stays a JSON integer, a bool
// tensor's max is `true`), Mean/Norm are doubles, and anything undefined is JSON null.
struct StatValue {
  enum class Kind : std::uint8_t { Null, Bool, Int, Float };
  Kind kind = Kind::Null;
  // The value of `kind` (16 bytes a statistic: an open step holds four per tensor).
  union {
    std::int64_t i = 0;
    double d;
    bool b;
  };

  static StatValue null() { return {}; }
  static StatValue boolean(bool v) {
    StatValue s;
    s.kind = Kind::Bool;
    s.b = v;
    return s;
  }
  static StatValue integer(std::int64_t v) {
    StatValue s;
    s.kind = Kind::Int;
    s.i = v;
    return s;
  }
  static StatValue real(double v) {
    StatValue s;
    s.kind = Kind::Float;
    s.d = v;
    return s;
  }

  bool is_null() const { return kind == Kind::Null; }
  // The value as a double (NaN for null), for comparisons and overflow checks.
  double as_double() const {
    switch (kind) {
      case Kind::Bool: return b ? 1.0 : 0.0;
      case Kind::Int: return static_cast<double>(i);
      case Kind::Float: return d;
      case Kind::Null: break;
    }
    return std::numeric_limits<double>::quiet_NaN();
  }
};

inline void to_json(nlohmann::ordered_json& j, const StatValue& v) {
  switch (v.kind) {
    case StatValue::Kind::Null: j = nullptr; return;
    case StatValue::Kind::Bool: j = v.b; return;
    case StatValue::Kind::Int: j = v.i; return;
    case StatValue::Kind::Float: j = v.d; return;
  }
}

struct TensorStats {
  StatValue max, min, mean, norm;
};

}  // namespace torchprobe

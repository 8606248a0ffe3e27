#pragma once
// The cells of msprobe's run_ut CSVs: each metric is a Python or numpy value that msprobe writes as
// "{:.14f}" when it is a Python float (numpy float64 included), else with str() (numpy float32 in
// its shortest form, ints as digits). Which one a metric is depends on the dtypes it was computed
// in, so a cell remembers its kind (../shared/spec/msprobe-grad-probe-run-ut.md B.7).
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "torchprobe/io/python_csv.hpp"

namespace torchprobe::run_ut {

// numpy's str() of a float32: the shortest digits that read back as the same float32, laid out as
// Python's repr (scientific when the decimal exponent is < -4 or >= 16).
inline std::string numpy_float32_str(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[48];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  const char* p = buf;
  std::string out;
  if (*p == '-') {
    out += '-';
    ++p;
  }
  std::string digits;
  for (; p != r.ptr && *p != 'e'; ++p)
    if (*p != '.') digits += *p;
  int exp10 = 0;
  if (p != r.ptr) std::from_chars(p + 1 + (p[1] == '+' ? 1 : 0), r.ptr, exp10);
  const int n = static_cast<int>(digits.size());
  if (exp10 < -4 || exp10 >= 16) {
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    out += exp10 < 0 ? "e-" : "e+";
    const int mag = exp10 < 0 ? -exp10 : exp10;
    if (mag < 10) out += '0';
    return out + std::to_string(mag);
  }
  if (exp10 >= 0) {
    const int int_len = exp10 + 1;
    if (n <= int_len) return out + digits + std::string(static_cast<std::size_t>(int_len - n), '0') + ".0";
    return out + digits.substr(0, static_cast<std::size_t>(int_len)) + "." +
           digits.substr(static_cast<std::size_t>(int_len));
  }
  return out + "0." + std::string(static_cast<std::size_t>(-exp10 - 1), '0') + digits;
}

// Python's "{:.14f}".format(x).
inline std::string python_fixed14(double v) { return io::python_float_format(v, "%.14f"); }

struct Cell {
  enum class Kind { space, f64, f32, integer, text };
  Kind kind = Kind::space;
  double value = 0;
  std::string text;

  static Cell f64(double v) { return {Kind::f64, v, {}}; }
  static Cell f32(double v) { return {Kind::f32, v, {}}; }
  static Cell integer(std::int64_t v) { return {Kind::integer, static_cast<double>(v), {}}; }
  static Cell str(std::string s) { return {Kind::text, 0, std::move(s)}; }
  // A value computed in float64 (Python float) or in float32 (numpy float32), as msprobe had it.
  static Cell real(double v, bool in_float64) { return in_float64 ? f64(v) : f32(v); }

  bool set() const { return kind != Kind::space; }
  std::string render() const {
    switch (kind) {
      case Kind::space: return " ";
      case Kind::f64: return python_fixed14(value);
      case Kind::f32: return numpy_float32_str(static_cast<float>(value));
      case Kind::integer: return std::to_string(static_cast<std::int64_t>(value));
      case Kind::text: return text;
    }
    return " ";
  }
};

}  // namespace torchprobe::run_ut

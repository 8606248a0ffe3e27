#pragma once
// How msprobe's compare (Python + pandas) turns values into text and text back into numbers. The
// CSV is made of str() of Python objects, and its differences are computed from numbers that
// pandas re-parsed from that text, so both directions are reproduced here, quirks included.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "torchprobe/io/json_text.hpp"
#include "torchprobe/io/python_csv.hpp"

namespace torchprobe::compare {

// Python's str(float): repr, with nan/inf spelled as Python spells them (not as json does).
inline std::string py_float_str(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return io::python_float_repr(v);
}

// Python's repr(str): single quotes unless the text holds a single quote and no double quote.
inline std::string py_str_repr(std::string_view s) {
  const bool dq = s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  static constexpr char kHex[] = "0123456789abcdef";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;  // UTF-8 bytes of printable characters stay as they are, as in Python 3
    }
  }
  out += q;
  return out;
}

// Python's repr() of the object json.load made of `j` (str() is the same except for a string).
inline std::string py_repr(const nlohmann::ordered_json& j) {
  using T = nlohmann::detail::value_t;
  switch (j.type()) {
    case T::null: return "None";
    case T::boolean: return j.get<bool>() ? "True" : "False";
    case T::number_integer: return std::to_string(j.get<std::int64_t>());
    case T::number_unsigned: return std::to_string(j.get<std::uint64_t>());
    case T::number_float: return py_float_str(j.get<double>());
    case T::string: return py_str_repr(j.get_ref<const std::string&>());
    case T::array: {
      std::string out = "[";
      for (std::size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + py_repr(j[i]);
      return out + "]";
    }
    case T::object: {
      std::string out = "{";
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it, first = false)
        out += (first ? "" : ", ") + py_str_repr(it.key()) + ": " + py_repr(it.value());
      return out + "}";
    }
    default: return "None";
  }
}
inline std::string py_str(const nlohmann::ordered_json& j) { return j.is_string() ? j.get<std::string>() : py_repr(j); }

// pandas.to_numeric on text (pandas' precise_xstrtod, the parser of the pandas that wrote the
// reference CSV): up to 17 significant digits are accumulated in a double, then scaled by one power
// of ten -- two roundings, so e.g. "1.8408576250076294" - "0.9859649538993835" comes out as
// 0.8548926711082456 where Python's float() gives ...458. `is_int` tells an integer literal.
struct PandasNumber {
  double value = 0;
  bool is_int = false;
};
inline std::optional<PandasNumber> pandas_parse(std::string_view s) {
  static const auto pow10 = [](int e) {
    double r = 1;
    for (int i = 0; i < e; ++i) r *= 10;  // exact up to 1e22, like the C table's literals
    return e <= 22 ? r : std::pow(10.0, e);
  };
  std::size_t p = 0;
  while (p < s.size() && s[p] == ' ') ++p;
  std::size_t end = s.size();
  while (end > p && s[end - 1] == ' ') --end;
  const std::string_view t = s.substr(p, end - p);
  if (t == "inf" || t == "+inf" || t == "Infinity" || t == "+Infinity") return PandasNumber{HUGE_VAL, false};
  if (t == "-inf" || t == "-Infinity") return PandasNumber{-HUGE_VAL, false};
  if (t == "nan" || t == "NaN") return PandasNumber{std::nan(""), false};
  std::size_t i = 0;
  bool neg = false;
  if (i < t.size() && (t[i] == '-' || t[i] == '+')) neg = t[i++] == '-';
  double number = 0;
  int exponent = 0, digits = 0, decimals = 0;
  bool is_int = true;
  const auto digit = [&](std::size_t k) { return k < t.size() && t[k] >= '0' && t[k] <= '9'; };
  for (; digit(i); ++i) {
    if (digits < 17) {
      number = number * 10. + (t[i] - '0');
      ++digits;
    } else {
      ++exponent;
    }
  }
  if (i < t.size() && t[i] == '.') {
    is_int = false;
    ++i;
    for (; digits < 17 && digit(i); ++i, ++digits, ++decimals) number = number * 10. + (t[i] - '0');
    while (digit(i)) ++i;
    exponent -= decimals;
  }
  if (digits == 0) return std::nullopt;
  if (neg) number = -number;
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    is_int = false;
    ++i;
    bool eneg = false;
    if (i < t.size() && (t[i] == '-' || t[i] == '+')) eneg = t[i++] == '-';
    long long n = 0;  // 17 digits at most, as pandas reads them; long long cannot overflow on them
    int nd = 0;
    for (; nd < 17 && digit(i); ++i, ++nd) n = n * 10 + (t[i] - '0');
    if (nd == 0) return std::nullopt;
    n = std::min(n, 100000LL);  // far beyond any double's exponent either way
    exponent += static_cast<int>(eneg ? -n : n);
  }
  if (i != t.size()) return std::nullopt;
  if (exponent > 308) {
    number = neg ? -HUGE_VAL : HUGE_VAL;
  } else if (exponent > 0) {
    number *= pow10(exponent);
  } else if (exponent < -308) {
    number = exponent < -616 ? 0. : number / pow10(-308 - exponent) / pow10(308);
  } else {
    number /= pow10(-exponent);
  }
  return PandasNumber{number, is_int};
}

// Python's float(text) after msprobe's strip('%') (str2float); text Python rejects gives 0.
inline double py_percent_to_float(std::string_view s) {
  while (!s.empty() && (s.front() == '%' || s.front() == ' ')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == '%' || s.back() == ' ')) s.remove_suffix(1);
  if (s.empty() || s.find_first_of("xXpP") != std::string_view::npos) return 0;
  const std::string text(s);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return 0;
  return v / 100;
}

// One CSV field as pandas' to_csv (csv.QUOTE_MINIMAL) writes it.
using io::csv_field;

}  // namespace torchprobe::compare

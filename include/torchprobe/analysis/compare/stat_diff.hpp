#pragma once
// The statistics columns of msprobe's compare table: each statistic's difference and relative error
// (msprobe's CalcStatsDiff, on the cells as pandas re-reads them), as short texts kept in place.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "torchprobe/analysis/compare/python_text.hpp"
#include "torchprobe/analysis/compare/rows.hpp"
#include "torchprobe/io/json_text.hpp"

namespace torchprobe::compare {

// A table cell's short text, kept in place: a statistic's difference or relative error (a number's
// repr, "N/A", "inf", ...: 26 characters at most). As std::strings, eight per row were most of the
// allocations of a large table.
class CellText {
 public:
  CellText() = default;
  CellText(std::string_view s) { assign(s); }  // NOLINT: a cell is made from its text
  CellText(const char* s) { assign(s); }       // NOLINT
  void assign(std::string_view s) {
    size_ = static_cast<unsigned char>(std::min(s.size(), sizeof data_));
    std::memcpy(data_, s.data(), size_);
  }
  // Room for the text, which the caller writes and then ends with set_end.
  char* begin() { return data_; }
  void set_end(const char* end) { size_ = static_cast<unsigned char>(end - data_); }
  operator std::string_view() const { return {data_, size_}; }  // NOLINT: read as its text
  std::string_view view() const { return {data_, size_}; }

 private:
  char data_[31] = {};
  unsigned char size_ = 0;
};

namespace details {

// CalcStatsDiff.classify
enum class ValType { num, nan, inf, neg_inf, device, na, other };
inline std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
inline ValType classify(const Json& v) {
  const std::string s = lower(py_str(v));
  if (s == "nan") return ValType::nan;
  if (s == "inf") return ValType::inf;
  if (s == "-inf") return ValType::neg_inf;
  if (v.is_number()) return ValType::num;
  if (v.is_string() && s != "true" && s != "false" && pandas_parse(v.get<std::string>())) return ValType::num;
  if (s.find("npu") != std::string::npos || s.find("cpu") != std::string::npos || s.find("cuda") != std::string::npos)
    return ValType::device;
  if (py_str(v) == "N/A") return ValType::na;
  return ValType::other;
}

inline const Json& na_cell() {
  static const Json na = "N/A";
  return na;
}

// classify(), numbers without a str() and lower() of them.
inline ValType classify_fast(const Json& v) {
  if (v.is_number_float()) {
    const double x = v.get<double>();
    return std::isnan(x) ? ValType::nan : std::isinf(x) ? (x > 0 ? ValType::inf : ValType::neg_inf) : ValType::num;
  }
  if (v.is_number()) return ValType::num;  // an integer's str() is its digits
  return classify(v);
}

// stat_diff's texts of two cells that are not both numbers.
inline std::pair<const char*, const char*> stat_diff_texts(ValType tn, ValType tb) {
  using V = ValType;
  if (tn == V::na || tb == V::na) return {"N/A", "N/A"};
  const auto dev_or_other = [](V t) { return t == V::device || t == V::other; };
  if (dev_or_other(tn) || dev_or_other(tb)) {
    if (tn == V::device && tb == V::device) return {"N/A", "N/A"};
    return {"Diff", "Diff"};
  }
  if (tn == V::nan || tb == V::nan) return {"Nan", "Nan"};
  if (tn == V::inf && (tb == V::num || tb == V::neg_inf)) return {"inf", "inf"};
  if (tn == V::neg_inf && (tb == V::num || tb == V::inf)) return {"-inf", "-inf"};
  if (tn == V::num && tb == V::inf) return {"-inf", "-inf"};
  if (tn == V::num && tb == V::neg_inf) return {"inf", "inf"};
  return {"N/A", "N/A"};
}

// Python's str(float) of v into `cell`, then `suffix`.
inline void put_py_float(CellText& cell, double v, std::string_view suffix = {}) {
  char* p = cell.begin();
  if (std::isnan(v) || std::isinf(v)) {
    const std::string_view t = std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
    p = std::copy(t.begin(), t.end(), p);
  } else {
    p = io::write_python_float(p, v);
  }
  cell.set_end(std::copy(suffix.begin(), suffix.end(), p));
}

// One statistic's diff and relative error cells for one row, from the cells and their str() (made once per
// cell: this runs for every row of a million-entry compare); `int_cols` says pandas parsed both whole
// columns as integers.
inline void stat_diff(const Json& n, const Json& b, std::string_view n_text, std::string_view b_text, bool int_cols,
                      CellText& diff_cell, CellText& rel_cell) {
  if (n_text == b_text) {
    diff_cell = rel_cell = "0";
    return;
  }
  const ValType tn = classify_fast(n), tb = classify_fast(b);
  using V = ValType;
  if (tn == V::num && tb == V::num) {
    const double x = pandas_parse(n_text)->value, y = pandas_parse(b_text)->value;
    const double diff = x - y;
    if (int_cols)
      diff_cell.set_end(std::to_chars(diff_cell.begin(), diff_cell.begin() + 24, static_cast<long long>(diff)).ptr);
    else
      put_py_float(diff_cell, diff);
    if (y == 0)
      rel_cell = "inf";
    else
      put_py_float(rel_cell, std::fabs(diff / y * 100), "%");
    return;
  }
  const auto [d, rel] = stat_diff_texts(tn, tb);
  diff_cell = d;
  rel_cell = rel;
}

inline std::pair<std::string, std::string> stat_diff(const Json& n, const Json& b, bool int_cols) {
  CellText d, rel;
  stat_diff(n, b, py_str(n), py_str(b), int_cols, d, rel);
  return {std::string(d.view()), std::string(rel.view())};
}

// str() of a table cell: a finite float's is written into `buf` (no string made: this runs eight
// times per row of a million-entry compare), anything else's kept in `keep`.
inline std::string_view cell_text(const Json& v, char (&buf)[40], std::string& keep) {
  if (v.is_number_float() && std::isfinite(v.get<double>()))
    return std::string_view(buf, static_cast<std::size_t>(io::write_python_float(buf, v.get<double>()) - buf));
  keep = py_str(v);
  return keep;
}

}  // namespace details

}  // namespace torchprobe::compare

#pragma once
// A run_ut details CSV as msprobe's api_precision_compare sees it: pandas.read_csv with its default
// typing, so a column whose every cell is a number holds numbers (ints when all are integers) and
// any other column holds text, with an empty cell (or "nan", "NA", ...) read as NaN. The kind of a
// cell matters downstream: a float is written back as "{:.14f}", an int or a text as it is.
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "torchprobe/io/python_csv.hpp"
#include "torchprobe/analysis/run_ut/cells.hpp"

namespace torchprobe::run_ut::precision {

struct PrecisionCompareError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One cell: Python's str, int or float.
struct Value {
  enum class Kind { text, integer, real };
  Kind kind = Kind::text;
  std::string text = " ";
  double real = 0;
  long long integer = 0;

  static Value str(std::string s) {
    Value v;
    v.text = std::move(s);
    return v;
  }
  static Value f(double x) {
    Value v;
    v.kind = Kind::real;
    v.real = x;
    return v;
  }
  static Value i(long long x) {
    Value v;
    v.kind = Kind::integer;
    v.integer = x;
    return v;
  }
  bool is_text() const { return kind == Kind::text; }
  // str(value)
  std::string py_str() const {
    if (kind == Kind::integer) return std::to_string(integer);
    if (kind == Kind::real) return io::python_float_str(real);
    return text;
  }
  // msprobe's write_detail_csv: "{:.14f}" for a float, str() for the rest.
  std::string detail_text() const { return kind == Kind::real ? python_fixed14(real) : py_str(); }
  // str.isspace(), which raises for a number as Python does.
  bool isspace() const {
    if (kind != Kind::text)
      throw PrecisionCompareError(std::string("'") + (kind == Kind::real ? "float" : "int") +
                                  "' object has no attribute 'isspace'");
    if (text.empty()) return false;
    for (const char c : text)
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f') return false;
    return true;
  }
};

// float(text) as Python reads it: surrounding blanks allowed, "inf"/"nan" spelled any case.
inline bool python_float(std::string_view s, double& out) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty() || s.find_first_of("xXpP") != std::string_view::npos) return false;
  const std::string t(s);
  char* end = nullptr;
  errno = 0;
  out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size();
}

// msprobe's convert_str_to_float, with its two messages.
inline double to_float(const Value& v) {
  if (v.kind == Value::Kind::real) return v.real;
  if (v.kind == Value::Kind::integer) return static_cast<double>(v.integer);
  double x = 0;
  if (v.text.find_first_not_of(" \t\r\n\v\f") == std::string::npos)
    throw PrecisionCompareError("ERROR: Input data is an empty string");
  if (!python_float(v.text, x)) throw PrecisionCompareError("ERROR: Input data cannot be converted to float");
  return x;
}

namespace details {

inline bool pandas_na(const std::string& s) {
  static const std::unordered_set<std::string> na = {
      "",     "#N/A", "#N/A N/A", "#NA",  "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
      "<NA>", "N/A",  "NA",       "NULL", "NaN",     "None",     "n/a",  "nan",  "null"};
  return na.count(s) > 0;
}

inline bool pandas_int(const std::string& s, long long& out) {
  if (s.empty()) return false;
  std::size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (i == s.size()) return false;
  for (std::size_t k = i; k < s.size(); ++k)
    if (s[k] < '0' || s[k] > '9') return false;
  errno = 0;
  out = std::strtoll(s.c_str(), nullptr, 10);
  return errno == 0;
}

inline bool pandas_float(const std::string& s, double& out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  return python_float(s, out);
}

}  // namespace details

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<Value>> rows;
  std::map<std::string, std::size_t> column;

  bool has(const std::string& name) const { return column.count(name) > 0; }
  const Value& at(std::size_t row, const std::string& name) const { return rows[row][column.at(name)]; }
};

// The table of a CSV text, typed column by column as pandas does.
inline Table table_from_csv(std::string_view text) {
  const auto raw = io::parse_csv(text);
  Table t;
  if (raw.empty()) return t;
  t.header = raw[0];
  for (std::size_t c = 0; c < t.header.size(); ++c) t.column.emplace(t.header[c], c);
  const std::size_t width = t.header.size();
  enum class Col { integer, real, text };
  std::vector<Col> kinds(width, Col::integer);
  std::vector<bool> has_na(width, false);
  for (std::size_t r = 1; r < raw.size(); ++r) {
    for (std::size_t c = 0; c < width; ++c) {
      const std::string cell = c < raw[r].size() ? raw[r][c] : std::string();
      if (details::pandas_na(cell)) {
        has_na[c] = true;
        continue;
      }
      long long n = 0;
      double x = 0;
      if (kinds[c] == Col::integer && details::pandas_int(cell, n)) continue;
      if (kinds[c] != Col::text && details::pandas_float(cell, x)) {
        kinds[c] = Col::real;
        continue;
      }
      kinds[c] = Col::text;
    }
  }
  for (std::size_t r = 1; r < raw.size(); ++r) {
    std::vector<Value> row;
    for (std::size_t c = 0; c < width; ++c) {
      const std::string cell = c < raw[r].size() ? raw[r][c] : std::string();
      long long n = 0;
      double x = 0;
      if (details::pandas_na(cell))
        row.push_back(Value::f(std::nan("")));
      else if (kinds[c] == Col::integer && !has_na[c] && details::pandas_int(cell, n))
        row.push_back(Value::i(n));
      else if (kinds[c] != Col::text && details::pandas_float(cell, x))
        row.push_back(Value::f(x));
      else
        row.push_back(Value::str(cell));
    }
    t.rows.push_back(std::move(row));
  }
  return t;
}

inline Table read_table(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw PrecisionCompareError("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return table_from_csv(ss.str());
}

}  // namespace torchprobe::run_ut::precision

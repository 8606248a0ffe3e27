#pragma once
// CSV text as Python's csv.writer (and pandas' to_csv) writes it (',' between fields, "\r\n" after each row, a field
// quoted only when it holds ',', '"', '\r' or '\n'), in a file opened with encoding "utf-8-sig"
// (a byte order mark first): msprobe's grad_probe and GradComparator files.
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "torchprobe/io/json_text.hpp"

namespace torchprobe::io {

inline constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";

inline void append_csv_field(std::string& out, std::string_view s) {
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) {
    out.append(s);
    return;
  }
  out += '"';
  for (const char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
}

inline std::string csv_field(std::string_view s) {
  std::string out;
  append_csv_field(out, s);
  return out;
}

inline void append_csv_row(std::string& out, const std::vector<std::string>& fields) {
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i) out += ',';
    append_csv_field(out, fields[i]);
  }
  out += "\r\n";
}

// Python's str(float): the shortest repr, with "nan", "inf", "-inf".
inline std::string python_float_str(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return python_float_repr(v);
}

}  // namespace torchprobe::io

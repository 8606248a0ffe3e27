#pragma once
// CSV text as Python's csv.writer (and pandas' to_csv) writes it (',' between fields, "\r\n" after each row, a field
// quoted only when it holds ',', '"', '\r' or '\n'), in a file opened with encoding "utf-8-sig"
// (a byte order mark first): msprobe's grad_probe and GradComparator files.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "torchprobe/io/json_text.hpp"

namespace torchprobe::io {

inline constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";

inline void append_csv_field(std::string& out, std::string_view s) {
  // One pass over the characters (find_first_of calls memchr on the four for every character).
  const bool plain =
      std::none_of(s.begin(), s.end(), [](char c) { return c == ',' || c == '"' || c == '\r' || c == '\n'; });
  if (plain) {
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

// A float formatted as Python formats it with a fixed precision ("%.3g", "%.14f" in printf's words,
// '{:.3g}', '{:.14f}' in Python's): "nan", "inf", "-inf" for the non-finite.
inline std::string python_float_format(double v, const char* printf_format) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[400];  // "%.14f" of the largest double takes 324
  std::snprintf(buf, sizeof buf, printf_format, v);
  return buf;
}

// Python's str(float): the shortest repr, with "nan", "inf", "-inf".
inline std::string python_float_str(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return python_float_repr(v);
}

// The rows of a CSV text as Python's csv.reader reads them (a leading byte order mark dropped, fields
// quoted with '"' and '""' inside, line breaks inside quotes kept, rows ended by "\r\n" or "\n").
inline std::vector<std::vector<std::string>> parse_csv(std::string_view text) {
  if (text.substr(0, kUtf8Bom.size()) == kUtf8Bom) text.remove_prefix(kUtf8Bom.size());
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, any = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c != '"') {
        field += c;
      } else if (i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else {
        quoted = false;
      }
      continue;
    }
    any = true;
    if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      row.push_back(std::move(field));
      field.clear();
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      row.push_back(std::move(field));
      field.clear();
      rows.push_back(std::move(row));
      row.clear();
      any = false;
    } else {
      field += c;
    }
  }
  if (any || !field.empty() || !row.empty()) {
    row.push_back(std::move(field));
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace torchprobe::io

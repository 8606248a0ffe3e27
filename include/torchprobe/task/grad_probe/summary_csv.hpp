#pragma once
// grad_summary_{step}.csv as msprobe writes it (msprobe-grad-probe-run-ut.md §A.4): UTF-8 with BOM,
// CRLF, Python csv quoting, one header per level, values as Python's str(float).
#include <cstdio>
#include <string>
#include <vector>

#include "torchprobe/config/types.hpp"
#include "torchprobe/io/python_csv.hpp"
#include "torchprobe/task/grad_probe/grad_stats.hpp"

namespace torchprobe::grad_probe {

// The interval columns: "(-inf, b0]", "(b0, b1]", ..., "(bn, inf)". With no bounds msprobe writes no
// interval label but one interval value (its header is one column short); TorchProbe names that
// single interval "(-inf, inf)" so that every row has a header.
inline std::vector<std::string> interval_labels(const std::vector<GradBound>& bounds) {
  if (bounds.empty()) return {"(-inf, inf)"};
  std::vector<std::string> out{"(-inf, " + bounds.front().text + "]"};
  for (std::size_t i = 1; i < bounds.size(); ++i) out.push_back("(" + bounds[i - 1].text + ", " + bounds[i].text + "]");
  out.push_back("(" + bounds.back().text + ", inf)");
  return out;
}

inline std::vector<std::string> summary_header(GradLevel level, const std::vector<GradBound>& bounds) {
  std::vector<std::string> h{"param_name"};
  if (level == GradLevel::L0) h.push_back("MD5");
  if (level == GradLevel::L2) {
    for (std::string& l : interval_labels(bounds)) h.push_back(std::move(l));
    h.push_back("=0");
  }
  for (const char* c : {"max", "min", "norm", "shape"}) h.push_back(c);
  return h;
}

// Python's str(list(grad.shape)): "[4, 8]", "[4]", "[]".
inline std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// count / numel as Python's true division gives it (0 for an empty gradient).
inline std::string fraction_text(std::int64_t count, std::int64_t numel) {
  return io::python_float_str(numel == 0 ? 0.0 : static_cast<double>(count) / static_cast<double>(numel));
}

inline std::vector<std::string> summary_row(GradLevel level, const GradSummary& s) {
  std::vector<std::string> r{s.name};
  if (level == GradLevel::L0) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(s.crc));
    r.push_back(hex);
  }
  if (level == GradLevel::L2) {
    for (std::int64_t b : s.buckets) r.push_back(fraction_text(b, s.numel));
    r.push_back(fraction_text(s.zeros, s.numel));
  }
  r.push_back(io::python_float_str(s.max));
  r.push_back(io::python_float_str(s.min));
  r.push_back(io::python_float_str(s.norm));
  r.push_back(shape_text(s.shape));
  return r;
}

inline std::string summary_csv(GradLevel level, const std::vector<GradBound>& bounds,
                               const std::vector<GradSummary>& rows) {
  std::string out(io::kUtf8Bom);
  io::append_csv_row(out, summary_header(level, bounds));
  for (const GradSummary& s : rows) io::append_csv_row(out, summary_row(level, s));
  return out;
}

}  // namespace torchprobe::grad_probe

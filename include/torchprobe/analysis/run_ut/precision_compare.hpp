#pragma once
// `torchprobe api_precision_compare`: msprobe's api_precision_compare of two run_ut details CSVs,
// the target ("NPU") against the bench device ("GPU") (../shared/spec/msprobe-grad-probe-run-ut.md
// B.9): each target row judged by its API's standard (precision_rules.hpp), the result and details
// CSVs written byte for byte as msprobe 8.3.3 writes them. Free of libtorch.
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "torchprobe/analysis/run_ut/precision_rules.hpp"

namespace torchprobe::run_ut::precision {

struct Outcome {
  std::string result_csv, details_csv;
  std::string result_text, details_text;  // what was written, BOM and headers included
  std::vector<std::string> warnings;      // target rows without a bench row
  std::string error;                      // why msprobe would have stopped part way ("" when it did not)
};

namespace details {

// api name, "Type.api.n" and the direction of "Type.api.n.forward.output.k" (7 parts: "Type.a.b.n...").
inline bool split_row_name(const std::string& full, std::string& api, std::string& api_full, std::string& direction) {
  std::vector<std::string> p;
  std::size_t start = 0;
  for (std::size_t dot; (dot = full.find('.', start)) != std::string::npos; start = dot + 1)
    p.push_back(full.substr(start, dot - start));
  p.push_back(full.substr(start));
  if (p.size() == 6) {
    api = p[1];
    api_full = p[0] + "." + p[1] + "." + p[2];
    direction = p[3];
    return true;
  }
  if (p.size() == 7) {
    api = p[1] + "." + p[2];
    api_full = p[0] + "." + api + "." + p[3];
    direction = p[4];
    return true;
  }
  return false;
}

// msprobe's check_op_str_pattern_valid: a name may not start (or follow a ';') with + - = % @,
// ASCII or full width (formula injection in a spreadsheet).
inline bool injection_pattern(const std::string& s) {
  static const std::vector<std::string> bad = {"+", "-", "=", "%", "@", "＋", "－", "＝", "％", "＠"};
  const auto starts = [&](std::size_t at) {
    for (const auto& b : bad)
      if (s.compare(at, b.size(), b) == 0) return true;
    return false;
  };
  if (starts(0)) return true;
  for (std::size_t k = s.find(';'); k != std::string::npos; k = s.find(';', k + 1))
    if (starts(k + 1)) return true;
  return false;
}

inline std::string aggregate(const std::vector<std::string>& statuses) {
  if (statuses.empty()) return kSpace;
  if (std::all_of(statuses.begin(), statuses.end(), [](const std::string& s) { return s == kSkip; })) return kSkip;
  for (const std::string* v : {&kError, &kWarning})
    if (std::find(statuses.begin(), statuses.end(), *v) != statuses.end()) return *v;
  return kPass;
}

inline std::string row_text(const std::vector<std::string>& fields) {
  std::string s;
  io::append_csv_row(s, fields);
  return s;
}

inline std::string detail_text(const OutRow& o) {
  std::vector<std::string> f;
  for (const Value& v : o) f.push_back(v.detail_text());
  return row_text(f);
}

}  // namespace details

// analyse_csv: every target row judged against the bench row of the same name, the result rows
// aggregated over consecutive rows of one API.
inline Outcome compare_tables(const Table& npu, const Table& gpu) {
  Outcome out;
  std::string& res = out.result_text;
  std::string& det = out.details_text;
  res = std::string(io::kUtf8Bom) + kResultHeader + "\r\n";
  det = std::string(io::kUtf8Bom) + kDetailsHeader + "\r\n";
  std::vector<std::string> fwd, bwd;
  std::string last_api, last_dtype, last_skip_message;
  bool have_last = false, last_unsupported = false;
  const auto flush = [&] {
    if (last_unsupported) {
      res += details::row_text({last_api, kSkip, kSkip, "This data type does not support benchmark compare."});
    } else {
      const std::string f = details::aggregate(fwd), b = details::aggregate(bwd);
      std::string msg;
      const auto first_dot = last_api.find('.'), last_dot = last_api.rfind('.');
      if (f == kError && first_dot != last_dot && last_api.substr(first_dot + 1, last_dot - first_dot - 1) == "topk")
        msg +=
            "在npu上，topk的入参sorted=False时不生效，会返回有序tensor，而cpu上会返回无序tensor。 "
            "如果topk精度不达标，请检查是否是该原因导致的。";
      if (f == kSkip) msg += last_skip_message;
      res += details::row_text({last_api, f, b, msg});
      last_skip_message.clear();
    }
    fwd.clear();
    bwd.clear();
  };
  std::map<std::string, std::vector<std::size_t>> gpu_rows;
  for (std::size_t j = 0; j < gpu.rows.size(); ++j) gpu_rows[gpu.at(j, "API Name").py_str()].push_back(j);
  for (std::size_t i = 0; i < npu.rows.size(); ++i) {
    const Value& name_value = npu.at(i, "API Name");
    const std::string full = name_value.py_str();
    if (name_value.is_text() && details::injection_pattern(full)) {
      out.error = "api name contains special characters, please check! (" + full + ")";
      return out;
    }
    std::string api, api_full, direction;
    OutRow o;
    if (!details::split_row_name(full, api, api_full, direction)) {
      const std::string why = "The API name " + full + " is invalid.";
      o[name] = Value::str(full);
      o[result] = Value::str(kSkip);
      o[message] = Value::str(why);
      det += details::detail_text(o);
      res += details::row_text({full, kSkip, kSkip, why});
      continue;
    }
    const auto g = gpu_rows.find(full);
    if (g == gpu_rows.end()) {
      out.warnings.push_back("This API : " + full + " does not exist in the GPU data.");
      continue;
    }
    if (g->second.size() > 1) {
      out.error = "This API : " + full + " has multiple records in the GPU data.";
      return out;
    }
    const Value& dtype = npu.at(i, "DEVICE Dtype");
    std::string status = kSpace;
    o[name] = Value::str(full);
    try {
      status = details::judge({npu, i, gpu, g->second[0], dtype.py_str()}, api, o);
    } catch (const PrecisionCompareError& e) {
      OutRow skip;
      skip[name] = Value::str(full);
      skip[result] = Value::str(kSkip);
      skip[message] = Value::str(e.what());
      det += details::detail_text(skip);
      res += details::row_text({full, kSkip, kSkip, e.what()});
      continue;
    }
    det += details::detail_text(o);
    if (have_last && api_full != last_api) flush();
    have_last = true;
    last_api = api_full;
    last_unsupported = details::unsupported_dtype(dtype);
    if (last_unsupported) continue;
    if (direction == "forward") {
      fwd.push_back(status);
      last_skip_message = status == kSkip ? npu.at(i, "Message").py_str() : "";
    } else if (direction == "backward") {
      bwd.push_back(status);
    }
  }
  if (have_last) flush();
  return out;
}

inline void check_columns(const Table& t, const std::string& side) {
  std::string missing;
  for (const auto& c : required_columns())
    if (!t.has(c)) missing += (missing.empty() ? "" : ",") + c;
  if (!missing.empty()) throw PrecisionCompareError("The following columns " + missing + " are missing in " + side);
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  if (!f) throw PrecisionCompareError("cannot write " + path);
  f.close();
  ::chmod(path.c_str(), 0640);
}

// The whole command: both CSVs read and checked, the two output files written.
inline Outcome api_precision_compare(const std::string& npu_csv, const std::string& gpu_csv,
                                     const std::string& result_csv, const std::string& details_csv) {
  const Table npu = read_table(npu_csv);
  check_columns(npu, "npu_csv");
  const Table gpu = read_table(gpu_csv);
  check_columns(gpu, "gpu_csv");
  Outcome out = compare_tables(npu, gpu);
  out.result_csv = result_csv;
  out.details_csv = details_csv;
  write_file(result_csv, out.result_text);
  write_file(details_csv, out.details_text);
  return out;
}

}  // namespace torchprobe::run_ut::precision

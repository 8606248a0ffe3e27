#pragma once
// The two CSVs of run_ut, byte for byte as msprobe writes them (spec B.7): UTF-8 BOM, CRLF rows,
// accuracy_checking_result_{ts}.csv with 3 fields per row (4 when forward is SKIP) and
// accuracy_checking_details_{ts}.csv with one row per output; plus the summary printed at the end.
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "torchprobe/io/python_csv.hpp"
#include "torchprobe/analysis/run_ut/replay.hpp"
#include "torchprobe/io/timestamp.hpp"

namespace torchprobe::run_ut {

inline const char* kResultHeader = "API name,Forward Test Success,Backward Test Success,Message";
inline const char* kDetailsHeader =
    "API Name,Bench Dtype,DEVICE Dtype,Shape,余弦相似度,最大绝对误差,双百指标,双千指标,双万指标,二进制一致错误率,"
    "误差均衡性,均方根误差,小值域错误占比,相对误差最大值,相对误差平均值,inf/nan错误率,相对误差错误率,绝对误差错误率,"
    "ULP误差最大值,ULP误差平均值,ULP误差大于阈值占比,Status,Message";

inline std::string csv_row(const std::vector<std::string>& fields) {
  std::string s;
  for (std::size_t i = 0; i < fields.size(); ++i) s += (i ? "," : "") + io::csv_field(fields[i]);
  return s + "\r\n";
}

inline std::string result_row(const ApiResult& r) {
  std::vector<std::string> f = {r.name, status_text(r.forward), r.backward};
  if (r.forward == Status::skip) f.push_back(r.skip_message);
  return csv_row(f);
}

inline std::string detail_row(const std::string& name, const Detail& d) {
  std::vector<std::string> f = {name, d.bench_dtype, d.device_dtype, d.shape};
  for (const Cell* c : {&d.cosine, &d.max_abs, &d.hundredth, &d.thousandth, &d.ten_thousandth, &d.error_rate, &d.eb,
                        &d.rmse, &d.small_err, &d.max_rel, &d.mean_rel, &d.inf_nan, &d.rel_ratio, &d.abs_ratio,
                        &d.ulp_max, &d.ulp_mean, &d.ulp_prop})
    f.push_back(c->render());
  f.push_back(status_text(d.status));
  f.push_back(d.message);
  return csv_row(f);
}

inline std::string detail_rows(const ApiResult& r) {
  std::string s;
  for (std::size_t i = 0; i < r.forward_rows.size(); ++i)
    s += detail_row(r.name + ".forward.output." + std::to_string(i), r.forward_rows[i]);
  for (std::size_t i = 0; i < r.backward_rows.size(); ++i)
    s += detail_row(r.name + ".backward.output." + std::to_string(i), r.backward_rows[i]);
  return s;
}

// TorchProbe's verdict of one direction (verdict.hpp): the worst of its outputs' verdicts; SKIP with
// the reason when none of its outputs was compared (an API that did not run never passes).
inline Verdict direction_verdict(const std::vector<Detail>& rows, const std::string& why_none) {
  const Detail* worst = nullptr;
  const auto rank = [](const std::string& s) { return s == "error" ? 3 : s == "Warning" ? 2 : s == "pass" ? 1 : 0; };
  for (const auto& r : rows)
    if (r.verdict.status != "SKIP" && (!worst || rank(r.verdict.status) > rank(worst->verdict.status))) worst = &r;
  if (worst) return worst->verdict;
  if (!rows.empty()) return {"SKIP", rows.front().verdict.reason};
  return {"SKIP", why_none.empty() ? "nothing was compared" : why_none};
}

inline Verdict forward_verdict(const ApiResult& r) { return direction_verdict(r.forward_rows, r.skip_message); }
inline Verdict backward_verdict(const ApiResult& r) {
  if (r.backward == " ") return {" ", ""};
  return direction_verdict(r.backward_rows, r.skip_message);
}

inline const char* kVerdictsHeader =
    "API name,Forward Test Success,Backward Test Success,TorchProbe Forward,TorchProbe Backward,TorchProbe Reason";

// accuracy_checking_verdicts_{ts}.csv: msprobe's statuses next to TorchProbe's, with the reason of
// the worse direction (forward when they tie).
inline std::string verdict_row(const ApiResult& r) {
  const Verdict f = forward_verdict(r), b = backward_verdict(r);
  const auto rank = [](const std::string& s) { return s == "error" ? 3 : s == "Warning" ? 2 : s == "SKIP" ? 1 : 0; };
  const std::string why = rank(b.status) > rank(f.status) ? "backward: " + b.reason : "forward: " + f.reason;
  return csv_row({r.name, status_text(r.forward), r.backward, f.status, b.status, why});
}

// A result for an API that did not run: SKIP both ways, with the reason (never "pass").
inline ApiResult skipped(const std::string& name, const std::string& why) {
  ApiResult r;
  r.name = name;
  r.forward = Status::skip;
  r.backward = "SKIP";
  r.skip_message = why;
  r.forward_rows = {skip_detail(why)};
  return r;
}

// Appends to a CSV, writing the BOM and header first when the file is new (mode 0640, as msprobe).
class CsvFile {
 public:
  CsvFile(std::string path, const std::string& header) : path_(std::move(path)) {
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0) {
      std::ofstream out(path_, std::ios::binary);
      if (!out) throw RunUtError("cannot write " + path_);
      out << "\xEF\xBB\xBF" << header << "\r\n";
      out.close();
      ::chmod(path_.c_str(), 0640);
    }
  }
  void append(const std::string& text) {
    std::ofstream out(path_, std::ios::binary | std::ios::app);
    out << text;
    if (!out) throw RunUtError("cannot write " + path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct Summary {
  std::map<std::string, int> forward, backward;
  std::map<std::string, int> tp_forward, tp_backward;  // TorchProbe's verdicts
  std::vector<std::string> disagreements;              // APIs where TorchProbe and msprobe differ
  int apis = 0;
  double seconds = 0;
  std::vector<const ApiResult*> worst;  // error first, then Warning, then SKIP
};

inline Summary summarize(const std::vector<ApiResult>& results, double seconds) {
  Summary s;
  s.apis = static_cast<int>(results.size());
  s.seconds = seconds;
  for (const auto& r : results) {
    ++s.forward[status_text(r.forward)];
    ++s.backward[r.backward == " " ? "not run" : r.backward];
    const Verdict f = forward_verdict(r), b = backward_verdict(r);
    ++s.tp_forward[f.status];
    ++s.tp_backward[b.status == " " ? "not run" : b.status];
    if (f.status != status_text(r.forward) || b.status != r.backward)
      s.disagreements.push_back(r.name + ": TorchProbe forward " + f.status + ", backward " +
                                (b.status == " " ? "-" : b.status) + " (" +
                                (f.status != status_text(r.forward) ? f.reason : b.reason) + ")");
    if (r.forward != Status::pass || (r.backward != "pass" && r.backward != " ")) s.worst.push_back(&r);
  }
  const auto rank = [](const ApiResult* r) {
    const auto level = [](const std::string& t) { return t == "error" ? 0 : t == "Warning" ? 1 : t == "SKIP" ? 2 : 3; };
    return std::min(level(status_text(r->forward)), level(r->backward));
  };
  std::stable_sort(s.worst.begin(), s.worst.end(),
                   [&](const ApiResult* a, const ApiResult* b) { return rank(a) < rank(b); });
  return s;
}

inline void print_summary(std::ostream& os, const Summary& s) {
  os << "run_ut: " << s.apis << " APIs in " << s.seconds << " s";
  if (s.seconds > 0) os << " (" << static_cast<int>(s.apis / s.seconds) << " APIs/s)";
  os << "\n  forward: ";
  for (const auto& [k, v] : s.forward) os << k << " " << v << "  ";
  os << "\n  backward: ";
  for (const auto& [k, v] : s.backward) os << k << " " << v << "  ";
  os << "\n  TorchProbe's verdict, forward: ";
  for (const auto& [k, v] : s.tp_forward) os << k << " " << v << "  ";
  os << "\n  TorchProbe's verdict, backward: ";
  for (const auto& [k, v] : s.tp_backward) os << k << " " << v << "  ";
  os << "\n";
  for (const ApiResult* r : s.worst) {
    os << "  " << r->name << ": forward " << status_text(r->forward) << ", backward "
       << (r->backward == " " ? "-" : r->backward);
    if (!r->skip_message.empty()) os << " (" << r->skip_message << ")";
    os << "\n";
  }
  for (const auto& d : s.disagreements) os << "  " << d << "\n";
}

}  // namespace torchprobe::run_ut

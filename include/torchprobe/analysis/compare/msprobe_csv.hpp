#pragma once
// The text of msprobe's compare_result_{timestamp}.csv from a Table (msprobe_table.hpp): its header,
// each row's cells as msprobe writes them, and the whole CSV, as one string or in pieces for a file.
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "torchprobe/analysis/compare/msprobe_table.hpp"
#include "torchprobe/io/json_text.hpp"
#include "torchprobe/io/python_csv.hpp"

namespace torchprobe::compare {

inline std::vector<std::string> table_header(const Table& t) {
  std::vector<std::string> h = {"NPU Name",         "Bench Name",         "NPU Dtype",         "Bench Dtype",
                                "NPU Tensor Shape", "Bench Tensor Shape", "NPU Requires_grad", "Bench Requires_grad"};
  if (t.mode == CsvMode::summary) {
    for (const char* c : {"Max diff", "Min diff", "Mean diff", "L2norm diff", "MaxRelativeErr", "MinRelativeErr",
                          "MeanRelativeErr", "NormRelativeErr", "NPU max", "NPU min", "NPU mean", "NPU l2norm",
                          "Bench max", "Bench min", "Bench mean", "Bench l2norm"})
      h.emplace_back(c);
  } else if (t.mode == CsvMode::tensor) {
    for (const char* c :
         {"Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio", "Five Thousandths Err Ratio",
          "NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min", "Bench mean", "Bench l2norm"})
      h.emplace_back(c);
  } else {
    h.emplace_back("NPU MD5");
    h.emplace_back("BENCH MD5");
  }
  for (const char* c : {"Requires_grad Consistent", "Result", "Err_message"}) h.emplace_back(c);
  if (t.stack_column) h.emplace_back("NPU_Stack_Info");
  if (t.mode == CsvMode::tensor) h.emplace_back("Data_name");
  if (t.extra != nullptr) h.insert(h.end(), t.extra->header.begin(), t.extra->header.end());
  return h;
}

// The row's cells as msprobe's CSV holds them (float infinities become " inf", as msprobe writes).
// The row's cells as msprobe's CSV holds them, each handed to put(std::string_view) in column order
// (the CSV appends them where they are: a vector of strings per row cost as much as the rest).
template <class Put>
void each_table_cell(const Table& t, const TableRow& r, Put&& put) {
  char buf[40];
  const auto cell = [&](const Json& v) {
    if (v.is_number_float()) {
      const double x = v.get<double>();
      if (std::isinf(x)) return put(std::string_view(x > 0 ? " inf" : " -inf"));
      if (!std::isnan(x))  // py_str's text, without a string
        return put(std::string_view(buf, static_cast<std::size_t>(io::write_python_float(buf, x) - buf)));
    }
    put(std::string_view(py_str(v)));
  };
  const Row& n = *r.npu;
  const Row* b = r.bench;
  const std::string_view na = "N/A";
  for (const std::string_view c : {n.name, b ? b->name : na, n.dtype.view(), b ? b->dtype.view() : na, n.shape.view(),
                                   b ? b->shape.view() : na, n.requires_grad.view(), b ? b->requires_grad.view() : na})
    put(c);
  if (t.mode == CsvMode::summary || t.mode == CsvMode::tensor) {
    if (t.mode == CsvMode::summary)
      for (const auto& d : r.diff) put(std::string_view(d));
    else
      for (const auto& m : r.metrics) put(std::string_view(m));
    for (int s = 0; s < 8; ++s) {
      if (r.known_stats & (1u << s))
        put(r.stat_text[s].view());
      else if (s < 4)
        cell(n.stat(s));
      else
        b ? cell(b->stat(s - 4)) : put(std::string_view(na));
    }
  } else {
    put(std::string_view(n.md5));
    put(b ? b->md5.view() : na);
  }
  put(std::string_view(n.requires_grad == (b ? b->requires_grad.view() : na) ? "True" : "False"));
  static const char* kLevel[] = {"pass", "warning", "error"};
  put(std::string_view(kLevel[r.level]));
  std::string msg = "[";
  for (std::size_t i = 0; i < r.messages.size(); ++i) msg += (i ? ", \"" : "\"") + r.messages[i] + "\"";
  msg += "]";
  put(std::string_view(msg));
  if (t.stack_column) put(n.stack().value_or(std::string_view(na)));
  if (t.mode == CsvMode::tensor)  // str() of [npu data_name, bench data_name]
    put(std::string_view("[" + py_str_repr(n.data_name()) + ", " + py_str_repr(b ? b->data_name() : na) + "]"));
  if (t.extra != nullptr) {
    std::vector<std::string> more;
    t.extra->cells(n, more);
    more.resize(t.extra->header.size());
    for (const std::string& c : more) put(std::string_view(c));
  }
}

// The row's cells as msprobe's CSV holds them (float infinities become " inf", as msprobe writes).
inline std::vector<std::string> table_cells(const Table& t, const TableRow& r) {
  std::vector<std::string> c;
  each_table_cell(t, r, [&](std::string_view v) { c.emplace_back(v); });
  return c;
}

namespace details {
inline void append_csv_header(const Table& shape, std::string& out) {
  const std::vector<std::string> names = table_header(shape);
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i) out += ',';
    io::append_csv_field(out, names[i]);
  }
  out += '\n';
}
inline void append_csv_row(const Table& shape, const TableRow& r, std::string& out) {
  bool first = true;
  each_table_cell(shape, r, [&](std::string_view v) {
    if (!first) out += ',';
    first = false;
    io::append_csv_field(out, v);
  });
  out += '\n';
}

// The CSV's text, handed to `sink` in pieces of about `chunk` bytes (a 1M-entry compare writes a
// gigabyte: held whole, the text alone would double the memory the compare needs).
template <class Sink>
class CsvPieces {
 public:
  CsvPieces(const Table& shape, Sink& sink, std::size_t chunk) : shape_(shape), sink_(sink), chunk_(chunk) {
    out_.reserve(chunk + 4096);
    append_csv_header(shape, out_);
  }
  void row(const TableRow& r) {
    append_csv_row(shape_, r, out_);
    if (out_.size() < chunk_) return;
    sink_(std::string_view(out_));
    out_.clear();
  }
  void finish() {
    if (!out_.empty()) sink_(std::string_view(out_));
    out_.clear();
  }

 private:
  const Table& shape_;  // its mode and stack column
  Sink& sink_;
  std::size_t chunk_;
  std::string out_;
};
}  // namespace details

// The CSV of a table, handed to `sink` in pieces of about `chunk` bytes.
template <class Sink>
void table_csv_chunks(const Table& t, Sink&& sink, std::size_t chunk = std::size_t{1} << 22) {
  details::CsvPieces<Sink> csv(t, sink, chunk);
  for (const TableRow& r : t.rows) csv.row(r);
  csv.finish();
}

// msprobe's CSV of `npu` against `bench` (msprobe_table's rows) written while the table is made, one
// entry's rows at a time: the same text as table_csv_chunks(msprobe_table(...)), without the table.
template <class Sink>
void msprobe_csv_chunks(const std::vector<Row>& npu, const std::vector<Row>& bench, CsvMode mode, bool stack_column,
                        const TensorCellsFn& tensor_cells, Sink&& sink, std::size_t chunk = std::size_t{1} << 22,
                        const ExtraColumns* extra = nullptr) {
  Table shape;
  shape.mode = mode;
  shape.stack_column = stack_column;
  shape.extra = extra;
  details::CsvPieces<Sink> csv(shape, sink, chunk);
  each_table_group(npu, bench, mode, tensor_cells, [&](std::vector<TableRow>& group) {
    for (const TableRow& r : group) csv.row(r);
  });
  csv.finish();
}

// msprobe_csv_chunks' text made by whichever threads call work(), a stretch of some thousands of
// entries each at a time, and handed to `sink` in table order (one call at a time). A million entries
// a side are a gigabyte of CSV, which one thread took 5.5 s to make, longer than all the rest that
// runs beside it; so the thread that judges, once done, takes stretches too. Each thread holds one
// stretch's text at most. Tensor mode is streamed by the first caller alone (its cells read .pt
// files and report progress in order). The first caller makes the plan; a second waits for it.
template <class Sink>
class CsvStretches {
 public:
  CsvStretches(const std::vector<Row>& npu, const std::vector<Row>& bench, CsvMode mode, bool stack_column,
               const TensorCellsFn& tensor_cells, Sink& sink)
      : npu_(npu), bench_(bench), tensor_cells_(tensor_cells), sink_(sink) {
    shape_.mode = mode;
    shape_.stack_column = stack_column;
  }

  // Columns after msprobe's (blame_plan.hpp), set before the first work(): tensor mode only, whose
  // CSV is made after the judging.
  void set_extra(const ExtraColumns* extra) { shape_.extra = extra; }

  // Makes stretches until none is left, and returns once those it made are handed to the sink.
  // Rethrows what the making or the sink threw, on any thread.
  void work() {
    if (shape_.mode == CsvMode::tensor) {  // streamed by the first caller, in pieces
      bool taken = false;
      if (streamed_.compare_exchange_strong(taken, true))
        msprobe_csv_chunks(npu_, bench_, shape_.mode, shape_.stack_column, tensor_cells_, sink_, std::size_t{1} << 22,
                           shape_.extra);
      return;
    }
    std::call_once(planned_, [&] { plan(); });
    std::string text;  // one stretch's, its room reused
    try {
      for (std::size_t k; !failed_ && (k = next_++) < stretches();) {
        text.clear();
        if (k == 0) details::append_csv_header(shape_, text);
        each_table_group_in(plan_, starts_[k], starts_[k + 1], shape_.mode, tensor_cells_,
                            [&](std::vector<TableRow>& group) {
                              for (const TableRow& r : group) details::append_csv_row(shape_, r, text);
                            });
        std::unique_lock<std::mutex> lock(mutex_);
        turn_changed_.wait(lock, [&] { return turn_ == k || failed_; });
        if (failed_) break;
        sink_(std::string_view(text));
        ++turn_;
        turn_changed_.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_) failure_ = std::current_exception();
      failed_ = true;
      turn_changed_.notify_all();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_) std::rethrow_exception(failure_);
  }

 private:
  static constexpr std::size_t kStretch = std::size_t{1} << 15;  // rows: some 13 MB of text

  std::size_t stretches() const { return starts_.size() - 1; }
  void plan() {
    plan_ = table_plan(npu_, bench_, shape_.mode);
    const std::size_t n = plan_.pairs.size();
    for (std::size_t at = 0; at < n; at = plan_.entry_start(at + kStretch)) starts_.push_back(at);
    if (starts_.empty()) starts_.push_back(0);  // no rows: the header alone, as stretch 0
    starts_.push_back(n);
  }

  const std::vector<Row>& npu_;
  const std::vector<Row>& bench_;
  const TensorCellsFn& tensor_cells_;
  Sink& sink_;
  Table shape_;
  std::once_flag planned_;
  TablePlan plan_;
  std::vector<std::size_t> starts_;  // stretches begin where an entry's rows begin
  std::atomic<std::size_t> next_{0};
  std::atomic<bool> failed_{false};
  std::atomic<bool> streamed_{false};
  std::mutex mutex_;
  std::condition_variable turn_changed_;
  std::size_t turn_ = 0;  // the stretch whose text goes to the sink next
  std::exception_ptr failure_;
};

inline std::string table_csv(const Table& t) {
  std::string out;
  table_csv_chunks(t, [&](std::string_view piece) { out.append(piece); });
  return out;
}

}  // namespace torchprobe::compare

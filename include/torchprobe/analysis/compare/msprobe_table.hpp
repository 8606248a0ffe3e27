#pragma once
// msprobe's compare_result_{timestamp}.csv: exact-key matching, the statistics differences
// (CalcStatsDiff) and the Result / Err_message rules (indicator_analysis), for the summary
// (statistics) and md5 modes, and the tensor ("all") mode whose six metric cells come from the .pt
// files through a callback (tensor_metrics.hpp, which needs libtorch). Columns, formulas and
// strings follow msprobe 26.0 (../shared/spec/compare-spec.md section 1).
#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "torchprobe/analysis/compare/name_index.hpp"
#include "torchprobe/analysis/compare/python_text.hpp"
#include "torchprobe/analysis/compare/rows.hpp"
#include "torchprobe/analysis/compare/stat_diff.hpp"

namespace torchprobe::compare {

enum class CsvMode { summary, md5, tensor };

// Tensor mode: the six metric cells (Cosine, EucDist, MaxAbsErr, MaxRelativeErr, One Thousandth and
// Five Thousandths Err Ratio) of a row whose two sides both have a .pt file (Row::data_name).
using TensorCellsFn = std::function<std::array<std::string, 6>(const Row& npu, const Row& bench)>;

struct TableRow {
  const Row* npu = nullptr;
  const Row* bench = nullptr;  // null: unmatched, or its dtype was not comparable (msprobe writes N/A)
  CellText diff[8];            // Max/Min/Mean/L2norm diff, then the four RelativeErr
  // Summary mode: the statistics' texts already made for the differences (NPU's four, then the
  // bench's), for the CSV; bit k of `known_stats` says stat_text[k] holds one (a finite float's).
  CellText stat_text[8];
  unsigned char known_stats = 0;
  // Tensor mode: Cosine ... Five Thousandths Err Ratio (six cells); empty in the other modes, where
  // six empty strings per row were 190 MB of a million-entry compare.
  std::vector<std::string> metrics;
  int level = 0;  // 0 pass, 1 warning, 2 error
  std::vector<std::string> messages;
};

// Columns TorchProbe adds after msprobe's (blame_plan.hpp): their names, and each row's cells
// (given the NPU side's row). msprobe's readers take columns by name, so the extra ones are ignored.
struct ExtraColumns {
  std::vector<std::string> header;
  std::function<void(const Row& npu, std::vector<std::string>& cells)> cells;
};

struct Table {
  CsvMode mode = CsvMode::summary;
  bool stack_column = false;
  std::vector<TableRow> rows;
  const ExtraColumns* extra = nullptr;  // none: msprobe's columns alone
};

namespace details {

inline bool is_inf_or_nan(const Json& v) {
  if (v.is_number_float()) return !std::isfinite(v.get<double>());
  if (!v.is_string()) return false;
  std::string s = v.get<std::string>();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(s.begin());
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  s = lower(s);
  return s == "inf" || s == "-inf" || s == "nan";
}

// Python's == between two cells (numbers compare across int/float/bool).
inline bool py_equal(const Json& a, const Json& b) {
  if ((a.is_number() || a.is_boolean()) && (b.is_number() || b.is_boolean())) {
    const auto num = [](const Json& v) { return v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>(); };
    return num(a) == num(b);
  }
  return a.type() == b.type() && a == b;
}

// ApiData.get_min_or_max_value over the "NormRelativeErr" column: percentages only.
inline double max_norm_rel(const std::vector<TableRow*>& rows) {
  double best = 0.0;
  for (const TableRow* r : rows) {
    const std::string_view v = r->diff[7];
    if (v.empty() || v.back() != '%') continue;
    best = std::max(best, py_percent_to_float(v));
  }
  return best;
}

// ApiData.get_min_or_max_value (minimum, default 1.0) over one of the metric columns: numbers only.
inline double min_metric(const std::vector<TableRow*>& rows, int column) {
  double best = 1.0;
  for (const TableRow* r : rows) {
    const std::string& v = r->metrics[column];
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || std::isnan(x)) continue;  // "unsupported", "N/A", "Nan", ...
    best = std::min(best, x);
  }
  return best;
}

inline void raise(TableRow& r, int level, const std::string& msg) {
  r.level = std::max(r.level, level);
  r.messages.push_back(msg);
}

// The indicator_analysis checkers for one entry's rows (STATISTICS_CHECKERS or MD5_CHECKERS).
inline void judge_entry(std::vector<TableRow*>& rows, CsvMode mode) {
  std::vector<TableRow*> in, out;
  for (TableRow* r : rows) (r->npu->is_output() ? out : in).push_back(r);
  enum { kNone, kInputs, kAll } ignore = kNone;
  if (!in.empty()) {
    // The name's second dot-separated part (the API), found in place: a vector of its parts per entry
    // cost a second of a million-entry table.
    const std::string_view name = in.front()->npu->name;
    const std::size_t dot = name.find('.');
    if (dot != std::string_view::npos) {
      const std::string_view api = name.substr(dot + 1, name.find('.', dot + 1) - (dot + 1));
      static const char* kAllIgnore[] = {
          "empty",     "empty_like",   "numpy", "to", "__setitem__", "empty_with_format", "new_empty_strided",
          "new_empty", "empty_strided"};
      static const char* kInIgnore[] = {"_reduce_scatter_base", "_all_gather_base", "all_to_all_single",
                                        "batch_isend_irecv"};
      for (const char* n : kAllIgnore) ignore = api == n ? kAll : ignore;
      for (const char* n : kInIgnore) ignore = api == n ? kInputs : ignore;
    }
  }
  // get_data_list_by_ignore_info: nothing, the outputs, or inputs then outputs
  std::vector<TableRow*> checked;
  if (ignore != kAll) checked = ignore == kInputs ? out : in;
  if (ignore == kNone) checked.insert(checked.end(), out.begin(), out.end());
  if (mode == CsvMode::md5) {
    for (TableRow* r : checked) {
      const std::string_view nb = r->bench ? r->bench->md5 : "N/A";
      if (r->npu->md5 == nb) continue;
      if (nb == "N/A" || nb == "Nan" || nb.empty() || r->npu->md5 == "N/A" || r->npu->md5.empty())
        raise(*r, 1, "warning: The parameter of NPU does not match the bench.");
      else
        raise(*r, 2, "error: The CRC-32 value of NPU differs from that of the bench.");
    }
    return;
  }
  for (TableRow* r : checked) {  // InfNanErrChecker
    const Json bmax = r->bench ? r->bench->stat(0) : na_cell();
    const Json bmin = r->bench ? r->bench->stat(1) : na_cell();
    if (is_inf_or_nan(bmax) || is_inf_or_nan(bmin)) continue;
    if (is_inf_or_nan(r->npu->stat(0)) || is_inf_or_nan(r->npu->stat(1)))
      raise(*r, 2, "error: There is nan/inf/-inf in the maximum or minimum value of NPU.");
  }
  if (mode == CsvMode::tensor && ignore == kNone && !out.empty()) {  // OneThousandthErrChecker
    if (min_metric(in, 4) > 0.9 && min_metric(out, 4) < 0.1)
      raise(*out.front(), 2, "error: The input/parameters of One Thousandth Err Ratio > 0.9 while the output < 0.6.");
  }
  if (mode == CsvMode::summary && ignore == kNone && std::fabs(max_norm_rel(in)) < 0.1) {  // RelativeErrChecker
    for (TableRow* r : out) {
      if (std::fabs(py_percent_to_float(r->diff[7])) > 0.5)
        raise(*r, 2, "error: The NormRelativeErr of output is greater than 0.5.");
    }
  }
  for (TableRow* r : checked) {  // RequiresGradErrChecker
    if (r->bench && r->npu->requires_grad != r->bench->requires_grad)
      raise(*r, 2, "error: The Required_Grad of NPU and Bench are inconsistent");
  }
  if (ignore == kNone) {  // ParametersErrChecker
    for (TableRow* r : in) {
      if (!r->bench || r->npu->dtype.find("class") == std::string::npos ||
          r->bench->dtype.find("class") == std::string::npos || r->npu->shape != "[]")
        continue;
      if (!py_equal(r->npu->stat(0), r->bench->stat(0)))
        raise(*r, 2, "error: The scalar parameters of NPU and Bench are inconsistent.");
    }
  }
  for (TableRow* r : checked) {  // DTypeErrChecker
    if (!r->bench || r->bench->name.find("qkv") != std::string::npos ||
        r->bench->name.find("gate_up") != std::string::npos)
      continue;
    if (r->npu->dtype != r->bench->dtype) raise(*r, 2, "error: The dtype of NPU and Bench are inconsistent.");
  }
  for (TableRow* r : checked) {  // ShapeErrChecker
    if (r->bench && r->npu->shape != r->bench->shape)
      raise(*r, 2, "error: The shape of NPU and Bench are inconsistent.");
  }
  if (mode == CsvMode::tensor) {  // CosineWarnChecker, in place of RelativeWarnChecker
    const double i = min_metric(in, 0);
    if (ignore == kNone && !out.empty() && i > 0.9 && i - min_metric(out, 0) > 0.1)
      raise(*out.front(), 1, "warning: The input/parameters of Cosine > 0.9, and input/parameters - output > 0.1");
    return;
  }
  if (ignore == kNone && !out.empty()) {  // RelativeWarnChecker
    const double i = std::fabs(max_norm_rel(in)), o = std::fabs(max_norm_rel(out));
    if ((i == 0 && o > 0.1) || (i != 0 && o / i > 10))
      raise(*out.front(), 1, "warning: The norm relative error of output is 10 times that of input.");
  }
}

}  // namespace details

// What every entry's rows need, made once for the whole table: the rows' pairs (npu, bench or
// null) in table order, and which statistics columns pandas reads as integers.
struct TablePlan {
  std::vector<std::pair<const Row*, const Row*>> pairs;
  bool ints[4] = {true, true, true, true};
  // The first pair at or after `i` that begins an entry's rows (pairs.size() if none).
  std::size_t entry_start(std::size_t i) const {
    if (i == 0 || i >= pairs.size()) return std::min(i, pairs.size());
    const std::string_view before = pairs[i - 1].first->entry();
    while (i < pairs.size() && pairs[i].first->entry() == before) ++i;
    return i;
  }
};

inline TablePlan table_plan(const std::vector<Row>& npu, const std::vector<Row>& bench, CsvMode mode) {
  TablePlan plan;
  std::vector<std::pair<const Row*, const Row*>>& pairs = plan.pairs;
  bool(&ints)[4] = plan.ints;
  // Bench rows by key: the first of each key hashed, the others chained in bench order (a vector
  // per key, or a tree of a million keys, cost more than the rest of the table).
  constexpr std::size_t kEnd = static_cast<std::size_t>(-1);
  {
    const auto key_of = [&](std::size_t i) { return bench[i].key; };
    details::NameIndex first_of(bench.size());
    std::vector<std::size_t> next(bench.size(), kEnd), last_of(bench.size(), kEnd);
    for (std::size_t i = 0; i < bench.size(); ++i) {
      std::size_t first = first_of.insert(bench[i].key, i, key_of);
      if (first == details::NameIndex::npos)
        first = i;
      else
        next[last_of[first]] = i;
      last_of[first] = i;  // the chain's last, kept at its first
    }
    pairs.reserve(npu.size());
    for (const Row& n : npu) {
      const std::size_t first = first_of.find(n.key, key_of);
      if (first == details::NameIndex::npos) {
        pairs.emplace_back(&n, nullptr);
        continue;
      }
      for (std::size_t k = first; k != kEnd; k = next[k]) {
        const Row* b = &bench[k];
        const bool comparable = n.dtype == b->dtype || (float_dtype(n.dtype) && float_dtype(b->dtype));
        pairs.emplace_back(&n, comparable ? b : nullptr);
      }
    }
  }
  // pandas.to_numeric(column.astype(str)): a column's differences are integers only when every cell
  // of it, on both sides, is one; decided over the whole table before any row is made.
  if (mode == CsvMode::summary) {
    for (int s = 0; s < 4; ++s) {
      for (const auto& [n, b] : pairs) {
        char n_buf[40], b_buf[40];
        std::string n_keep, b_keep;
        const auto pn = pandas_parse(details::cell_text(n->stat(s), n_buf, n_keep));
        const auto pb = b ? pandas_parse(details::cell_text(b->stat(s), b_buf, b_keep)) : std::nullopt;
        if (!(pn && pn->is_int && pb && pb->is_int)) {
          ints[s] = false;
          break;
        }
      }
    }
  }
  return plan;
}

// The table's rows of pairs [begin, end) of `plan` (each the start of an entry's rows, or the end),
// one entry's finished rows at a time handed to `take(std::vector<TableRow>&)`. Ranges apart may be
// made on threads apart: this reads the plan and the rows only.
template <class Take>
void each_table_group_in(const TablePlan& plan, std::size_t begin, std::size_t end, CsvMode mode,
                         const TensorCellsFn& tensor_cells, Take&& take) {
  const auto& pairs = plan.pairs;
  const bool(&ints)[4] = plan.ints;
  const std::string na = "N/A";
  std::vector<TableRow> group;
  std::vector<TableRow*> members;
  for (std::size_t i = begin; i < end;) {  // one entry's rows are contiguous
    group.clear();
    const std::string_view entry = pairs[i].first->entry();
    for (; i < end && pairs[i].first->entry() == entry; ++i) {
      TableRow r;
      r.npu = pairs[i].first;
      r.bench = pairs[i].second;
      if (mode == CsvMode::summary) {
        for (int s = 0; s < 4; ++s) {
          char n_buf[40], b_buf[40];
          std::string n_keep, b_keep;
          const Json n_stat = r.npu->stat(s), b_stat = r.bench ? r.bench->stat(s) : details::na_cell();
          const std::string_view n_text = details::cell_text(n_stat, n_buf, n_keep);
          const std::string_view b_text = r.bench ? details::cell_text(b_stat, b_buf, b_keep) : std::string_view(na);
          details::stat_diff(n_stat, b_stat, n_text, b_text, ints[s], r.diff[s], r.diff[4 + s]);
          if (n_text.data() == n_buf) {
            r.stat_text[s] = n_text;
            r.known_stats |= static_cast<unsigned char>(1u << s);
          }
          if (r.bench && b_text.data() == b_buf) {
            r.stat_text[4 + s] = b_text;
            r.known_stats |= static_cast<unsigned char>(1u << (4 + s));
          }
        }
      } else if (mode == CsvMode::tensor) {
        // locate_dump_file: a side without a data file (a scalar: "-1"; unmatched: N/A) is unsupported
        if (r.bench && r.npu->data_name() != "-1" && r.bench->data_name() != "-1" && tensor_cells) {
          const auto cells = tensor_cells(*r.npu, *r.bench);
          r.metrics.assign(cells.begin(), cells.end());
        } else {
          r.metrics.assign(6, "unsupported");
        }
      }
      group.push_back(std::move(r));
    }
    members.clear();
    for (TableRow& r : group) members.push_back(&r);
    details::judge_entry(members, mode);
    take(group);
  }
}

// msprobe's table, one entry's rows at a time: pairs `npu` rows with `bench` rows by compare key
// (msprobe's outer merge, kept in NPU order, bench-only rows dropped), fills the statistics
// differences (tensor mode: the metric cells from `tensor_cells`) and the verdicts, and hands each
// entry's finished rows to `take(std::vector<TableRow>&)`. Nothing of the table is kept here: the
// CSV of a million entries is written from it without a gigabyte of rows (msprobe_csv.hpp).
template <class Take>
void each_table_group(const std::vector<Row>& npu, const std::vector<Row>& bench, CsvMode mode,
                      const TensorCellsFn& tensor_cells, Take&& take) {
  const TablePlan plan = table_plan(npu, bench, mode);
  each_table_group_in(plan, 0, plan.pairs.size(), mode, tensor_cells, take);
}

// The whole table (each_table_group's rows, kept).
inline Table msprobe_table(const std::vector<Row>& npu, const std::vector<Row>& bench, CsvMode mode, bool stack_column,
                           const TensorCellsFn& tensor_cells = {}) {
  Table t;
  t.mode = mode;
  t.stack_column = stack_column;
  t.rows.reserve(npu.size());
  each_table_group(npu, bench, mode, tensor_cells, [&](std::vector<TableRow>& group) {
    for (TableRow& r : group) t.rows.push_back(std::move(r));
  });
  return t;
}

}  // namespace torchprobe::compare

#pragma once
// `torchprobe grad-compare RUN_A RUN_B -o OUT`: msprobe's GradComparator (msprobe-grad-probe-run-ut.md
// §A.6) on two grad_probe dumps. Per rank{N} present in both: for each step{N} present in both and each
// parameter, the fraction of elements whose direction (grad > 0) agrees, and `summary`, the same over
// all elements of the step; written to OUT/rank{N}/similarities.csv exactly as msprobe writes it.
// Unlike msprobe, a parameter missing in one step is reported (an empty cell) instead of aborting, the
// parameter order does not depend on directory listing order, and when both runs hold three-state
// sign files (GradMonitor::write_signs) their agreement goes to similarities_sign.csv, and a rank
// directory written by TorchProbe is read through its run manifest, so an earlier run's files left in
// the same dump_path are not compared (io/grad_run_manifest.hpp).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "torchprobe/analysis/compare/grad_compare_html.hpp"
#include "torchprobe/io/files.hpp"
#include "torchprobe/io/npy.hpp"
#include "torchprobe/io/python_csv.hpp"
#include "torchprobe/io/grad_run_manifest.hpp"

namespace torchprobe::compare::grad {

namespace fs = std::filesystem;

// N of "prefixN" directories in `dir` (sorted).
inline std::vector<std::int64_t> numbered_dirs(const fs::path& dir, const std::string& prefix) {
  std::vector<std::int64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind(prefix, 0) != 0 || name.size() == prefix.size() ||
        name.size() > prefix.size() + 12)
      continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    out.push_back(std::stoll(digits));
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline std::vector<std::int64_t> common(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b) {
  std::vector<std::int64_t> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

inline std::optional<std::string> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The param_name column of a grad_summary CSV (msprobe's GradComparator reads its order from one).
inline std::vector<std::string> csv_param_names(const std::string& text) {
  std::vector<std::string> names;
  const std::vector<std::vector<std::string>> rows = io::parse_csv(text);
  for (std::size_t r = 1; r < rows.size(); ++r)  // row 0 is the header
    if (!rows[r].empty() && !(rows[r].size() == 1 && rows[r][0].empty())) names.push_back(rows[r][0]);
  return names;
}

// One table of similarities: rows (parameters, then "summary") by steps; nullopt where a file is missing.
struct SimilarityTable {
  std::vector<std::int64_t> steps;
  std::vector<std::string> rows;  // parameter names, "summary" last
  std::vector<std::vector<std::optional<double>>> values;
  std::vector<std::string> problems;  // missing or unreadable files
  std::vector<std::string> ignored;   // earlier runs' files left out (from the run manifests)
};

// The step numbers of `dir` that the run named by `m` wrote (all of them without a manifest).
inline std::vector<std::int64_t> run_steps(const fs::path& dir, const std::optional<grad_probe::RunManifest>& m) {
  std::vector<std::int64_t> steps = numbered_dirs(dir, "step");
  if (m)
    steps.erase(std::remove_if(steps.begin(), steps.end(), [&](std::int64_t s) { return !m->steps.count(s); }),
                steps.end());
  return steps;
}

// .npy files under dir/step{N}/ that the manifest's run did not write: an earlier run's.
inline std::int64_t stale_files(const fs::path& dir, const grad_probe::RunManifest& m) {
  std::int64_t n = 0;
  std::error_code ec;
  for (std::int64_t s : numbered_dirs(dir, "step"))
    for (const auto& e : fs::directory_iterator(dir / ("step" + std::to_string(s)), ec))
      n += e.path().extension() == ".npy" && !m.wrote(s, e.path().stem().string());
  return n;
}

// `a`, `b`: rank directories; `sub`: "" (direction files) or "sign". A rank directory with a run
// manifest (grad_probe_run.jsonl) contributes only the steps and files its last run wrote.
inline SimilarityTable compare_rank(const fs::path& a, const fs::path& b, const std::string& sub = "") {
  SimilarityTable t;
  const fs::path da = sub.empty() ? a : a / sub, db = sub.empty() ? b : b / sub;
  const std::optional<grad_probe::RunManifest> ma = grad_probe::read_run_manifest(a.string()),
                                               mb = grad_probe::read_run_manifest(b.string());
  t.steps = common(run_steps(da, ma), run_steps(db, mb));
  auto note_stale = [&](const char* run, const fs::path& dir, const std::optional<grad_probe::RunManifest>& m) {
    if (!m) return;
    if (const std::int64_t n = stale_files(dir, *m))
      t.ignored.push_back("run " + std::string(run) + ": " + std::to_string(n) + " file(s) of an earlier run in " +
                          dir.string() + " ignored (last run " + m->run_id + ")");
  };
  note_stale("A", da, ma);
  note_stale("B", db, mb);
  // Parameter order: run A's manifest, else the first CSV (by step) of run A present in run B, then any
  // other name seen; then names only run B's manifest lists.
  std::vector<std::string> params;
  auto add = [&](const std::string& n) {
    if (std::find(params.begin(), params.end(), n) == params.end()) params.push_back(n);
  };
  std::error_code ec;
  if (ma) {
    for (std::int64_t s : t.steps)
      for (const std::string& n : ma->steps.at(s)) add(n);
  } else {
    std::vector<fs::path> csvs;
    for (const auto& e : fs::directory_iterator(a, ec))
      if (e.path().extension() == ".csv" && fs::exists(b / e.path().filename())) csvs.push_back(e.path());
    auto step_of = [](const fs::path& p) {  // grad_summary_{step}.csv; other names last
      const std::string stem = p.stem().string();
      const std::string digits = stem.substr(stem.rfind('_') + 1);
      const bool ok =
          !digits.empty() && digits.size() < 12 && digits.find_first_not_of("0123456789") == std::string::npos;
      return ok ? std::stoll(digits) : INT64_MAX;
    };
    std::sort(csvs.begin(), csvs.end(), [&](const fs::path& x, const fs::path& y) {
      return std::make_pair(step_of(x), x.string()) < std::make_pair(step_of(y), y.string());
    });
    if (!csvs.empty())
      if (auto text = read_file(csvs.front()))
        for (const std::string& n : csv_param_names(*text)) add(n);
    for (std::int64_t s : t.steps)
      for (const auto& e : fs::directory_iterator(da / ("step" + std::to_string(s)), ec))
        if (e.path().extension() == ".npy") add(e.path().stem().string());
  }
  if (mb)
    for (std::int64_t s : t.steps)
      for (const std::string& n : mb->steps.at(s)) add(n);

  std::vector<std::int64_t> same_total(t.steps.size(), 0), all_total(t.steps.size(), 0);
  for (const std::string& p : params) {
    std::vector<std::optional<double>> row;
    for (std::size_t k = 0; k < t.steps.size(); ++k) {
      const std::string step = "step" + std::to_string(t.steps[k]);
      const fs::path fa = da / step / (p + ".npy"), fb = db / step / (p + ".npy");
      std::string why;
      // A file its run's manifest does not list is an earlier run's: as good as missing.
      const auto ra = ma && !ma->wrote(t.steps[k], p) ? std::nullopt : read_file(fa);
      const auto rb = mb && !mb->wrote(t.steps[k], p) ? std::nullopt : read_file(fb);
      std::optional<io::NpyBytes> na, nb;
      if (ra) na = io::parse_npy(*ra, &why);
      if (rb && na) nb = io::parse_npy(*rb, &why);
      if (!ra || !rb) {
        t.problems.push_back(p + ": no file in " + step + " of run " + (ra ? "B" : "A"));
      } else if (!na || !nb) {
        t.problems.push_back(p + ": " + step + ": " + why);
      } else if (na->shape != nb->shape || na->descr != nb->descr) {
        t.problems.push_back(p + ": " + step + ": the two runs' files differ in shape or dtype");
      } else {
        std::int64_t same = 0;
        for (std::size_t i = 0; i < na->data.size(); ++i) same += na->data[i] == nb->data[i];
        const auto n = static_cast<std::int64_t>(na->data.size());
        row.emplace_back(n == 0 ? 0.0 : static_cast<double>(same) / static_cast<double>(n));
        same_total[k] += same;
        all_total[k] += n;
        continue;
      }
      row.emplace_back(std::nullopt);
    }
    t.rows.push_back(p);
    t.values.push_back(std::move(row));
  }
  std::vector<std::optional<double>> summary;
  for (std::size_t k = 0; k < t.steps.size(); ++k)
    summary.emplace_back(all_total[k] == 0 ? 0.0
                                           : static_cast<double>(same_total[k]) / static_cast<double>(all_total[k]));
  t.rows.push_back("summary");
  t.values.push_back(std::move(summary));
  return t;
}

inline std::string similarities_csv(const SimilarityTable& t) {
  std::string out(io::kUtf8Bom);
  std::vector<std::string> header{"step"};
  for (std::int64_t s : t.steps) header.push_back(std::to_string(s));
  io::append_csv_row(out, header);
  for (std::size_t r = 0; r < t.rows.size(); ++r) {
    std::vector<std::string> row{t.rows[r]};
    for (const auto& v : t.values[r]) row.push_back(v ? io::python_float_str(*v) : "");
    io::append_csv_row(out, row);
  }
  return out;
}

struct GradCompareReport {
  std::vector<std::int64_t> ranks;
  std::vector<std::string> problems;    // "rank0: fc.bias: no file in step1 of run B"
  std::vector<std::string> suspicious;  // "rank0: summary: step 0 similarity 0.58 < 0.97"
  std::vector<std::string> ignored;     // "rank0: run A: 2 file(s) of an earlier run in ... ignored (...)"
};

// Compares two grad_probe dump paths into `out`; throws std::runtime_error when they share no rank.
inline GradCompareReport compare_grad_runs(const fs::path& a, const fs::path& b, const fs::path& out) {
  GradCompareReport report;
  report.ranks = common(numbered_dirs(a, "rank"), numbered_dirs(b, "rank"));
  if (report.ranks.empty())
    throw std::runtime_error("no rank{N} directory is in both " + a.string() + " and " + b.string());
  for (std::int64_t r : report.ranks) {
    const std::string rank = "rank" + std::to_string(r);
    const SimilarityTable t = compare_rank(a / rank, b / rank);
    const fs::path dir = out / rank;
    io::create_directories(dir.string(), 0750);
    io::write_file_atomic((dir / "similarities.csv").string(), similarities_csv(t), 0640, false);
    std::optional<SimilarityTable> signs;
    if (fs::is_directory(a / rank / "sign") && fs::is_directory(b / rank / "sign")) {
      signs = compare_rank(a / rank, b / rank, "sign");
      io::write_file_atomic((dir / "similarities_sign.csv").string(), similarities_csv(*signs), 0640, false);
    }
    const std::vector<Curve> curves = html::curves_of(t.rows, t.values);
    io::create_directories((dir / "similarities_picture").string(), 0750);
    for (const Curve& c : curves)
      io::write_file_atomic(
          (dir / "similarities_picture" / (io::safe_component(c.name) + "_similarities.svg")).string(),
          html::svg_plot(c, t.steps), 0640, false);
    const std::vector<std::string> flagged = html::suspicious_steps(curves, t.steps);
    for (const std::string& f : flagged) report.suspicious.push_back(rank + ": " + f);
    for (const std::string& p : t.problems) report.problems.push_back(rank + ": " + p);
    for (const std::string& i : t.ignored) report.ignored.push_back(rank + ": " + i);
    io::write_file_atomic(
        (dir / "summary.html").string(),
        html::summary_page(rank, a.string(), b.string(), t.steps, curves, flagged, t.problems,
                           signs ? html::curves_of(signs->rows, signs->values) : std::vector<Curve>{}),
        0640, false);
  }
  return report;
}

inline const char* grad_compare_usage() {
  return "usage: torchprobe grad-compare RUN_A RUN_B -o OUT\n"
         "  RUN_A, RUN_B  dump_path directories of two grad_probe runs (level L1 or L2)\n"
         "  -o OUT        output directory: rank{N}/similarities.csv (msprobe's), similarities_picture/*.svg,\n"
         "                summary.html (curves, suspicious steps: step 0 < 0.97 or a drop > 0.03)\n"
         "exit status: 0 compared, 1 compared with missing files, 2 bad input\n";
}

// The subcommand: arguments after "grad-compare".
inline int run_grad_compare(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::vector<std::string> runs;
  std::string dest;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "-h" || args[i] == "--help") {
      out << grad_compare_usage();
      return 0;
    }
    if ((args[i] == "-o" || args[i] == "--output") && i + 1 < args.size())
      dest = args[++i];
    else
      runs.push_back(args[i]);
  }
  if (runs.size() != 2 || dest.empty()) {
    err << "torchprobe grad-compare: expected RUN_A RUN_B -o OUT\n" << grad_compare_usage();
    return 2;
  }
  try {
    const GradCompareReport r = compare_grad_runs(runs[0], runs[1], dest);
    for (const std::string& s : r.suspicious) out << "suspicious: " << s << "\n";
    for (const std::string& p : r.problems) err << "missing: " << p << "\n";
    for (const std::string& i : r.ignored) out << "ignored: " << i << "\n";
    out << "wrote " << dest << " (" << r.ranks.size() << " rank(s))\n";
    return r.problems.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    err << "torchprobe grad-compare: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace torchprobe::compare::grad

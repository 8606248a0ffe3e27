#pragma once
// `torchprobe compare TARGET BENCH -o OUT [...]`: argument parsing and the run, kept out of main()
// so that the unit tests call them directly. Exit status: 0 no divergence, 1 divergence, 2 bad input.
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>
#include <exception>
#include <utility>
#include <unordered_set>
#include <vector>

#include "torchprobe/analysis/compare/blame_plan.hpp"
#include "torchprobe/analysis/compare/dump_reader.hpp"
#include "torchprobe/analysis/compare/dump_rows_reader.hpp"
#include "torchprobe/analysis/compare/first_divergence.hpp"
#include "torchprobe/analysis/compare/html_report.hpp"
#include "torchprobe/analysis/compare/msprobe_csv.hpp"
#include "torchprobe/analysis/compare/msprobe_table.hpp"
#include "torchprobe/analysis/compare/progress.hpp"
#include "torchprobe/analysis/compare/second_pass.hpp"
#include "torchprobe/analysis/compare/user_map.hpp"
#include "torchprobe/io/data_file_name.hpp"
#include "torchprobe/io/timestamp.hpp"

namespace torchprobe::compare {

struct CompareOptions {
  std::filesystem::path target, bench, out;
  JudgeMode mode = JudgeMode::tol;
  double threshold = -1;  // < 0: the mode's default
  std::optional<long> step, rank;
  std::filesystem::path map;  // --map: the user's mapping file
  std::string timestamp;      // empty: now, as msprobe's YYYYmmddHHMMSS
  bool progress_tty = false;  // the log is a terminal: progress redrawn in place, else plain lines
  // The process ends when run_compare returns (the CLI): each pair's rows, table and judgement are
  // left to the OS, which takes them back at once, where freeing them object by object took 7% of
  // a large compare (8 s of a 1M-entry one). Off for a caller that goes on (the tests).
  bool exit_after = false;
  // msprobe's six tensor-mode cells of two .pt files (tensor_metrics.hpp's pt_tensor_cells; the CLI,
  // which links libtorch, sets it). Without it, tensor dumps are compared by their statistics.
  std::function<std::array<std::string, 6>(const std::filesystem::path& npu, const std::filesystem::path& bench)>
      pt_cells;
  // Blame by replay (blame_plan.hpp): how many diverging entries, from the source on, are blamed
  // (--blame N; 0: none), and the replay itself (blame_replay.hpp's blame_replay; the CLI, which
  // loads libtorch for it, sets it). Without it, tensor dumps are not blamed.
  std::size_t blame = 10;
  std::function<nlohmann::ordered_json(const nlohmann::ordered_json& request)> blame_fn;
  std::filesystem::path emit_config;  // --emit-config FILE: the second pass's configs (second_pass.hpp)
};

namespace details {
// Built with AddressSanitizer, whose leak check runs at exit: exit_after's memory is freed as usual
// there, so that what the check reports is never this deliberate leak. (GCC defines the macro;
// clang answers __has_feature.)
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kLeakChecked = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kLeakChecked = true;
#else
constexpr bool kLeakChecked = false;
#endif
#else
constexpr bool kLeakChecked = false;
#endif
}  // namespace details

// Above this many entries (both sides) run_compare reports its progress on the log.
constexpr std::size_t kProgressEntries = 4000;

inline const char* compare_usage() {
  return "usage: torchprobe compare TARGET BENCH -o OUT [--mode exact|tol|msprobe] [--threshold X]\n"
         "                          [--map FILE.yaml] [--step N] [--rank R] [--blame N] [--emit-config FILE]\n"
         "  TARGET, BENCH  a dump.json, a rank directory, a step directory (ranks paired) or a dump root\n"
         "  -o OUT         output directory (created): compare_result_{timestamp}.csv, first_divergence.json,\n"
         "                 report.html (open it in a browser)\n"
         "  --mode         exact: bit-equal statistics/checksums; tol (default): error within X times the\n"
         "                 dtype's epsilon (X = --threshold, default 64); msprobe: msprobe's own error rules\n"
         "  --map          'TARGET_NAME: BENCH_NAME' lines (entries or rows) pairing what names cannot\n"
         "  --blame N      tensor dumps: replay the source and the next diverging entries, N in all (default\n"
         "                 10, 0: none), to tell an error an op introduces from one it passes on\n"
         "  --emit-config FILE  write msprobe configs (FILE, and FILE's stem + _bench) that dump the tensors of\n"
         "                 just the suspect entries on a second run of each side\n"
         "exit status: 0 no divergence, 1 divergence found, 2 bad input\n";
}

// Throws InputError (a usage error) on bad arguments. `args` excludes "torchprobe compare".
inline CompareOptions parse_compare_args(const std::vector<std::string>& args) {
  CompareOptions o;
  std::vector<std::string> positional;
  const auto value = [&](std::size_t& i) -> const std::string& {
    if (i + 1 >= args.size()) throw InputError("option " + args[i] + " needs a value");
    return args[++i];
  };
  const auto number = [](const std::string& opt, const std::string& v) {
    try {
      std::size_t used = 0;
      const long n = std::stol(v, &used);
      if (used == v.size() && n >= 0) return n;
    } catch (const std::exception&) {
    }
    throw InputError("option " + opt + " needs a non-negative integer, not '" + v + "'");
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-o" || a == "--output") {
      o.out = value(i);
    } else if (a == "--mode") {
      const std::string& m = value(i);
      if (m == "exact")
        o.mode = JudgeMode::exact;
      else if (m == "tol")
        o.mode = JudgeMode::tol;
      else if (m == "msprobe")
        o.mode = JudgeMode::msprobe;
      else
        throw InputError("--mode must be exact, tol or msprobe, not '" + m + "'");
    } else if (a == "--threshold") {
      const std::string& v = value(i);
      try {
        std::size_t used = 0;
        o.threshold = std::stod(v, &used);
        if (used != v.size() || !(o.threshold >= 0)) throw std::invalid_argument(v);
      } catch (const std::exception&) {
        throw InputError("--threshold needs a non-negative number, not '" + v + "'");
      }
    } else if (a == "--map") {
      o.map = value(i);
    } else if (a == "--step") {
      o.step = number(a, value(i));
    } else if (a == "--rank") {
      o.rank = number(a, value(i));
    } else if (a == "--blame") {
      o.blame = static_cast<std::size_t>(number(a, value(i)));
    } else if (a == "--emit-config") {
      o.emit_config = value(i);
    } else if (!a.empty() && a[0] == '-' && a != "-") {
      throw InputError("unknown option " + a);
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 2)
    throw InputError("expected TARGET and BENCH, got " + std::to_string(positional.size()) + " path(s)");
  if (o.out.empty()) throw InputError("missing -o OUT (the output directory)");
  o.target = positional[0];
  o.bench = positional[1];
  return o;
}

inline void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.flush();
  if (!out) throw std::runtime_error(path.string() + ": cannot be written");
}

// Compares every pair of dumps; writes the outputs under o.out. Returns the exit status; messages
// go to `log`. Bad input (InputError) is reported and returns 2.
// A step recovered incomplete after a crash (`torchprobe recover`) holds the first entries of the
// step: the entries of `other` after the last one it has were not recovered, and are left out of the
// comparison (said on `log`) rather than reported as unpaired.
inline void leave_out_unrecovered(const Dump& incomplete, Dump& other, std::vector<Row>& other_rows,
                                  std::ostream& log) {
  if (incomplete.incomplete.empty()) return;
  // Set lookups and one cut of the tail: ordered_json's contains() and erase() scan the entries, so
  // a call per entry was quadratic in the dump's size.
  std::unordered_set<std::string_view> has;
  has.reserve(incomplete.data.size());
  for (const auto& kv : incomplete.data.get_ref<const nlohmann::ordered_json::object_t&>()) has.insert(kv.first);
  auto& entries = other.data.get_ref<nlohmann::ordered_json::object_t&>();
  std::size_t last = 0;  // one past the last entry of `other` that `incomplete` has
  for (std::size_t at = 0; at < entries.size(); ++at)
    if (has.count((entries.begin() + static_cast<std::ptrdiff_t>(at))->first)) last = at + 1;
  const std::size_t dropped = entries.size() - last;
  while (entries.size() > last) entries.pop_back();
  // Rows are in entry order: the cut entries' rows are the tail.
  while (!other_rows.empty() && other_rows.back().entry_index() >= last) other_rows.pop_back();
  log << "note: " << incomplete.file.string()
      << " is a step recovered incomplete after a crash (missing: " << incomplete.incomplete << "); the " << dropped
      << " entries of " << other.file.string() << " after its last one are left out, not reported as unpaired\n";
}

// A function run on a thread of its own; finish() waits for it and rethrows what it threw. Its
// destructor waits too, so that an error on the calling thread never leaves it running.
class BackgroundTask {
 public:
  BackgroundTask() = default;
  BackgroundTask(const BackgroundTask&) = delete;
  BackgroundTask& operator=(const BackgroundTask&) = delete;
  ~BackgroundTask() {
    if (thread_.joinable()) thread_.join();
  }
  template <class Fn>
  void start(Fn& fn) {
    thread_ = std::thread([this, &fn] {
      try {
        fn();
      } catch (...) {
        error_ = std::current_exception();
      }
    });
  }
  void finish() {
    if (thread_.joinable()) thread_.join();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  std::thread thread_;
  std::exception_ptr error_;
};

// Both sides read at once, one thread each (compare's reading is most of its time, and a second
// core is idle meanwhile). An error of the target is reported first, as if read in turn: the bench's
// reading is waited for while it unwinds, and what that threw is dropped.
inline std::pair<DumpRows, DumpRows> load_both(const std::filesystem::path& target,
                                               const std::filesystem::path& bench) {
  std::optional<DumpRows> b;
  const auto read_bench = [&] { b = load_dump_rows(bench); };
  BackgroundTask reader;
  reader.start(read_bench);
  DumpRows t = load_dump_rows(target);
  reader.finish();
  return {std::move(t), std::move(*b)};
}

inline int run_compare(const CompareOptions& o, std::ostream& log) {
  namespace fs = std::filesystem;
  try {
    const auto pairs = pair_inputs(o.target, o.bench, o.step, o.rank);
    std::error_code ec;
    fs::create_directories(o.out, ec);
    if (!fs::is_directory(o.out)) throw InputError(o.out.string() + ": cannot create the output directory");
    const std::string ts = o.timestamp.empty() ? io::compact_local_timestamp() : o.timestamp;
    bool diverged = false;
    std::optional<UserMap> user_map;
    if (!o.map.empty()) user_map = read_user_map(o.map);
    nlohmann::ordered_json summary = nlohmann::ordered_json::object();
    for (const DumpPair& p : pairs) {
      auto both = load_both(p.target, p.bench);
      DumpRows& tside = both.first;
      DumpRows& bside = both.second;
      Dump& t = tside.dump;
      Dump& b = bside.dump;
      std::vector<Row>& trows = tside.rows;
      std::vector<Row>& brows = bside.rows;
      leave_out_unrecovered(t, b, brows, log);
      leave_out_unrecovered(b, t, trows, log);
      if (t.task != b.task)
        throw InputError(p.target.string() + " has task \"" + t.task + "\" but " + p.bench.string() + " has \"" +
                         b.task + "\": compare needs the same task");
      if (t.task != "statistics" && t.task != "tensor")
        throw InputError(p.target.string() + ": task \"" + t.task + "\" cannot be compared (statistics or tensor)");
      const bool tensor_mode = t.task == "tensor" && o.pt_cells;  // msprobe's "all" mode
      if (t.has_md5 != b.has_md5 && !tensor_mode)
        throw InputError((t.has_md5 ? p.target : p.bench).string() + " holds md5 checksums but " +
                         (t.has_md5 ? p.bench : p.target).string() + " does not: both must be md5 or statistics dumps");
      const CsvMode stats_mode = t.has_md5 && b.has_md5 ? CsvMode::md5 : CsvMode::summary;
      const CsvMode mode = tensor_mode ? CsvMode::tensor : stats_mode;
      if (t.task == "tensor" && !tensor_mode)
        log << "note: tensor dumps are compared by the statistics in their dump.json; msprobe's tensor-mode columns "
               "(Cosine, EucDist, ...) need the .pt files and are not written\n";
      // Progress on stderr for big dumps: the stages, and a bar over the .pt pairs in tensor mode.
      const bool big = t.data.size() + b.data.size() > kProgressEntries;
      const auto stage = [&](int k, const char* what) {
        if (!big) return;
        if (o.progress_tty)
          log << "\r[" << k << "/4] " << what << " (" << t.data.size() << " + " << b.data.size() << " entries)   "
              << (k == 4 ? "\n" : "") << std::flush;
        else
          log << "[" << k << "/4] " << what << " (" << t.data.size() << " + " << b.data.size() << " entries)\n";
      };
      stage(1, "rows");
      stage(2, tensor_mode ? "msprobe's table, reading the .pt files" : "msprobe's table");
      TensorCellsFn cells;
      std::size_t files = 0;
      for (const Row& r : trows) files += r.data_name() != "-1" ? 1 : 0;
      if (big && tensor_mode && o.progress_tty) log << "\n";  // the bar below the stage line
      Progress bar(log, "  .pt pairs", files, o.progress_tty, big && tensor_mode);
      const fs::path tdir = t.file.parent_path() / "dump_tensor_data", bdir = b.file.parent_path() / "dump_tensor_data";
      if (tensor_mode) {
        cells = [&](const Row& n, const Row& g) {
          bar.advance();
          // A data_name with a directory part would read outside dump_tensor_data: not read.
          for (const std::string_view name : {n.data_name(), g.data_name()})
            if (const auto problem = io::data_file_name_problem(name)) {
              log << "torchprobe compare: data_name \"" << name << "\" of " << n.name << " is not read: " << *problem
                  << " (its metrics are 'unsupported')\n";
              std::array<std::string, 6> unsupported;  // tensor_metrics.hpp's TensorCells
              unsupported.fill("unsupported");
              return unsupported;
            }
          return o.pt_cells(tdir / n.data_name(), bdir / g.data_name());
        };
      }
      const fs::path csv = o.out / ("compare_result" + p.suffix + "_" + ts + ".csv");
      std::ofstream csv_out(csv, std::ios::binary);
      const auto csv_piece = [&](std::string_view piece) {
        csv_out.write(piece.data(), static_cast<std::streamsize>(piece.size()));
      };
      CsvStretches<decltype(csv_piece)> csv_text(trows, brows, mode, t.has_stack_file, cells, csv_piece);
      const auto write_csv = [&] {
        csv_text.work();
        bar.finish();
      };
      // msprobe's table and its CSV (a gigabyte for a million entries, whose writing waits on the
      // disk) are made on a thread of their own while the entries are paired and judged, and by
      // this thread too once it is done (CsvStretches): all only read the rows. Tensor mode stays
      // on this thread: its progress bar writes to the log.
      BackgroundTask csv_task;
      if (!tensor_mode) csv_task.start(write_csv);  // tensor mode: after the blame, whose columns it has
      stage(3, "matching and judging");
      // Entries are judged by the statistics every dump.json carries, tensor dumps included.
      Judgement j = judge(t, b, trows, brows, stats_mode, o.mode, o.threshold, user_map ? &*user_map : nullptr);
      stage(4, "first divergence");
      auto report = first_divergence_json(t, b, j);
      // --blame 0 turns the replay off; the suspects and a second pass still take the first 10.
      const BlamePlan plan = blame_plan(t, j, o.blame > 0 ? o.blame : 10);
      if (!plan.entries.empty()) report["suspects"] = suspects_json(j, plan);
      if (t.task == "tensor" && o.blame > 0 && !plan.replayed.empty()) {
        if (o.blame_fn) {
          try {
            add_blame(report, plan, o.blame_fn(blame_request(t, b, j, plan)));
            log << "  blame: " << report["blame_summary"].get<std::string>() << "\n";
          } catch (const std::exception& e) {  // the rest of the compare stands
            log << "torchprobe compare: the blame by replay failed: " << e.what() << "\n";
          }
        } else {
          log << "note: the blame by replay needs libtorch (the tool's module); not done\n";
        }
      }
      if (!o.emit_config.empty()) {
        if (plan.entries.empty()) {
          log << "note: nothing diverges: no second-pass config written\n";
        } else {
          fs::path file = o.emit_config;
          if (!p.suffix.empty()) file.replace_filename(file.stem().string() + p.suffix + file.extension().string());
          try {  // the compare's own outputs are written all the same
            const auto written = emit_second_pass_configs(file, t, b, plan);
            log << "  second pass: " << written.first.string() << " (target), " << written.second.string()
                << " (bench)\n";
          } catch (const std::exception& e) {
            log << "torchprobe compare: " << e.what() << "\n";
          }
        }
      }
      ExtraColumns blame_cells;
      if (tensor_mode && report.contains("blame")) {
        blame_cells = blame_columns(report);
        csv_text.set_extra(&blame_cells);
      }
      if (tensor_mode) write_csv();
      const fs::path fd = o.out / ("first_divergence" + p.suffix + ".json");
      write_file(fd, report.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n");
      const fs::path page = o.out / ("report" + p.suffix + ".html");
      write_file(page, html_report(t, b, j, report));
      csv_text.work();    // this thread makes what is left of the CSV (nothing, in tensor mode)
      csv_task.finish();  // rethrows what the CSV's thread threw
      csv_out.flush();
      if (!csv_out) throw std::runtime_error(csv.string() + ": cannot be written");
      diverged = diverged || j.diverged();
      log << p.target.string() << " vs " << p.bench.string() << ": " << j.summary_line() << "\n"
          << "  wrote " << csv.string() << ", " << fd.string() << " and " << page.string() << "\n";
      if (o.exit_after && !details::kLeakChecked) {
        struct Left {
          DumpRows t, b;
          Judgement j;
        };
        static_cast<void>(new Left{std::move(tside), std::move(bside), std::move(j)});  // never deleted: see exit_after
      }
    }
    return diverged ? 1 : 0;
  } catch (const InputError& e) {
    log << "torchprobe compare: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {  // e.g. a file that cannot be written: never a silent abort
    log << "torchprobe compare: error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace torchprobe::compare

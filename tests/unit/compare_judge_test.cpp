// torchprobe compare's judging, matching and first_divergence.json on the three-Linear net of
// issue 18 (hand-written dumps, tests/unit/compare_support.hpp), on TorchProbe's golden C++ dump
// against its Python-named counterpart, and its answers to bad input.
#include <doctest/doctest.h>
#include "../skip.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "compare_support.hpp"
#include "torchprobe/analysis/compare/cli.hpp"

namespace {
namespace fs = std::filesystem;
using namespace torchprobe::compare;
using namespace tp_compare_test;

struct Run {
  int status = -1;
  std::string log;
  nlohmann::ordered_json report;
};

Run compare_dirs(const fs::path& t, const fs::path& b, const fs::path& out, JudgeMode mode = JudgeMode::tol) {
  CompareOptions o;
  o.target = t;
  o.bench = b;
  o.out = out;
  o.mode = mode;
  o.timestamp = "20260101000000";
  std::ostringstream log;
  Run r;
  r.status = run_compare(o, log);
  r.log = log.str();
  if (fs::exists(out / "first_divergence.json")) r.report = read_json_file(out / "first_divergence.json");
  return r;
}

Run three_linear_run(Variant target, Variant bench, JudgeMode mode = JudgeMode::tol) {
  const fs::path dir = temp_dir("net");
  three_linear(target).write(dir / "a");
  three_linear(bench).write(dir / "b");
  Run r = compare_dirs(dir / "a", dir / "b", dir / "out", mode);
  fs::remove_all(dir);
  return r;
}
}  // namespace

TEST_CASE("three-Linear net, A vs A: no divergence, exit 0") {
  const Run r = three_linear_run(Variant::same, Variant::same);
  CHECK(r.status == 0);
  CHECK(r.report["diverged"] == false);
  CHECK(r.report["first_divergence"].is_null());
  CHECK(r.report["summary"]["target_only"] == 0);
  CHECK(r.report["summary"]["paired_exact"] == r.report["summary"]["target_entries"]);
}

TEST_CASE("three-Linear net, fc2 computed in bf16: the source is fc2's first op, whose inputs the B-only casts made") {
  const Run r = three_linear_run(Variant::same, Variant::bf16_fc2);
  CHECK(r.status == 1);
  // Aten.t.1 (fc2's W^T) gets the weight cast to bf16: the same values in a coarser precision, so
  // its inputs agree (in bf16 epsilons) and its output does not (bf16 against fp32): the source.
  const auto& src = r.report["first_divergence"];
  REQUIRE(src.is_object());
  CHECK(src["entry"] == "Aten.t.1.forward");
  CHECK(src["role"] == "source");
  CHECK(src["input_error"].get<double>() <= 0.5);  // a rounding to bf16: at most half an epsilon
  CHECK(src["output_error"] == "inf");             // a dtype difference
  CHECK(src["innermost_op"] == "Aten.t.1.forward");
  CHECK(src["stack"].size() == 1);
  CHECK(src["module_chain"] == nlohmann::ordered_json::array({"Module.fc2.Linear.forward.0"}));
  // The unmatched casts of the bench between the last clean entry and it are named as the cause.
  const auto& first = r.report["first_diverging_entry"];
  CHECK(first["entry"] == "Aten.t.1.forward");
  CHECK(first["unmatched_before"] ==
        nlohmann::ordered_json::array(
            {"bench: Aten.to.0.forward", "bench: Aten.to.1.forward", "bench: Aten.to.2.forward"}));
  CHECK(r.report["summary"]["bench_only"] == 4);
  CHECK(r.report["first_overflow"]["target"].is_null());
  CHECK(r.report["first_overflow"]["bench"].is_null());
}

TEST_CASE("with msprobe's own rules the bf16 fc2 is not a source: only dtype errors inside it") {
  const Run r = three_linear_run(Variant::same, Variant::bf16_fc2, JudgeMode::msprobe);
  CHECK(r.status == 1);
  CHECK(r.report["first_divergence"].is_null());
  CHECK(r.report["first_diverging_entry"]["entry"] == "Aten.t.1.forward");
}

TEST_CASE("fc2's output times 3e38: the first overflow is the bench's Aten.mul, unmatched, inside fc2") {
  const Run r = three_linear_run(Variant::same, Variant::overflow_fc2);
  CHECK(r.status == 1);
  const auto& o = r.report["first_overflow"]["bench"];
  REQUIRE(o.is_object());
  CHECK(o["entry"] == "Aten.mul.0.forward");
  CHECK(o["match"] == "unmatched");
  CHECK(o["module_chain"] == nlohmann::ordered_json::array({"Module.fc2.Linear.forward.0"}));
  CHECK(r.report["first_overflow"]["target"].is_null());
  CHECK(r.report["first_divergence"]["entry"] == "Module.fc2.Linear.forward.0");
  CHECK(r.report["first_divergence"]["output_error"] == "inf");
}

TEST_CASE("two ulps of kernel-order noise pass the tol mode and fail the exact mode") {
  const Run tol = three_linear_run(Variant::same, Variant::ulp_fc3);
  CHECK(tol.status == 0);
  const Run exact = three_linear_run(Variant::same, Variant::ulp_fc3, JudgeMode::exact);
  CHECK(exact.status == 1);
  CHECK(exact.report["first_divergence"]["entry"] == "Aten.addmm.2.forward");
  CHECK(exact.report["threshold"] == 0.0);
}

TEST_CASE("md5 dumps: exact mode judges the CRC-32, tol mode the statistics beside it") {
  const fs::path dir = temp_dir("md5");
  for (const auto& [name, v] : {std::pair<const char*, Variant>{"a", Variant::same}, {"b", Variant::ulp_fc3}}) {
    Dir d = three_linear(v);
    // a checksum of each item's statistics: it differs exactly where a statistic does
    std::function<void(Json&)> add_md5 = [&](Json& j) {
      if (j.is_object() && j.contains("type")) {
        char buf[16];
        std::snprintf(buf, sizeof buf, "%08zx", std::hash<std::string>{}(j.dump()) & 0xffffffffu);
        j["md5"] = buf;
      } else if (j.is_structured()) {
        for (auto& x : j) add_md5(x);
      }
    };
    add_md5(d.data);
    d.write(dir / name);
  }
  CHECK(compare_dirs(dir / "a", dir / "b", dir / "o1").status == 0);
  const Run exact = compare_dirs(dir / "a", dir / "b", dir / "o2", JudgeMode::exact);
  CHECK(exact.status == 1);
  CHECK(exact.report["first_divergence"]["entry"] == "Aten.addmm.2.forward");
  fs::remove_all(dir);
}

TEST_CASE("TorchProbe's C++ mix dump pairs with its Python-named twin through the templates, no divergence") {
  const fs::path golden = fs::path(TORCHPROBE_TESTS_DIR) / "data/golden/torch-1.13/quick_start_mix/step0/rank0";
  REQUIRE_MESSAGE(fs::exists(golden / "dump.json"), "no golden dump at " << golden);
  // The twin is written as msprobe names a Python model: Functional.linear(x, W, b) for
  // t + addmm(b, x, W^T), Functional.relu, Tensor.sum, and linear's backward for addmm's.
  const Dump cpp = load_dump(golden / "dump.json");
  const auto& d = cpp.data;
  Json py = Json::object();
  Json lin = Json::object();
  lin["input_args"] = {d["Aten.addmm.0.forward"]["input_args"][1], d["Aten.t.0.forward"]["input_args"][0],
                       d["Aten.addmm.0.forward"]["input_args"][0]};
  lin["input_kwargs"] = Json::object();
  lin["output"] = d["Aten.addmm.0.forward"]["output"];
  py["Functional.linear.0.forward"] = lin;
  py["Module.fc.Linear.forward.0"] = d["Module.fc.Linear.forward.0"];
  py["Functional.relu.0.forward"] = d["Aten.relu.0.forward"];
  py["Tensor.sum.0.forward"] = d["Aten.sum.0.forward"];
  py["Tensor.sum.0.backward"] = d["Aten.sum.0.backward"];
  py["Functional.relu.0.backward"] = d["Aten.relu.0.backward"];
  py["Functional.linear.0.backward"] = d["Aten.addmm.0.backward"];
  py["Module.fc.Linear.parameters_grad.0"] = d["Module.fc.Linear.parameters_grad.0"];
  py["Module.fc.Linear.backward.0"] = d["Module.fc.Linear.backward.0"];
  const fs::path dir = temp_dir("templates");
  fs::create_directories(dir / "py");
  Json dump = {
      {"task", "statistics"}, {"level", "mix"}, {"framework", "pytorch"}, {"dump_data_dir", nullptr}, {"data", py}};
  std::ofstream(dir / "py" / "dump.json") << dump.dump(1);
  for (const bool cpp_is_target : {true, false}) {
    CAPTURE(cpp_is_target);
    const Run r =
        cpp_is_target ? compare_dirs(golden, dir / "py", dir / "out1") : compare_dirs(dir / "py", golden, dir / "out2");
    CHECK(r.status == 0);
    CHECK(r.report["summary"]["target_only"] == 0);
    CHECK(r.report["summary"]["bench_only"] == 0);
    CHECK(r.report["summary"]["paired_exact"] == 3);     // the module's forward, backward, parameters_grad
    CHECK(r.report["summary"]["paired_template"] == 6);  // linear, relu, sum; forward and backward
  }
  // An extra Python-only sum (over dim 1: output [2]) before the real one does not shift the pairs:
  // the real sum (0-d output) is found among the next ones by its output's shape.
  Json extra = Json::object();
  for (auto it = py.begin(); it != py.end(); ++it) {
    if (it.key() == "Tensor.sum.0.forward") {
      Json e = it.value();
      e["output"][0]["shape"] = Json::array({2});
      extra["Tensor.sum.0.forward"] = e;
      extra["Tensor.sum.1.forward"] = it.value();
    } else {
      extra[it.key()] = it.value();
    }
  }
  dump["data"] = extra;
  std::ofstream(dir / "py" / "dump.json") << dump.dump(1);
  const Run shifted = compare_dirs(golden, dir / "py", dir / "out4");
  CHECK(shifted.status == 0);
  CHECK(shifted.report["summary"]["paired_template"] == 6);
  CHECK(shifted.report["unmatched"]["bench_only"] == Json::array({"Tensor.sum.0.forward"}));
  // A value changed in the twin's linear input x is found, through the template's argument map.
  py["Functional.linear.0.forward"]["input_args"][0]["Max"] = 100.0;
  dump["data"] = py;
  std::ofstream(dir / "py" / "dump.json") << dump.dump(1);
  const Run r = compare_dirs(golden, dir / "py", dir / "out3");
  CHECK(r.status == 1);
  CHECK(r.report["first_diverging_entry"]["entry"] == "Aten.t.0.forward");
  CHECK(r.report["first_diverging_entry"]["worst_input_row"] == "Aten.addmm.0.forward.input.1");
  fs::remove_all(dir);
}

TEST_CASE("bad input exits with status 2 and a message that names the file") {
  const fs::path dir = temp_dir("bad");
  const fs::path good = three_linear(Variant::same).write(dir / "good");
  const auto expect_2 = [&](const fs::path& t, const fs::path& b, const std::string& needle) {
    const Run r = compare_dirs(t, b, dir / "out");
    CHECK(r.status == 2);
    CHECK(r.log.find(needle) != std::string::npos);
  };
  SUBCASE("missing dump.json") {
    fs::create_directories(dir / "empty_dir");
    expect_2(dir / "empty_dir", good, (dir / "empty_dir").string());
    expect_2(dir / "nothing", good, (dir / "nothing").string());
  }
  SUBCASE("truncated JSON") {
    std::string text;
    {
      std::ifstream in(good);
      std::stringstream ss;
      ss << in.rdbuf();
      text = ss.str();
    }
    fs::create_directories(dir / "cut");
    std::ofstream(dir / "cut" / "dump.json") << text.substr(0, text.size() / 2);
    expect_2(good, dir / "cut", (dir / "cut" / "dump.json").string() + ": not valid JSON");
  }
  SUBCASE("different tasks") {
    three_linear(Variant::same).write(dir / "tensor", "tensor");
    expect_2(good, dir / "tensor", "compare needs the same task");
  }
  SUBCASE("empty dump") {
    Dir().write(dir / "none");
    expect_2(good, dir / "none", (dir / "none" / "dump.json").string() + ": the dump holds no entries");
  }
  SUBCASE("step directories with different rank counts") {
    three_linear(Variant::same).write(dir / "s1" / "rank0");
    three_linear(Variant::same).write(dir / "s1" / "rank1");
    three_linear(Variant::same).write(dir / "s2" / "rank0");
    expect_2(dir / "s1", dir / "s2", "has 2 rank(s) but");
  }
  fs::remove_all(dir);
}

TEST_CASE("step directories pair their ranks, one CSV per rank") {
  const fs::path dir = temp_dir("ranks");
  for (const char* side : {"a", "b"}) {
    three_linear(Variant::same).write(dir / side / "step0" / "rank0");
    three_linear(side[0] == 'a' ? Variant::same : Variant::bf16_fc2).write(dir / side / "step0" / "rank1");
  }
  const Run r = compare_dirs(dir / "a" / "step0", dir / "b" / "step0", dir / "out");
  CHECK(r.status == 1);
  CHECK(fs::exists(dir / "out" / "compare_result_rank0_20260101000000.csv"));
  CHECK(fs::exists(dir / "out" / "compare_result_rank1_20260101000000.csv"));
  CHECK(read_json_file(dir / "out" / "first_divergence_rank0.json")["diverged"] == false);
  CHECK(read_json_file(dir / "out" / "first_divergence_rank1.json")["diverged"] == true);
  // --rank picks one pair; a dump root with --step picks the step
  CompareOptions o = parse_compare_args(
      {(dir / "a").string(), (dir / "b").string(), "-o", (dir / "o2").string(), "--step", "0", "--rank", "0"});
  std::ostringstream log;
  CHECK(run_compare(o, log) == 0);
  fs::remove_all(dir);
}

TEST_CASE("argument errors are usage errors") {
  CHECK_THROWS_WITH_AS(parse_compare_args({"a", "b"}), doctest::Contains("missing -o"), InputError);
  CHECK_THROWS_WITH_AS(parse_compare_args({"a", "-o", "x"}), doctest::Contains("expected TARGET and BENCH"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_compare_args({"a", "b", "-o", "x", "--mode", "fuzzy"}), doctest::Contains("--mode"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_compare_args({"a", "b", "-o", "x", "--step", "-1"}), doctest::Contains("--step"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_compare_args({"a", "b", "-o", "x", "--bogus"}), doctest::Contains("unknown option"),
                       InputError);
  const CompareOptions o = parse_compare_args({"a", "b", "-o", "x", "--mode", "exact", "--threshold", "3"});
  CHECK(o.mode == JudgeMode::exact);
  CHECK(o.threshold == 3.0);
}

TEST_CASE("--map pairs what names cannot: entry items, row items, and a bad line is bad input") {
  const fs::path dir = temp_dir("map");
  three_linear(Variant::same).write(dir / "a");
  Dir b = three_linear(Variant::same);
  Json renamed = Json::object();  // the bench calls relu.1 and addmm.2 by other names
  for (auto it = b.data.begin(); it != b.data.end(); ++it) {
    const std::string k = it.key() == "Aten.relu.1.forward"    ? "Aten.my_relu.0.forward"
                          : it.key() == "Aten.addmm.2.forward" ? "Aten.my_mm.0.forward"
                                                               : it.key();
    renamed[k] = it.value();
  }
  b.data = renamed;
  b.write(dir / "b");
  // Without a map the value pass still pairs them: their outputs' statistics are unique.
  Run r = compare_dirs(dir / "a", dir / "b", dir / "out0");
  CHECK(r.status == 0);
  CHECK(r.report["summary"]["paired_value"] == 2);
  std::ofstream(dir / "map.yaml") << "# entry item, then row items\n"
                                     "Aten.relu.1.forward: Aten.my_relu.0.forward\n"
                                     "Aten.addmm.2.forward.output.0: 'Aten.my_mm.0.forward.output.0'\n"
                                     "Aten.addmm.2.forward.input.1: Aten.my_mm.0.forward.input.1\n";
  CompareOptions o = parse_compare_args({(dir / "a").string(), (dir / "b").string(), "-o", (dir / "out1").string(),
                                         "--map", (dir / "map.yaml").string()});
  std::ostringstream log;
  CHECK(run_compare(o, log) == 0);
  const auto report = read_json_file(dir / "out1" / "first_divergence.json");
  CHECK(report["summary"]["paired_map"] == 2);
  CHECK(report["summary"].value("paired_value", 0) == 0);
  CHECK(report["summary"]["target_only"] == 0);
  std::ofstream(dir / "bad.yaml")
      << "Aten.relu.1.forward: Aten.my_relu.0.forward\nFunctional.linear: [Aten.t, Aten.addmm\n";
  o.map = dir / "bad.yaml";
  std::ostringstream bad_log;
  CHECK(run_compare(o, bad_log) == 2);
  CHECK(bad_log.str().find((dir / "bad.yaml").string() + ":2:") != std::string::npos);
  fs::remove_all(dir);
}

// Real models, item 4: msprobe sums Mean and Norm in float32, TorchProbe in float64. On a tensor
// of 10^6 elements the two Norms of the same tensor differ by ~1e-5 relative (98 float32 epsilons,
// over the default threshold of 64): the float sums' allowance (n/1024 epsilons) covers that, and
// only that.
namespace {
Run norm_pair(std::vector<int> shape, double bench_norm, bool bench_python, double bench_max = 3.25) {
  const fs::path dir = temp_dir("sums");
  const std::string f32 = "torch.float32";
  Dir target, bench;
  bench.python = bench_python;
  const Stats x{f32, shape, 3.25, -3.5, 0.0012, 22.640811};
  Stats y = x;
  y.norm = bench_norm;
  y.max = bench_max;
  target.add("Module.fc.Linear.forward.0", entry({x}, {x}));
  bench.add("Module.fc.Linear.forward.0", entry({y}, {x}));
  target.write(dir / "a");
  bench.write(dir / "b");
  Run r = compare_dirs(dir / "a", dir / "b", dir / "out");
  fs::remove_all(dir);
  return r;
}
}  // namespace

TEST_CASE(
    "a Norm off as msprobe's float32 sum of 10^6 elements is no divergence, and the report names the exact side") {
  const Run r = norm_pair({1000, 1000}, 22.640547, /*bench_python=*/true);
  INFO(r.log);
  CHECK(r.status == 0);
  CHECK(r.report["statistics"]["rows_within_allowance"] == 1);
  CHECK(r.report["statistics"]["more_exact"] == "target");
  CHECK(r.report["statistics"]["bench"].get<std::string>().rfind("msprobe (Python)", 0) == 0);
  CHECK(r.log.find("1 rows differ in Mean or Norm only as float sums do (the more exact side: target)") !=
        std::string::npos);
}

TEST_CASE("the float sums' allowance: not between two TorchProbe dumps, not on a small tensor, never on Max") {
  // Both sides C++ (float64 sums): the same 98-epsilon Norm difference is a divergence.
  const Run both_cpp = norm_pair({1000, 1000}, 22.640547, /*bench_python=*/false);
  CHECK(both_cpp.status == 1);
  CHECK(both_cpp.report["statistics"]["rows_within_allowance"] == 0);
  // 512 elements: the allowance is half an epsilon.
  CHECK(norm_pair({8, 64}, 22.640547, true).status == 1);
  // Max of 3.25 moved by 200 epsilons (a weight scaled by 1 + 1000 * 2^-23 moves it by more).
  CHECK(norm_pair({1000, 1000}, 22.640811, true, 3.25 * (1 + 200 * std::ldexp(1.0, -23))).status == 1);
}

TEST_CASE("a number passed as int on one side and float on the other is the same number, not a dtype divergence") {
  // C++ passes softplus's beta as 1.0 where Python's nn.Softplus passes 1: msprobe writes
  // "<class 'float'>" for one and "<class 'int'>" for the other.
  TextStore store;  // keeps the rows' cells that are not floats
  const auto scalar = [&](const char* dtype, const Json& value) {
    Row r;
    r.name = "Aten.softplus.0.forward.input.1";
    r.dtype = dtype;
    r.shape = "[]";
    r.set_stats({value, value, value, value}, store);
    return r;
  };
  const Row py_int = scalar("<class 'int'>", 1), cpp_float = scalar("<class 'float'>", 1.0);
  const Row other = scalar("<class 'float'>", 1.5), text = scalar("<class 'str'>", "1");
  for (const JudgeMode mode : {JudgeMode::tol, JudgeMode::exact}) {
    CHECK(row_error({&py_int, &cpp_float}, mode, false) == 0);
    CHECK(row_error({&cpp_float, &py_int}, mode, false) == 0);
    CHECK(row_error({&py_int, &other}, mode, false) > kDefaultTolEpsilons);  // 1 against 1.5 diverges
    CHECK(row_error({&py_int, &text}, mode, false) == kInf);                 // a string is no number
  }
  // 1 against 1 + 2^-52 (one float64 epsilon): within the tol mode's threshold, not exact.
  const Row near = scalar("<class 'float'>", 1.0 + std::ldexp(1.0, -52));
  CHECK(row_error({&py_int, &near}, JudgeMode::tol, false) <= kDefaultTolEpsilons);
  CHECK(row_error({&py_int, &near}, JudgeMode::exact, false) == kInf);
}

TEST_CASE("a CSV that cannot be written, on its own thread, fails the compare with status 2 naming the file") {
  const fs::path dir = temp_dir("csv_unwritable");
  three_linear(Variant::same).write(dir / "a");
  three_linear(Variant::same).write(dir / "b");
  const fs::path csv = dir / "out" / "compare_result_20260101000000.csv";
  fs::create_directories(csv);  // a directory where the CSV goes: its stream fails
  const Run r = compare_dirs(dir / "a", dir / "b", dir / "out");
  CHECK(r.status == 2);
  CHECK(r.log.find(csv.string() + ": cannot be written") != std::string::npos);
  fs::remove_all(dir);
}

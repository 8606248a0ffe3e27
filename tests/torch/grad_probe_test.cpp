// GradMonitor (task grad_probe): msprobe's own outputs for the quick-start model reproduced file by
// file (reference-dumps/grad_probe/, made by run_grad_probe.py there), and the interval, NaN, empty
// and dtype cases of msprobe-grad-probe-run-ut.md §A.4/§A.7 checked against values worked out by hand.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/analysis/compare/grad_compare.hpp>
#include <torchprobe/torchprobe.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <sys/stat.h>

#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kRef = std::string(TORCHPROBE_REFERENCE_DUMPS) + "/grad_probe";

mode_t current_umask() {
  const mode_t m = ::umask(0);
  ::umask(m);
  return m;
}

// run_grad_probe.py in C++: seed 1234, Net, SGD lr 0.1, [data seed], two steps of randn(2, 8).
template <class Monitor>  // GradMonitor, or PrecisionDebugger with task grad_probe
void run_reference_script(Monitor& mon, std::optional<int> data_seed = std::nullopt) {
  torch::manual_seed(1234);
  tptest::Net model;
  mon.monitor(model);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  if (data_seed) torch::manual_seed(*data_seed);
  for (int step = 0; step < 2; ++step) {
    const torch::Tensor x = torch::randn({2, 8});
    opt.zero_grad();
    model->forward(x).sum().backward();
    mon.step();  // where msprobe's optimizer step pre-hook fires
    opt.step();
  }
}

// Python csv.reader of a file written with utf-8-sig: the BOM and "\r\n" are required here.
std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  const std::string text = tptest::read_text(path);
  REQUIRE_MESSAGE(text.rfind("\xEF\xBB\xBF", 0) == 0, path << " has no UTF-8 BOM");
  std::vector<std::vector<std::string>> rows(1, std::vector<std::string>(1));
  bool quoted = false;
  for (std::size_t i = 3; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"')
        rows.back().back() += text[++i];
      else if (c == '"')
        quoted = false;
      else
        rows.back().back() += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      rows.back().emplace_back();
    } else if (c == '\r') {
      REQUIRE_MESSAGE((i + 1 < text.size() && text[i + 1] == '\n'), path << ": a row does not end with CRLF");
      if (++i + 1 < text.size()) rows.emplace_back(1);
    } else {
      REQUIRE_MESSAGE(c != '\n', path << ": a bare LF");
      rows.back().back() += c;
    }
  }
  return rows;
}

// Our file against msprobe's: same header; max/min/norm within 1e-6 relative (msprobe reduces in
// float32, TorchProbe in float64), every other cell identical.
void check_same_csv(const std::string& ours, const std::string& theirs) {
  INFO(ours);
  const auto a = read_csv(ours), b = read_csv(theirs);
  REQUIRE(a.size() == b.size());
  const std::vector<std::string>& header = b[0];
  CHECK(a[0] == header);
  for (std::size_t r = 1; r < b.size(); ++r) {
    REQUIRE(a[r].size() == b[r].size());
    for (std::size_t c = 0; c < b[r].size(); ++c) {
      CAPTURE(header[c]);
      if (header[c] == "max" || header[c] == "min" || header[c] == "norm")
        CHECK(std::stod(a[r][c]) == doctest::Approx(std::stod(b[r][c])).epsilon(1e-6));
      else
        CHECK(a[r][c] == b[r][c]);
    }
  }
}

// Every file msprobe wrote under `ref` exists in `ours` and matches (CSV by cell, .npy by byte);
// and ours has no file msprobe lacks but TorchProbe's run manifest (one per rank directory).
void check_same_dump(const std::string& ours, const std::string& ref) {
  std::size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(ref)) {
    if (!e.is_regular_file()) continue;
    ++files;
    const std::string rel = fs::relative(e.path(), ref).string();
    const std::string mine = ours + "/" + rel;
    REQUIRE_MESSAGE(fs::exists(mine), "missing " << rel);
    if (e.path().extension() == ".csv")
      check_same_csv(mine, e.path().string());
    else
      CHECK_MESSAGE(tptest::read_text(mine) == tptest::read_text(e.path().string()), rel << " differs");
    struct stat st {};
    REQUIRE(::stat(mine.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == (0640 & ~current_umask()));
  }
  std::size_t mine = 0, manifests = 0;
  for (const auto& e : fs::recursive_directory_iterator(ours)) {
    if (e.is_regular_file()) ++(e.path().filename() == tp::grad_probe::kRunManifestName ? manifests : mine);
    if (e.is_directory()) {
      struct stat st {};
      REQUIRE(::stat(e.path().c_str(), &st) == 0);
      CHECK((st.st_mode & 0777) == (0750 & ~current_umask()));
    }
  }
  CHECK(files > 0);
  CHECK(mine == files);
  CHECK(manifests == 1);
}

bool have_reference() { return fs::exists(kRef + "/configs/cfg_L1.json"); }

}  // namespace

TEST_CASE("the libtorch quick-start run writes msprobe's grad_probe files for L0, L1, L2, bounds and a step filter") {
  REQUIRE_MESSAGE(have_reference(), "no msprobe reference dumps at " << kRef);
  for (const char* name : {"L0", "L1", "L2", "L2_bounds", "L1_step1"}) {
    CAPTURE(name);
    tptest::TempDir dir;
    tp::GradMonitor mon(kRef + "/configs/cfg_" + name + ".json", tp::Options().dump_path(dir.path()));
    run_reference_script(mon);
    check_same_dump(dir.path(), kRef + "/" + name);
  }
}

TEST_CASE("run B of the comparison (other inputs after the same seed) is reproduced too") {
  REQUIRE_MESSAGE(have_reference(), "no msprobe reference dumps at " << kRef);
  tptest::TempDir dir;
  tp::GradMonitor mon(kRef + "/configs/cfg_L1_runB.json", tp::Options().dump_path(dir.path()));
  run_reference_script(mon, 99);
  check_same_dump(dir.path(), kRef + "/L1_runB");
}

TEST_CASE(
    "PrecisionDebugger with task grad_probe is a GradMonitor: monitor(model), then step() before optimizer.step()") {
  REQUIRE_MESSAGE(have_reference(), "no msprobe reference dumps at " << kRef);
  tptest::TempDir dir;
  tp::PrecisionDebugger dbg(kRef + "/configs/cfg_L2.json", tp::Options().dump_path(dir.path()));
  CHECK(dbg.config().task == tp::Task::GradProbe);
  dbg.start();  // no-ops for this task, as in msprobe
  run_reference_script(dbg);
  dbg.stop();
  CHECK_FALSE(dbg.running());
  check_same_dump(dir.path(), kRef + "/L2");
}

TEST_CASE("values on a bound fall in the interval they close; zeros count twice, NaN in the last interval") {
  tptest::TempDir dir;
  torch::nn::Module m;
  // float32: 0.1f equals the float32-rounded bound 0.1, so it closes (0, 0.1] like msprobe's bucketize.
  torch::Tensor w = m.register_parameter("w", torch::zeros({10}));
  w.mutable_grad() = torch::tensor({-1.0f, -1.5f, 0.0f, -0.0f, -0.5f, 0.1f, 0.5f, 1.0f, 2.0f, NAN});
  tp::GradMonitor mon(tp::Options()
                          .set("task", "grad_probe")
                          .dump_path(dir.path())
                          .set("grad_level", "L2")
                          .set("bounds", json::parse("[-1, 0, 0.1, 1]")));
  mon.monitor(m);
  mon.step();
  const auto rows = read_csv(dir.path() + "/rank0/grad_summary_0.csv");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0] == std::vector<std::string>{"param_name", "(-inf, -1]", "(-1, 0]", "(0, 0.1]", "(0.1, 1]", "(1, inf)",
                                            "=0", "max", "min", "norm", "shape"});
  // -1 -1.5 | 0 -0 -0.5 | 0.1 | 0.5 1 | 2 NaN ; two zeros; NaN poisons max/min/norm (torch semantics).
  CHECK(rows[1] ==
        std::vector<std::string>{"w", "0.2", "0.3", "0.1", "0.2", "0.2", "0.2", "nan", "nan", "nan", "[10]"});
  // Direction: only strictly positive values are True (zero and NaN are False, as in msprobe).
  const std::string npy = tptest::read_text(dir.path() + "/rank0/step0/w.npy");
  CHECK(npy.substr(128) == std::string("\0\0\0\0\0\1\1\1\1\0", 10));
}

TEST_CASE("an empty gradient gives zero fractions and nan extrema instead of msprobe's crash; a 0-d one its [] shape") {
  tptest::TempDir dir;
  torch::nn::Module m;
  m.register_parameter("e", torch::zeros({0, 3})).mutable_grad() = torch::zeros({0, 3});
  m.register_parameter("s", torch::zeros({})).mutable_grad() = torch::full({}, -3.0);
  m.register_parameter("none", torch::zeros({2}));  // never gets a grad: no row, no file
  tp::GradMonitor mon(tp::Options().set("task", "grad_probe").dump_path(dir.path()).set("grad_level", "L2"));
  mon.monitor(m);
  mon.step();
  const auto rows = read_csv(dir.path() + "/rank0/grad_summary_0.csv");
  REQUIRE(rows.size() == 3);
  CHECK(rows[1] == std::vector<std::string>{"e", "0.0", "0.0", "0.0", "0.0", "0.0", "nan", "nan", "0.0", "[0, 3]"});
  CHECK(rows[2] == std::vector<std::string>{"s", "1.0", "0.0", "0.0", "0.0", "0.0", "-3.0", "-3.0", "3.0", "[]"});
  CHECK(tptest::read_text(dir.path() + "/rank0/step0/e.npy").size() == 128);
  CHECK(tptest::read_text(dir.path() + "/rank0/step0/s.npy").find("'shape': (), }") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.path() + "/rank0/step0/none.npy"));
}

TEST_CASE("empty bounds: one interval, named (-inf, inf) so that the header has as many columns as the rows") {
  tptest::TempDir dir;
  torch::nn::Module m;
  m.register_parameter("w", torch::zeros({4})).mutable_grad() = torch::tensor({0.0, 1.0, -2.0, 3.0});
  tp::GradMonitor mon(tp::Options()
                          .set("task", "grad_probe")
                          .dump_path(dir.path())
                          .set("grad_level", "L2")
                          .set("bounds", json::array()));
  mon.monitor(m);
  mon.step();
  const auto rows = read_csv(dir.path() + "/rank0/grad_summary_0.csv");
  // msprobe writes the header without the interval column (one column short of the rows).
  CHECK(rows[0] == std::vector<std::string>{"param_name", "(-inf, inf)", "=0", "max", "min", "norm", "shape"});
  // norm: sqrt(14) rounded to float32, the precision msprobe reports every statistic in.
  CHECK(rows[1] == std::vector<std::string>{"w", "1.0", "0.25", "3.0", "-2.0", "3.7416574954986572", "[4]"});
}

TEST_CASE("an fp16 gradient's norm is exact (msprobe's fp16 norm overflows to inf)") {
  tptest::TempDir dir;
  torch::nn::Module m;
  m.register_parameter("h", torch::zeros({4, 300}, torch::kHalf)).mutable_grad() =
      torch::full({4, 300}, 100.0, torch::kHalf);
  tp::GradMonitor mon(tp::Options().set("task", "grad_probe").dump_path(dir.path()).set("grad_level", "L0"));
  mon.monitor(m);
  mon.step();
  const auto rows = read_csv(dir.path() + "/rank0/grad_summary_0.csv");
  // msprobe takes torch.norm of the fp16 gradient itself: inf where that accumulates in fp16 (libtorch
  // 1.13's CPU kernel); libtorch 2.x accumulates in fp32. TorchProbe's is exact on every version.
  MESSAGE("this libtorch's fp16 norm: " << torch::full({4, 300}, 100.0, torch::kHalf).norm().item<float>());
  CHECK(std::stod(rows[1][4]) == static_cast<double>(static_cast<float>(100.0 * std::sqrt(1200.0))));
  // MD5 column: CRC-32 of the float32-cast bytes, as msprobe (Python's zlib on the same bytes).
  const std::string py =
      tptest::run_python("import zlib, struct\nprint('%08x' % zlib.crc32(struct.pack('<1200f', *([100.0] * 1200))))\n");
  CHECK(rows[1][1] + "\n" == py);
}

TEST_CASE("steps are this monitor's own step() calls; the rank is read at each step and filters by rank") {
  tptest::TempDir dir;
  torch::nn::Module m;
  m.register_parameter("w", torch::zeros({2})).mutable_grad() = torch::ones({2});
  tp::GradMonitor mon(
      tp::Options().set("task", "grad_probe").dump_path(dir.path()).step({1, 2}).rank({1}).set("grad_level", "L0"));
  mon.monitor(m);
  ::unsetenv("RANK");
  mon.step();  // step 0: not selected
  ::setenv("RANK", "1", 1);
  mon.step();  // step 1, rank 1
  ::setenv("RANK", "0", 1);
  mon.step();  // step 2, rank 0: not in rank [1]
  ::unsetenv("RANK");
  CHECK(mon.current_step() == 2);
  CHECK_FALSE(fs::exists(dir.path() + "/rank0"));
  CHECK_FALSE(fs::exists(dir.path() + "/rank1/grad_summary_0.csv"));
  CHECK(fs::exists(dir.path() + "/rank1/grad_summary_1.csv"));
  CHECK_FALSE(fs::exists(dir.path() + "/rank1/grad_summary_2.csv"));
}

TEST_CASE("signs are written beside the bool file: -1, 0, +1 as int8, NaN as 0") {
  tptest::TempDir dir;
  torch::nn::Module m;
  m.register_parameter("w", torch::zeros({2, 2})).mutable_grad() = torch::tensor({{-2.0f, 0.0f}, {3.0f, NAN}});
  tp::GradMonitor mon(tp::Options().set("task", "grad_probe").dump_path(dir.path()));
  mon.write_signs().monitor(m);
  mon.step();
  const std::string sign = tptest::read_text(dir.path() + "/rank0/sign/step0/w.npy");
  CHECK(sign.find("'descr': '|i1', 'fortran_order': False, 'shape': (2, 2), }") != std::string::npos);
  CHECK(sign.substr(128) == std::string("\xff\0\1\0", 4));
  CHECK(tptest::read_text(dir.path() + "/rank0/step0/w.npy").substr(128) == std::string("\0\0\1\0", 4));
}

TEST_CASE("a failure while recording goes to dump_error_info.log and training goes on") {
  tptest::TempDir dir;
  fs::create_directories(dir.path() + "/rank0");
  std::ofstream(dir.path() + "/rank0/step0") << "a file where the step directory should be";
  torch::nn::Module m;
  m.register_parameter("w", torch::zeros({2})).mutable_grad() = torch::ones({2});
  tp::GradMonitor mon(tp::Options().set("task", "grad_probe").dump_path(dir.path()));
  mon.monitor(m);
  CHECK_NOTHROW(mon.step());
  CHECK(mon.current_step() == 0);
  const std::string log = tptest::read_text(dir.path() + "/rank0/dump_error_info.log");
  CHECK(log.find("grad_probe_step failed: name=step0") != std::string::npos);
  CHECK(log.find("step0") != std::string::npos);
}

TEST_CASE("the CPU scan, ATen with bucketize and the device way (counts of x <= b) give the same summary") {
  using Mode = tp::grad_probe::GradStatsComputer::CpuMode;
  torch::manual_seed(7);
  at::Tensor g = torch::randn({1000}).mul(2).round().div(4);  // many values exactly on bounds
  const std::vector<tp::GradBound> bounds{{-1.0, "-1"}, {-0.25, "-0.25"}, {0.0, "0"}, {0.5, "0.5"}, {1.0, "1"}};
  for (const bool with_nan : {false, true}) {
    CAPTURE(with_nan);
    if (with_nan) g.index_put_({torch::arange(0, 1000, 97)}, NAN);
    std::vector<tp::grad_probe::GradSummary> got;
    for (const Mode mode : {Mode::Scan, Mode::Torch, Mode::TorchByComparison}) {
      tp::grad_probe::GradStatsComputer c(tp::GradLevel::L2, bounds, true);
      c.cpu_mode(mode);
      got.push_back(c.compute({{"g", g}})[0]);
    }
    // Independent count: interval i holds b[i-1] < x <= b[i]; NaN in the last.
    std::vector<std::int64_t> expected(bounds.size() + 1, 0);
    for (int64_t i = 0; i < g.numel(); ++i) {
      const float v = g[i].item<float>();
      std::size_t k = 0;
      while (k < bounds.size() && !(v <= static_cast<float>(bounds[k].value))) ++k;
      ++expected[k];
    }
    const double norm = static_cast<float>(g.to(torch::kDouble).norm().item<double>());
    for (const auto& s : got) {
      CHECK(s.buckets == expected);
      CHECK(s.zeros == (g == 0).sum().item<int64_t>());
      CHECK(s.direction == got[0].direction);
      CHECK(s.sign == got[0].sign);
      if (with_nan) {
        CHECK((std::isnan(s.max) && std::isnan(s.min) && std::isnan(s.norm)));
      } else {
        CHECK(s.max == g.max().item<double>());
        CHECK(s.min == g.min().item<double>());
        CHECK(s.norm == doctest::Approx(norm).epsilon(1e-7));
      }
    }
  }
}

TEST_CASE(
    "a second run into the same dump_path: grad-compare reads only its steps and parameters, not the stale ones") {
  tptest::TempDir dir;
  const std::string x = dir.path() + "/x", y = dir.path() + "/y";
  torch::nn::Module m;
  m.register_parameter("w", torch::zeros({4})).mutable_grad() = torch::tensor({1.0f, -1.0f, 1.0f, -1.0f});
  m.register_parameter("v", torch::zeros({2})).mutable_grad() = torch::ones({2});
  auto run = [&](const std::string& path, int steps, std::vector<std::string> params = {}) {
    tp::Options o = tp::Options().set("task", "grad_probe").dump_path(path);
    if (!params.empty()) o.set("param_list", params);
    tp::GradMonitor mon(o);
    mon.monitor(m);
    for (int s = 0; s < steps; ++s) mon.step();
    return mon.run_id();
  };
  const std::string first = run(x, 3);  // x: steps 0-2 of w and v ...
  run(y, 3);
  m.named_parameters()["w"].mutable_grad() = torch::ones({4});
  const std::string second = run(x, 1, {"w"});  // ... then one step of w only, into the same place
  CHECK(first != second);
  std::vector<std::string> lines;
  std::istringstream manifest(tptest::read_text(x + "/rank0/grad_probe_run.jsonl"));
  for (std::string l; std::getline(manifest, l);) lines.push_back(l);
  REQUIRE(lines.size() == 2);
  CHECK(json::parse(lines[0])["run_id"] == second);
  CHECK(json::parse(lines[1]) == json{{"step", 0}, {"params", {"w"}}});

  // Only step 0's w of x is this run's: 2 of 4 directions agree with y; v was not written (reported).
  std::ostringstream out, err;
  CHECK(tp::compare::grad::run_grad_compare({x, y, "-o", dir.path() + "/o"}, out, err) == 1);
  CHECK(tptest::read_text(dir.path() + "/o/rank0/similarities.csv") ==
        "\xEF\xBB\xBFstep,0\r\nw,0.5\r\nv,\r\nsummary,0.5\r\n");
  CHECK(out.str().find("ignored: rank0: run A: 5 file(s) of an earlier run") != std::string::npos);
  CHECK(err.str().find("missing: rank0: v: no file in step0 of run A") != std::string::npos);
  // Without the manifest it is msprobe's comparison: the stale steps and v's stale file count as data.
  fs::remove(x + "/rank0/grad_probe_run.jsonl");
  CHECK(tp::compare::grad::run_grad_compare({x, y, "-o", dir.path() + "/p"}, out, err) == 0);
  CHECK(tptest::read_text(dir.path() + "/p/rank0/similarities.csv") ==
        "\xEF\xBB\xBFstep,0,1,2\r\nw,0.5,1.0,1.0\r\nv,1.0,1.0,1.0\r\nsummary,0.6666666666666666,1.0,1.0\r\n");
}

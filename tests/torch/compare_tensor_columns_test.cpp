// msprobe's tensor-mode columns of compare_result_*.csv (Cosine, EucDist, MaxAbsErr, MaxRelativeErr,
// One Thousandth / Five Thousandths Err Ratio, Data_name), computed from the .pt files: values
// worked out by hand for tiny tensors and msprobe's special cases, the .pt reading, and whole CSVs
// of msprobe's Python tensor dump and of TorchProbe's own, checked against float64 ATen in the test
// and against python3's torch reading the same files.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <cfloat>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "torchprobe/analysis/compare/cli.hpp"
#include "torchprobe/analysis/compare/tensor_metrics.hpp"
#include "test_support.hpp"

namespace tensor_columns_test {

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Cells = tp::compare::TensorCells;

const fs::path kRef = TORCHPROBE_REFERENCE_DUMPS;

Cells cells(const torch::Tensor& n, const torch::Tensor& b) { return tp::compare::tensor_cells(n, b); }
torch::Tensor f64(std::vector<double> v) { return torch::tensor(v, torch::kDouble); }
torch::Tensor f32(std::vector<float> v) { return torch::tensor(v, torch::kFloat); }

void write_pt(const fs::path& path, const torch::Tensor& t) {
  const std::vector<char> bytes = torch::pickle_save(t);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// RFC-4180 reading of the CSV, independent of the writer.
std::vector<std::vector<std::string>> read_csv(const fs::path& file) {
  const std::string text = tptest::read_text(file.string());
  std::vector<std::vector<std::string>> rows(1, std::vector<std::string>(1));
  bool quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted && c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
      rows.back().back() += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (!quoted && c == ',') {
      rows.back().emplace_back();
    } else if (!quoted && c == '\n') {
      rows.emplace_back(1);
    } else {
      rows.back().back() += c;
    }
  }
  if (rows.back().size() == 1 && rows.back()[0].empty()) rows.pop_back();
  return rows;
}

struct Csv {
  int status = -1;
  std::string log;
  std::vector<std::string> header;
  std::vector<std::map<std::string, std::string>> rows;  // column name -> cell
};

Csv compare(const fs::path& target, const fs::path& bench, const fs::path& out) {
  tp::compare::CompareOptions o;
  o.target = target;
  o.bench = bench;
  o.out = out;
  o.timestamp = "20260101000000";
  o.pt_cells = [](const fs::path& n, const fs::path& b) { return tp::compare::pt_tensor_cells(n, b); };
  std::ostringstream log;
  Csv c;
  c.status = tp::compare::run_compare(o, log);
  c.log = log.str();
  const fs::path file = out / "compare_result_20260101000000.csv";
  if (!fs::exists(file)) return c;
  const auto table = read_csv(file);
  c.header = table.at(0);
  for (std::size_t i = 1; i < table.size(); ++i) {
    REQUIRE(table[i].size() == c.header.size());
    std::map<std::string, std::string> row;
    for (std::size_t k = 0; k < c.header.size(); ++k) row[c.header[k]] = table[i][k];
    c.rows.push_back(row);
  }
  return c;
}

const char* const kMetrics[6] = {
    "Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio", "Five Thousandths Err Ratio"};

// The metrics of two finite tensors of one shape, written directly with ATen: float64 for the
// cosine and the distances; the relative error in float32 for float32 data, as numpy's
// result_type(n, b, float32) makes it, with float32's epsilon added where the bench is 0.
std::array<double, 6> aten_reference(const torch::Tensor& n, const torch::Tensor& b) {
  const auto nd = n.to(torch::kDouble).flatten(), bd = b.to(torch::kDouble).flatten();
  const double cos = (nd * bd).sum().item<double>() / (nd.norm().item<double>() * bd.norm().item<double>());
  const double euc = (nd - bd).norm().item<double>();
  const double max_abs = (nd - bd).abs().max().item<double>();
  const auto zero = b.flatten() == 0;
  const auto nf = torch::where(zero, n.flatten() + FLT_EPSILON, n.flatten());
  const auto bf = torch::where(zero, b.flatten() + FLT_EPSILON, b.flatten());
  const auto rel = ((nf - bf) / bf).abs();
  const double count = static_cast<double>(rel.numel()), r1 = (rel < 0.001f).sum().item<double>() / count;
  return {cos, euc, max_abs, rel.max().item<double>(), r1, (rel < 0.005f).sum().item<double>() / count};
}

double number(const std::string& cell) {
  std::size_t used = 0;
  const double v = std::stod(cell, &used);
  REQUIRE(used == cell.size());
  return v;
}

// A CSV row's six metrics against the ATen reference of its two .pt files: 12 decimals as msprobe
// writes them (6 for a cosine above 0.9999), EucDist to float64 rounding.
void check_against_aten(const std::map<std::string, std::string>& row, const fs::path& tdir, const fs::path& bdir) {
  const std::string names = row.at("Data_name");  // ['npu.pt', 'bench.pt']
  const auto q = names.find("', '");
  const auto n = tp::compare::read_pt_values(tdir / names.substr(2, q - 2));
  const auto b = tp::compare::read_pt_values(bdir / names.substr(q + 4, names.size() - q - 6));
  CAPTURE(row.at("NPU Name"));
  if (n.dim() == 0) {  // 0-d: msprobe computes only the two maximum errors
    CHECK(row.at("Cosine") == "unsupported");
    CHECK(number(row.at("MaxAbsErr")) == doctest::Approx((n - b).abs().item<double>()).epsilon(1e-12));
    return;
  }
  const auto ref = aten_reference(n, b);
  const double cos = number(row.at("Cosine"));
  CHECK(std::abs(cos - ref[0]) <= (ref[0] > 0.9999 ? 5e-7 : 5e-12));
  CHECK(number(row.at("EucDist")) == doctest::Approx(ref[1]).epsilon(1e-12));
  for (int k = 2; k < 6; ++k) CHECK(std::abs(number(row.at(kMetrics[k])) - ref[k]) <= 5e-13 * (1 + ref[k]));
}

}  // namespace tensor_columns_test

using namespace tensor_columns_test;

TEST_CASE("msprobe's tensor metrics of tiny tensors are the values worked out by hand") {
  // cos = 24/25, EucDist = sqrt(2), relative errors 1/4 and 1/3 (12 decimals), none under 0.001
  CHECK(cells(f64({3, 4}), f64({4, 3})) == Cells{"0.96", "1.4142135623730951", "1.0", "0.333333333333", "0.0", "0.0"});
  CHECK(cells(f32({1, 2, 3, 4}), f32({1, 2, 3, 4})) == Cells{"1.0", "0.0", "0.0", "0.0", "1.0", "1.0"});
  // cos = 1/sqrt(1.0001) = 0.99995000375 > 0.9999: rounded to 6 decimals
  CHECK(cells(f64({1, 0}), f64({1, 0.01})) == Cells{"0.99995", "0.01", "0.01", "1.0", "0.5", "0.5"});
  // both all zero: cosine 1.0; a zero bench element adds epsilon on both sides (relative error 0)
  CHECK(cells(f32({0, 0}), f32({0, 0})) == Cells{"1.0", "0.0", "0.0", "0.0", "1.0", "1.0"});
  // one side all zero: "Nan"
  CHECK(cells(f32({0, 0}), f32({1, 0})) == Cells{"Nan", "1.0", "1.0", "1.0", "0.5", "0.5"});
  // bool: cos = 2 / (sqrt(2) sqrt(3)) = 0.816496580928 (12 decimals)
  const auto t = torch::tensor({true, false, true}), all = torch::tensor({true, true, true});
  CHECK(cells(t, all) == Cells{"0.816496580928", "1.0", "1.0", "1.0", "0.666666666667", "0.666666666667"});
}

TEST_CASE("msprobe's special cases: shapes, empty and 0-d tensors, inf and nan") {
  Cells s;
  s.fill("shape unmatched");
  CHECK(cells(f32({1, 2}), f32({1, 2, 3})) == s);
  s.fill("unsupported");
  CHECK(cells(torch::zeros({0}), torch::zeros({0})) == s);
  // 0-d: only the two maximum errors, in the tensors' own float32: (2 - 1.5) / 1.5 is float32's
  // 0.3333333432674408, 0.333333343267 to 12 decimals
  CHECK(cells(torch::tensor(2.0f), torch::tensor(1.5f)) ==
        Cells{"unsupported", "unsupported", "0.5", "0.333333343267", "unsupported", "unsupported"});
  // ... and integers subtract as integers: |5 - 3| = 2, relative 2/3 in float64
  CHECK(cells(torch::tensor(5L), torch::tensor(3L)) ==
        Cells{"unsupported", "unsupported", "2.0", "0.666666666667", "unsupported", "unsupported"});
  // inf/nan at the same places are zeroed (the sign of inf not compared): [0, 1, 0] vs [0, 2, 0]
  const float inf = INFINITY, nan = NAN;
  CHECK(cells(f32({inf, 1, nan}), f32({-inf, 2, nan})) ==
        Cells{"1.0", "1.0", "1.0", "0.5", "0.666666666667", "0.666666666667"});
  s.fill("N/A");  // at different places: no metric
  CHECK(cells(f32({inf, 1}), f32({1, 1})) == s);
  CHECK(cells(f32({1, nan}), f32({1, inf})) == s);
}

TEST_CASE("a .pt file is read as msprobe reads it: squeezed, bfloat16 as float32; an unreadable one is unsupported") {
  tptest::TempDir tmp;
  const fs::path a = tmp / "a.pt", b = tmp / "b.pt", bad = tmp / "bad.pt";
  write_pt(a, torch::tensor({1.0f, 2.0f, 3.0f}, torch::kBFloat16).reshape({1, 3, 1}));
  write_pt(b, torch::tensor({4.0}, torch::kDouble).reshape({1, 1}));
  std::ofstream(bad) << "not a zip";
  const auto va = tp::compare::read_pt_values(a);
  CHECK((va.sizes() == torch::IntArrayRef{3}));
  CHECK((va.scalar_type() == torch::kFloat));
  CHECK(tp::compare::read_pt_values(b).dim() == 0);  // [1, 1] squeezes to 0-d
  std::string error;
  Cells s;
  s.fill("unsupported");
  CHECK(tp::compare::pt_tensor_cells(a, bad, &error) == s);
  CHECK(error.find(bad.string()) != std::string::npos);
}

TEST_CASE("the tensor-mode CSV of msprobe's Python tensor dumps (step0 vs step1) has msprobe's columns and values") {
  const fs::path t = kRef / "tensor_mix/step0/proc10275", b = kRef / "tensor_mix/step1/proc10275";
  REQUIRE_MESSAGE(fs::exists(t / "dump.json"), "no reference dumps at " << kRef);
  tptest::TempDir tmp;
  const Csv c = compare(t / "dump.json", b / "dump.json", tmp / "out");
  INFO(c.log);
  REQUIRE(c.status >= 0);
  REQUIRE(c.status < 2);
  // msprobe's COMPARE_RESULT_HEADER + NPU_Stack_Info (a stack.json is there) + Data_name
  std::string header;
  for (const auto& h : c.header) header += (header.empty() ? "" : ",") + h;
  CHECK(header ==
        "NPU Name,Bench Name,NPU Dtype,Bench Dtype,NPU Tensor Shape,Bench Tensor Shape,NPU Requires_grad,"
        "Bench Requires_grad,Cosine,EucDist,MaxAbsErr,MaxRelativeErr,One Thousandth Err Ratio,Five Thousandths Err "
        "Ratio,NPU max,NPU min,NPU mean,NPU l2norm,Bench max,Bench min,Bench mean,Bench l2norm,Requires_grad "
        "Consistent,Result,Err_message,NPU_Stack_Info,Data_name");
  REQUIRE(c.rows.size() == 24);  // one per .pt file of the step
  int checked = 0, same = 0;
  for (const auto& row : c.rows) {
    CHECK(row.at("Data_name") == "['" + row.at("NPU Name") + ".pt', '" + row.at("Bench Name") + ".pt']");
    check_against_aten(row, t / "dump_tensor_data", b / "dump_tensor_data");
    ++checked;
    // the weight and bias do not change between the steps (no optimizer): identical files
    if (row.at("NPU Name").find(".parameters.") != std::string::npos) {
      ++same;
      CHECK(row.at("Cosine") == "1.0");
      CHECK(row.at("MaxAbsErr") == "0.0");
      CHECK(row.at("One Thousandth Err Ratio") == "1.0");
    }
  }
  CHECK(checked == 24);
  CHECK(same == 2);
}

TEST_CASE("python3's torch reading the same .pt files computes the same tensor-mode cells") {
  const fs::path t = kRef / "tensor_mix/step0/proc10275", b = kRef / "tensor_mix/step1/proc10275";
  REQUIRE_MESSAGE(fs::exists(t / "dump.json"), "no reference dumps at " << kRef);
  // msprobe's formulas (npy_compare.py) with torch tensors in place of numpy arrays, and Python's
  // own float formatting and round(), for the non-0-d float32 files.
  const std::string script = R"PY(
import json, os, torch
t, b = )PY" + std::string("'") +
                             (t / "dump_tensor_data").string() + "', '" + (b / "dump_tensor_data").string() +
                             R"PY('
fmt = lambda v: float('{:.12f}'.format(v))
out = {}
for name in sorted(os.listdir(t)):
    n, g = torch.load(os.path.join(t, name)).squeeze(), torch.load(os.path.join(b, name)).squeeze()
    if n.dim() == 0:
        continue
    z = g == 0
    eps = torch.finfo(torch.float32).eps
    x, y = n.clone(), g.clone()
    x[z] += eps
    y[z] += eps
    rel = ((x - y) / y).abs()
    nd, gd = n.double().flatten(), g.double().flatten()
    cos = fmt(float(torch.dot(nd, gd) / (nd.norm() * gd.norm())))
    cos = round(cos, 6) if cos > 0.9999 else cos
    out[name] = [str(cos), str(float((nd - gd).norm())), str(fmt(float((nd - gd).abs().max()))),
                 str(fmt(float(rel.max()))), str(fmt(float((rel < 0.001).sum()) / rel.numel())),
                 str(fmt(float((rel < 0.005).sum()) / rel.numel()))]
print(json.dumps(out))
)PY";
  int rc = -1;
  const std::string text = tptest::run_python(script, &rc);
  INFO(text);
  REQUIRE(rc == 0);
  const auto expected = nlohmann::json::parse(text.substr(text.find('{')));
  REQUIRE(expected.size() >= 18);
  for (auto it = expected.begin(); it != expected.end(); ++it) {
    CAPTURE(it.key());
    const Cells ours =
        tp::compare::pt_tensor_cells(t / "dump_tensor_data" / it.key(), b / "dump_tensor_data" / it.key());
    const auto& theirs = it.value();
    CHECK(ours[0] == theirs[0].get<std::string>());
    CHECK(number(ours[1]) == doctest::Approx(number(theirs[1].get<std::string>())).epsilon(1e-13));
    for (int k = 2; k < 6; ++k) CHECK(ours[k] == theirs[k].get<std::string>());
  }
}

namespace tensor_columns_test {

// TorchProbe's own tensor dump of msprobe's reference model, one step; returns the rank directory.
fs::path dump_net(const std::string& root) {
  {
    tp::Debugger<tp::Level::Mix, tp::Task::Tensor> dbg(tp::Options().dump_path(root));
    torch::manual_seed(1234);
    tptest::Net net;
    const auto x = torch::randn({2, 8}, torch::requires_grad());
    {
      tp::ScopedDump scope(dbg, net);
      net->forward(x).sum().backward();
    }
    dbg.step();
  }  // the files are complete once the debugger is gone
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.path().filename() == "dump.json") return e.path().parent_path();
  FAIL("no dump.json under " << root);
  return {};
}

}  // namespace tensor_columns_test

TEST_CASE("a TorchProbe tensor dump against itself is cosine 1 and error 0; a planted change shows in its row only") {
  tptest::TempDir tmp;
  const fs::path a = dump_net(tmp / "a");
  const Csv same = compare(a, a, tmp / "same");
  INFO(same.log);
  CHECK(same.status == 0);
  REQUIRE(same.rows.size() > 10);
  for (const auto& row : same.rows) {
    CAPTURE(row.at("NPU Name"));
    CHECK(row.at("Result") == "pass");
    if (row.at("Data_name").find("'-1'") != std::string::npos) {  // a scalar argument: no file
      CHECK(row.at("Cosine") == "unsupported");
      continue;
    }
    const bool scalar = row.at("NPU Tensor Shape") == "[]" || row.at("NPU Tensor Shape") == "[1]";
    CHECK(row.at("Cosine") == (scalar ? "unsupported" : "1.0"));
    CHECK(row.at("MaxAbsErr") == "0.0");
    CHECK(row.at("MaxRelativeErr") == "0.0");
    if (!scalar) CHECK(row.at("Five Thousandths Err Ratio") == "1.0");
  }

  // B = A with the output of the Linear's addmm negated: that row is cosine -1, relative error 2
  // everywhere, MaxAbsErr twice the largest |y|; its inputs stay identical, so msprobe's
  // OneThousandth rule (inputs > 0.9, output < 0.1) and CosineWarn rule (drop > 0.1) fire.
  const fs::path b = tmp / "b";
  fs::copy(a, b, fs::copy_options::recursive);
  const auto dump = tptest::read_json((b / "dump.json").string());
  std::string addmm;
  for (auto it = dump["data"].begin(); it != dump["data"].end(); ++it)
    if (addmm.empty() && it.key().rfind("Aten.addmm.", 0) == 0 && it.key().find("forward") != std::string::npos)
      addmm = it.key();
  REQUIRE(!addmm.empty());
  const std::string file = dump["data"][addmm]["output"][0]["data_name"].get<std::string>();
  const auto y = tp::compare::read_pt_values(a / "dump_tensor_data" / file);
  REQUIRE(y.ne(0).all().item<bool>());
  write_pt(b / "dump_tensor_data" / file, -y);
  const Csv planted = compare(b, a, tmp / "planted");
  INFO(planted.log);
  int changed = 0;
  for (const auto& row : planted.rows) {
    CAPTURE(row.at("NPU Name"));
    if (row.at("NPU Name") != addmm + ".output.0") {
      if (row.at("Data_name").find("'-1'") == std::string::npos) CHECK(row.at("MaxAbsErr") == "0.0");
      continue;
    }
    ++changed;
    CHECK(row.at("Cosine") == "-1.0");
    CHECK(number(row.at("MaxAbsErr")) == doctest::Approx(2 * y.abs().max().item<double>()).epsilon(1e-12));
    CHECK(row.at("MaxRelativeErr") == "2.0");
    CHECK(row.at("One Thousandth Err Ratio") == "0.0");
    CHECK(row.at("Five Thousandths Err Ratio") == "0.0");
    CHECK(row.at("Result") == "error");
    CHECK(row.at("Err_message") ==
          "[\"error: The input/parameters of One Thousandth Err Ratio > 0.9 while the output < 0.6.\", \"warning: The "
          "input/parameters of Cosine > 0.9, and input/parameters - output > 0.1\"]");
    check_against_aten(row, b / "dump_tensor_data", a / "dump_tensor_data");
  }
  CHECK(changed == 1);

  // Against msprobe's Python dump of the same model: the C++ side's Aten rows have no partner by
  // name (N/A: no metric), the module rows pair by name and carry both file names.
  const fs::path py = kRef / "tensor_mix/step0/proc10275";
  REQUIRE_MESSAGE(fs::exists(py / "dump.json"), "no reference dumps at " << kRef);
  const Csv mixed = compare(a, py, tmp / "mixed");
  INFO(mixed.log);
  int unmatched = 0, paired = 0;
  for (const auto& row : mixed.rows) {
    CAPTURE(row.at("NPU Name"));
    const std::string npu_file = "['" + row.at("NPU Name") + ".pt', ";
    if (row.at("Bench Name") == "N/A") {
      ++unmatched;
      const bool scalar = row.at("Data_name") == "['-1', 'N/A']";  // a scalar argument has no file
      CHECK((scalar || row.at("Data_name") == npu_file + "'N/A']"));
      CHECK(row.at("Cosine") == "unsupported");
      CHECK(row.at("MaxAbsErr") == "unsupported");
    } else {
      ++paired;
      CHECK(row.at("Data_name") == npu_file + "'" + row.at("Bench Name") + ".pt']");
      check_against_aten(row, a / "dump_tensor_data", py / "dump_tensor_data");
    }
  }
  CHECK(unmatched > 0);
  CHECK(paired > 0);
}

// torchprobe compare's compare_result_*.csv against msprobe's: the reference CSV that msprobe 26.0
// wrote for stat_mix step0 vs step1 (../shared/reference-dumps/compare_stat), the md5 mode, and
// the Python/pandas text rules the cells depend on.
#include <doctest/doctest.h>
#include "../skip.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "compare_support.hpp"
#include "torchprobe/analysis/compare/cli.hpp"

namespace {
namespace fs = std::filesystem;
using namespace torchprobe::compare;

const fs::path kRef = TORCHPROBE_REFERENCE_DUMPS;

// RFC-4180 reader (quoted fields, doubled quotes), independent of the writer under test.
std::vector<std::vector<std::string>> read_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows(1, std::vector<std::string>(1));
  bool quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        rows.back().back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        rows.back().back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      rows.back().emplace_back();
    } else if (c == '\n') {
      rows.emplace_back(1);
    } else {
      rows.back().back() += c;
    }
  }
  if (rows.back().size() == 1 && rows.back()[0].empty()) rows.pop_back();
  return rows;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Table table_of(const Dump& t, const Dump& b, RowSet& tr, RowSet& br) {
  tr = dump_rows(t);
  br = dump_rows(b);
  return msprobe_table(tr.rows, br.rows, t.has_md5 && b.has_md5 ? CsvMode::md5 : CsvMode::summary, t.has_stack_file);
}
}  // namespace

TEST_CASE("pandas re-parses the statistics with two roundings, which is why msprobe's Max diff ends in 456") {
  // Python: 1.8408576250076294 - 0.9859649538993835 == 0.8548926711082458; the reference CSV (and
  // pandas' precise_xstrtod: 17 digits in a double, then one division by 1e16) says ...456.
  const double x = pandas_parse("1.8408576250076294")->value, y = pandas_parse("0.9859649538993835")->value;
  CHECK(py_float_str(x - y) == "0.8548926711082456");
  CHECK(py_float_str(std::fabs((x - y) / y * 100)) == "86.70619252005243");
  CHECK(py_float_str(1.8408576250076294 - 0.9859649538993835) == "0.8548926711082458");
  CHECK(pandas_parse("12")->is_int);
  CHECK_FALSE(pandas_parse("1.0")->is_int);
  CHECK_FALSE(pandas_parse("None").has_value());
  CHECK(pandas_parse("1e-05")->value == doctest::Approx(1e-5));
}

TEST_CASE("cells are Python's str(): repr of strings and lists, floats, booleans") {
  CHECK(py_str_repr("it's") == "\"it's\"");
  CHECK(py_str_repr("a\nb") == "'a\\nb'");
  CHECK(py_str_repr("say \"x\" it's") == "'say \"x\" it\\'s'");
  CHECK(py_repr(nlohmann::ordered_json::parse(R"([1, 2.0, "a", true, null])")) == "[1, 2.0, 'a', True, None]");
  CHECK(py_float_str(1e16) == "1e+16");
  CHECK(py_float_str(0.0001) == "0.0001");
  CHECK(py_float_str(-INFINITY) == "-inf");
  CHECK(csv_field("[2, 8]") == "\"[2, 8]\"");
  CHECK(csv_field("[\"w\"]") == "\"[\"\"w\"\"]\"");
}

TEST_CASE("statistics differences follow msprobe's CalcStatsDiff rules for inf, nan, zero and text") {
  using nlohmann::ordered_json;
  CHECK(details::stat_diff(1.5, 1.5, false) == std::pair<std::string, std::string>{"0", "0"});
  CHECK(details::stat_diff(1.5, 0.0, false) == std::pair<std::string, std::string>{"1.5", "inf"});
  CHECK(details::stat_diff(1.0, 2.0, false) == std::pair<std::string, std::string>{"-1.0", "50.0%"});
  CHECK(details::stat_diff(INFINITY, 2.0, false) == std::pair<std::string, std::string>{"inf", "inf"});
  CHECK(details::stat_diff(2.0, INFINITY, false) == std::pair<std::string, std::string>{"-inf", "-inf"});
  CHECK(details::stat_diff("Nan", 2.0, false) == std::pair<std::string, std::string>{"Nan", "Nan"});
  CHECK(details::stat_diff("cpu", 2.0, false) == std::pair<std::string, std::string>{"Diff", "Diff"});
  CHECK(details::stat_diff(2.0, "N/A", false) == std::pair<std::string, std::string>{"N/A", "N/A"});
  CHECK(details::stat_diff(3, 1, true) == std::pair<std::string, std::string>{"2", "200.0%"});
}

TEST_CASE("the CSV of stat_mix step0 vs step1 equals msprobe's compare_stat, column by column") {
  const fs::path ref_csv = kRef / "compare_stat" / "compare_result_20261129065020.csv";
  REQUIRE_MESSAGE(fs::exists(ref_csv), "no reference dumps at " << kRef);
  const Dump t = load_dump(kRef / "stat_mix/step0/proc10163/dump.json");
  const Dump b = load_dump(kRef / "stat_mix/step1/proc10163/dump.json");
  RowSet tr, br;
  const Table table = table_of(t, b, tr, br);
  const auto ours = read_csv(table_csv(table));
  const auto ref = read_csv(slurp(ref_csv));
  REQUIRE(ours.size() == ref.size());
  REQUIRE(ours[0] == ref[0]);  // the header: 28 columns with NPU_Stack_Info
  CHECK(ref[0].size() == 28);
  for (std::size_t r = 1; r < ref.size(); ++r) {
    REQUIRE(ours[r].size() == ref[r].size());
    for (std::size_t c = 0; c < ref[r].size(); ++c) {
      INFO("row " << r << " (" << ref[r][0] << "), column " << ref[0][c]);
      CHECK(ours[r][c] == ref[r][c]);
    }
  }
  // and byte for byte, quoting included
  CHECK(table_csv(table) == slurp(ref_csv));
}

TEST_CASE("the CSV written while the table is made is msprobe's CSV byte for byte, in pieces of any size") {
  const fs::path ref_csv = kRef / "compare_stat" / "compare_result_20261129065020.csv";
  REQUIRE_MESSAGE(fs::exists(ref_csv), "no reference dumps at " << kRef);
  const Dump t = load_dump(kRef / "stat_mix/step0/proc10163/dump.json");
  const Dump b = load_dump(kRef / "stat_mix/step1/proc10163/dump.json");
  const RowSet trs = dump_rows(t), brs = dump_rows(b);
  const std::vector<Row>&tr = trs.rows, &br = brs.rows;
  for (const std::size_t chunk : {std::size_t{1}, std::size_t{100}, std::size_t{1} << 22}) {
    CAPTURE(chunk);
    std::string csv;
    std::size_t pieces = 0;
    msprobe_csv_chunks(
        tr, br, CsvMode::summary, t.has_stack_file, {},
        [&](std::string_view piece) {
          csv.append(piece);
          ++pieces;
        },
        chunk);
    CHECK(csv == slurp(ref_csv));
    CHECK(pieces >= (chunk == 1 ? tr.size() : 1));  // one piece a row when every row fills a piece
  }
  // md5 dumps: the same text as the whole table's
  REQUIRE_MESSAGE(fs::exists(kRef / "md5_mix"), "no md5 reference dumps at " << kRef);
  const Dump mt = load_dump(kRef / "md5_mix/step0/proc10270/dump.json");
  const Dump mb = load_dump(kRef / "md5_mix/step1/proc10270/dump.json");
  const RowSet mtrs = dump_rows(mt), mbrs = dump_rows(mb);
  const std::vector<Row>&mtr = mtrs.rows, &mbr = mbrs.rows;
  std::string streamed;
  msprobe_csv_chunks(mtr, mbr, CsvMode::md5, mt.has_stack_file, {}, [&](std::string_view p) { streamed.append(p); });
  CHECK(streamed == table_csv(msprobe_table(mtr, mbr, CsvMode::md5, mt.has_stack_file)));
  CHECK(streamed.find("error") != std::string::npos);  // a differing CRC-32 among its rows
}

TEST_CASE("md5 dumps give msprobe's md5 columns: CRC-32 equal is pass, different is error") {
  REQUIRE_MESSAGE(fs::exists(kRef / "md5_mix"), "no reference dumps at " << kRef);
  const Dump t = load_dump(kRef / "md5_mix/step0/proc10270/dump.json");
  const Dump b = load_dump(kRef / "md5_mix/step1/proc10270/dump.json");
  REQUIRE(t.has_md5);
  RowSet tr, br;
  const auto csv = read_csv(table_csv(table_of(t, b, tr, br)));
  const std::vector<std::string> header = {"NPU Name",
                                           "Bench Name",
                                           "NPU Dtype",
                                           "Bench Dtype",
                                           "NPU Tensor Shape",
                                           "Bench Tensor Shape",
                                           "NPU Requires_grad",
                                           "Bench Requires_grad",
                                           "NPU MD5",
                                           "BENCH MD5",
                                           "Requires_grad Consistent",
                                           "Result",
                                           "Err_message",
                                           "NPU_Stack_Info"};
  CHECK(csv[0] == header);
  // Expected verdicts straight from the two dump.json files.
  const auto md5_of = [](const Dump& d, const std::string& entry, const char* io, int i) {
    return d.data[entry][io][i]["md5"].get<std::string>();
  };
  int checked = 0;
  for (std::size_t r = 1; r < csv.size(); ++r) {
    const std::string& name = csv[r][0];
    for (const char* io : {"input_args", "output"}) {
      const std::string tag = std::string(".") + (io[0] == 'i' ? "input" : "output") + ".0";
      const auto pos = name.find(tag);
      if (pos == std::string::npos || pos + tag.size() != name.size()) continue;
      const std::string entry = name.substr(0, pos);
      if (!t.data.contains(entry) || !t.data[entry].contains(io)) continue;
      const bool same = md5_of(t, entry, io, 0) == md5_of(b, entry, io, 0);
      INFO(name);
      CHECK(csv[r][8] == md5_of(t, entry, io, 0));
      CHECK(csv[r][11] == (same ? "pass" : "error"));
      CHECK(csv[r][12] == (same ? "[]" : "[\"error: The CRC-32 value of NPU differs from that of the bench.\"]"));
      ++checked;
    }
  }
  CHECK(checked >= 8);
}

TEST_CASE("rows without a partner or with incomparable dtypes are N/A, with msprobe's verdicts") {
  using namespace tp_compare_test;
  Dir a, b;
  const Stats f{"torch.float32", {2}, 1.0, -1.0, 0.0, 1.4};
  a.add("Torch.add.0.forward", entry({f}, {f}));
  a.add("Torch.cat.0.forward", entry({f}, {f}));
  b.add("Torch.add.0.forward", entry({as_dtype(f, "torch.int64")}, {f}));
  const fs::path dir = temp_dir("na");
  const Dump t = load_dump(a.write(dir / "a")), g = load_dump(b.write(dir / "b"));
  RowSet tr, br;
  const auto csv = read_csv(table_csv(table_of(t, g, tr, br)));
  REQUIRE(csv.size() == 5);
  // float32 vs int64: msprobe blanks the bench side (Match.gen_dtype_condition)
  CHECK(csv[1][1] == "N/A");
  CHECK(csv[1][8] == "N/A");
  CHECK(csv[1][24] == "False");  // Requires_grad Consistent: True vs N/A
  CHECK(csv[2][1] == "Torch.add.0.forward.output.0");
  CHECK(csv[2][8] == "0");
  // an unmatched entry: N/A everywhere on the bench side; msprobe's verdict ends "pass", "[]"
  CHECK(csv[3][0] == "Torch.cat.0.forward.input.0");
  CHECK(csv[3][1] == "N/A");
  CHECK(csv[3][25] == "pass");
  CHECK(csv[3][26] == "[]");
  fs::remove_all(dir);
}

TEST_CASE("backward call numbers are recounted by order of appearance, as msprobe's update_backward_call does") {
  using namespace tp_compare_test;
  const Stats g{"torch.float32", {2}, 1.0, 0.0, 0.5, 1.0, false};
  const Stats h = scaled(g, 2.0);
  Json backward = entry({g}, {g});
  backward.erase("input_args");
  backward.erase("input_kwargs");
  backward["input"] = Json::array({tensor(g)});
  Json other = backward;
  other["output"] = Json::array({tensor(h)});
  Dir a, b;
  // recomputation numbered the target's calls 3, 5 and 7; the first has no tensors but still counts
  a.add("Functional.relu.3.backward", Json{{"input", Json::array()}, {"output", Json::array()}});
  a.add("Functional.relu.5.backward", backward);
  a.add("Module.fc.Linear.backward.7", other);
  b.add("Functional.relu.0.backward", other);
  b.add("Functional.relu.1.backward", backward);
  b.add("Module.fc.Linear.backward.0", other);
  const fs::path dir = temp_dir("renumber");
  const Dump t = load_dump(a.write(dir / "a")), d = load_dump(b.write(dir / "b"));
  RowSet tr, br;
  const auto csv = read_csv(table_csv(table_of(t, d, tr, br)));
  REQUIRE(csv.size() == 5);
  CHECK(csv[1][0] == "Functional.relu.5.backward.input.0");
  CHECK(csv[1][1] == "Functional.relu.1.backward.input.0");  // the second relu backward on both sides
  CHECK(csv[2][8] == "0");                                   // same output: not relu.0's
  CHECK(csv[3][0] == "Module.fc.Linear.backward.7.input.0");
  CHECK(csv[3][1] == "Module.fc.Linear.backward.0.input.0");
  fs::remove_all(dir);
}

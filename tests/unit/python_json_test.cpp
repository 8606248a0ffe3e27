// The Python-compatible JSON writer, checked against Python's own json module (the reference
// msprobe uses) and against real msprobe dump files.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchprobe/io/python_json.hpp"

#ifndef TORCHPROBE_PYTHON
#define TORCHPROBE_PYTHON "/usr/bin/python3"
#endif

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using torchprobe::io::python_float_repr;
using torchprobe::io::to_python_json;

namespace {

// `line` (one-line JSON text) laid out by JsonText::relayout with `indent`, as the value at `depth`.
std::string relayout(const std::string& line, int indent, int depth) {
  std::string out;
  {
    torchprobe::io::JsonText text(out, indent);
    text.relayout(line, depth);
  }
  return out;
}

// The same value written straight from its tree at `depth`.
std::string written_at(const ordered_json& j, int indent, int depth) {
  std::string out;
  {
    torchprobe::io::JsonText text(out, indent);
    torchprobe::io::details::write_tree(text, j, depth);
  }
  return out;
}

// A random JSON value of at most `depth` levels: strings full of the characters relayout() looks
// at (quotes, backslashes, braces, ", " and ": "), empty and nested containers, all number kinds.
ordered_json random_value(std::mt19937& rng, int depth) {
  static const std::vector<std::string> pieces = {"\"", "\\", "{", "}",  "[",      "]",    ", ",   ": ",
                                                  ",",  " ",  "a", "\n", "\u00e9", "\\\"", "}, {", "\"]"};
  std::uniform_int_distribution<int> kind(0, depth > 0 ? 9 : 5);
  switch (kind(rng)) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return static_cast<std::int64_t>(rng()) - (1LL << 31);
    case 3: return std::ldexp(static_cast<double>(rng()), static_cast<int>(rng() % 80) - 40);
    case 4:
    case 5: {
      std::string s;
      for (std::uint32_t n = rng() % 6; n > 0; --n) s += pieces[rng() % pieces.size()];
      return s;
    }
    case 6:
    case 7: {
      ordered_json a = ordered_json::array();
      for (std::uint32_t n = rng() % 4; n > 0; --n) a.push_back(random_value(rng, depth - 1));
      return a;
    }
    default: {
      ordered_json o = ordered_json::object();
      for (std::uint32_t n = rng() % 4; n > 0; --n) o[random_value(rng, 0).dump()] = random_value(rng, depth - 1);
      return o;
    }
  }
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_all(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

// A fresh directory under /tmp, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/tp_pyjson_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Runs `script` with Python, arguments are paths inside `dir`; fails the test if Python fails.
void run_python(const TempDir& dir, const std::string& script, const std::string& args) {
  const fs::path py = dir.path / "ref.py";
  write_all(py, script);
  const std::string cmd = std::string("'") + TORCHPROBE_PYTHON + "' '" + py.string() + "' " + args;
  const int rc = std::system(cmd.c_str());
  REQUIRE_MESSAGE(rc == 0, "python failed: " << cmd);
}

double from_bits(std::uint64_t b) {
  double d;
  std::memcpy(&d, &b, sizeof d);
  return d;
}
std::uint64_t to_bits(double d) {
  std::uint64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}

std::vector<double> interesting_doubles() {
  using L = std::numeric_limits<double>;
  std::vector<double> v = {0.0,
                           -0.0,
                           1.0,
                           -1.0,
                           0.5,
                           0.1,
                           0.2,
                           0.3,
                           1.0 / 3,
                           2.0 / 3,
                           100.0,
                           123456.789,
                           1e15,
                           1e16,
                           1e17,
                           9999999999999998.0,
                           999999999999999.9,
                           1e15 + 0.5,
                           1e-4,
                           1e-5,
                           0.0001,
                           0.00001,
                           0.00012345,
                           0.000012345,
                           1.5e-4,
                           9.999999e-5,
                           1e22,
                           1e23,
                           1e-7,
                           5e-324,
                           1e308,
                           1.7976931348623157e308,
                           L::max(),
                           -L::max(),
                           L::min(),
                           -L::min(),
                           L::denorm_min(),
                           -L::denorm_min(),
                           L::min() / 3,
                           L::epsilon(),
                           L::quiet_NaN(),
                           -L::quiet_NaN(),
                           L::infinity(),
                           -L::infinity(),
                           1.8408576250076294,
                           3.3215508210560074e-06,
                           static_cast<double>(3.4028e38f),
                           static_cast<double>(std::numeric_limits<float>::max()),
                           static_cast<double>(std::numeric_limits<float>::min()),
                           65504.0,
                           0.19921875,
                           static_cast<double>(0.1f),
                           4503599627370496.0,
                           9007199254740993.0};
  // Every power of ten in range, and its neighbours: these sit on the fixed/scientific switch and on
  // digit-count boundaries.
  for (int e = -324; e <= 308; ++e) {
    const double p = std::pow(10.0, e);
    if (p == 0.0 || std::isinf(p)) continue;
    v.push_back(p);
    v.push_back(std::nextafter(p, 0.0));
    v.push_back(std::nextafter(p, L::infinity()));
    v.push_back(-p);
  }
  std::mt19937_64 rng(20240611);
  for (int i = 0; i < 20000; ++i) v.push_back(from_bits(rng()));  // any bit pattern, NaN payloads too
  std::uniform_real_distribution<float> f(-10.f, 10.f);
  for (int i = 0; i < 5000; ++i) v.push_back(static_cast<double>(f(rng)));  // float32 stats, as dumped
  std::uniform_int_distribution<std::uint64_t> subnormal(1, (std::uint64_t{1} << 52) - 1);
  for (int i = 0; i < 2000; ++i) v.push_back(from_bits(subnormal(rng)));
  return v;
}

// Replaces Python's bare NaN / Infinity / -Infinity tokens (outside strings) by sentinel numbers so
// nlohmann (strict JSON) can parse msprobe files, and puts the real values back afterwards.
constexpr double kNanMark = 1.1e308, kInfMark = 1.2e308, kNegInfMark = 1.3e308;

std::string mark_non_finite(const std::string& s) {
  std::string out;
  bool in_str = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_str) {
      out.push_back(c);
      if (c == '\\') {
        out.push_back(s[++i]);
      } else if (c == '"') {
        in_str = false;
      }
      continue;
    }
    if (c == '"') in_str = true;
    if (s.compare(i, 9, "-Infinity") == 0) {
      out += "1.3e308", i += 8;
    } else if (s.compare(i, 8, "Infinity") == 0) {
      out += "1.2e308", i += 7;
    } else if (s.compare(i, 3, "NaN") == 0) {
      out += "1.1e308", i += 2;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

void unmark_non_finite(ordered_json& j) {
  if (j.is_structured()) {
    for (auto& item : j) unmark_non_finite(item);
  } else if (j.is_number_float()) {
    const double d = j.get<double>();
    if (d == kNanMark) j = std::numeric_limits<double>::quiet_NaN();
    if (d == kInfMark) j = std::numeric_limits<double>::infinity();
    if (d == kNegInfMark) j = -std::numeric_limits<double>::infinity();
  }
}

// The same for a document sent to Python through nlohmann::dump (which writes NaN as null).
ordered_json strings_for_non_finite(const ordered_json& j) {
  if (j.is_array() || j.is_object()) {
    ordered_json out = j;
    auto src = j.begin();
    for (auto dst = out.begin(); dst != out.end(); ++dst, ++src) *dst = strings_for_non_finite(*src);
    return out;
  }
  if (j.is_number_float()) {
    const double d = j.get<double>();
    if (std::isnan(d)) return "__nan__";
    if (std::isinf(d)) return d > 0 ? "__inf__" : "__-inf__";
  }
  return j;
}

fs::path msprobe_data_dir() {
#ifdef TORCHPROBE_TEST_DATA
  return fs::path(TORCHPROBE_TEST_DATA) / "reference-dumps";
#else
  return fs::path(__FILE__).parent_path().parent_path() / "data" / "reference-dumps";
#endif
}

}  // namespace

TEST_CASE("python_float_repr: documented examples") {
  CHECK(python_float_repr(1e-05) == "1e-05");
  CHECK(python_float_repr(1e16) == "1e+16");
  CHECK(python_float_repr(1e15) == "1000000000000000.0");
  CHECK(python_float_repr(0.0001) == "0.0001");
  CHECK(python_float_repr(3.3215508210560074e-06) == "3.3215508210560074e-06");
  CHECK(python_float_repr(1.8408576250076294) == "1.8408576250076294");
  CHECK(python_float_repr(-0.0) == "-0.0");
  CHECK(python_float_repr(0.0) == "0.0");
  CHECK(python_float_repr(2.0) == "2.0");
  CHECK(python_float_repr(1.5e300) == "1.5e+300");
  CHECK(python_float_repr(std::numeric_limits<double>::quiet_NaN()) == "NaN");
  CHECK(python_float_repr(std::numeric_limits<double>::infinity()) == "Infinity");
  CHECK(python_float_repr(-std::numeric_limits<double>::infinity()) == "-Infinity");
  CHECK(python_float_repr(5e-324) == "5e-324");
}

TEST_CASE("python_float_repr and float lists match Python's json.dumps") {
  const std::vector<double> values = interesting_doubles();
  TempDir dir;
  std::string bits;
  for (double d : values) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016llx\n", static_cast<unsigned long long>(to_bits(d)));
    bits += buf;
  }
  write_all(dir.path / "bits.txt", bits);
  run_python(dir, R"PY(
import json, struct, sys
d = sys.argv[1]
vals = [struct.unpack('<d', struct.pack('<Q', int(h, 16)))[0] for h in open(d + '/bits.txt').read().split()]
with open(d + '/each.txt', 'w') as f:
    for v in vals:
        f.write(json.dumps(v) + '\n')
with open(d + '/list.json', 'w') as f:
    json.dump(vals, f, indent=1)
)PY",
             "'" + dir.path.string() + "'");

  std::istringstream each(read_all(dir.path / "each.txt"));
  std::string expected;
  int mismatches = 0;
  for (double d : values) {
    REQUIRE(std::getline(each, expected));
    const std::string got = python_float_repr(d);
    if (got != expected && ++mismatches <= 10)
      FAIL_CHECK("bits " << std::hex << to_bits(d) << ": python " << expected << ", ours " << got);
  }
  CHECK(mismatches == 0);

  ordered_json list = ordered_json::array();
  for (double d : values) list.push_back(d);
  CHECK(to_python_json(list, 1) == read_all(dir.path / "list.json"));
}

TEST_CASE("nested document: byte-identical to json.dumps with indent 1, 0, 4 and None") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  ordered_json doc = ordered_json::object();
  doc["task"] = "statistics";
  doc["dump_data_dir"] = nullptr;
  doc["empty_list"] = ordered_json::array();
  doc["empty_obj"] = ordered_json::object();
  doc["nested_empty"] = ordered_json::array(
      {ordered_json::array(), ordered_json::object(), ordered_json::array({ordered_json::array()})});
  doc["ints"] =
      ordered_json::array({0, -1, 1, std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max(),
                           std::numeric_limits<std::uint64_t>::max(), std::uint64_t{1} << 63});
  doc["bools"] = ordered_json::array({true, false, nullptr});
  doc["floats"] = ordered_json::array({0.5, -0.0, 1e16, 1e-5, nan, inf, -inf, 1e15, 123.0});
  doc["unicode"] = "caf\u00e9 \u4e2d\u6587 \U0001F600 \uFFFF \U0010FFFF \u2028 \u007f end";
  std::string controls;
  for (int c = 0; c < 0x20; ++c) controls.push_back(static_cast<char>(c));
  controls += "\"\\/\x7f'";
  doc["controls"] = controls;
  doc[""] = "empty key";
  doc["k\u00e9y \U0001F600"] = ordered_json::object({{"\n", 1}, {"z", 2}, {"a", 3}});  // order kept
  ordered_json deep = "bottom";
  for (int i = 0; i < 30; ++i)
    deep = ordered_json::array({deep, i % 2 ? ordered_json::object({{"d", i}}) : ordered_json(i)});
  doc["deep"] = deep;
  doc["Functional.linear.0.forward"] = ordered_json::object(
      {{"input_args", ordered_json::array({ordered_json::object({{"type", "torch.Tensor"},
                                                                 {"dtype", "torch.float32"},
                                                                 {"shape", ordered_json::array({2, 8})},
                                                                 {"Max", 1.8408576250076294},
                                                                 {"Min", nullptr},
                                                                 {"requires_grad", true}})})},
       {"input_kwargs", ordered_json::object()}});

  TempDir dir;
  write_all(dir.path / "doc.json", strings_for_non_finite(doc).dump());
  run_python(dir, R"PY(
import json, sys
d = sys.argv[1]
marks = {'__nan__': float('nan'), '__inf__': float('inf'), '__-inf__': float('-inf')}
def fix(o):
    if isinstance(o, list): return [fix(x) for x in o]
    if isinstance(o, dict): return {k: fix(v) for k, v in o.items()}
    if isinstance(o, str) and o in marks: return marks[o]
    return o
doc = fix(json.load(open(d + '/doc.json', encoding='utf-8')))
for name, kw in [('i1', dict(indent=1)), ('i0', dict(indent=0)), ('i4', dict(indent=4)), ('none', {})]:
    with open(d + '/' + name + '.json', 'w') as f:
        json.dump(doc, f, **kw)
with open(d + '/sorted.json', 'w') as f:
    json.dump(json.load(open(d + '/doc.json', encoding='utf-8')), f, indent=1, sort_keys=True)
)PY",
             "'" + dir.path.string() + "'");

  CHECK(to_python_json(doc, 1) == read_all(dir.path / "i1.json"));
  CHECK(to_python_json(doc, 0) == read_all(dir.path / "i0.json"));
  CHECK(to_python_json(doc, 4) == read_all(dir.path / "i4.json"));
  CHECK(to_python_json(doc, -1) == read_all(dir.path / "none.json"));

  // The one-line text laid out again (how dump.json is made from the journal's lines) gives the
  // bytes of every indent, without a parse.
  const std::string line = to_python_json(doc, -1);
  CHECK(relayout(line, 1, 0) == read_all(dir.path / "i1.json"));
  CHECK(relayout(line, 0, 0) == read_all(dir.path / "i0.json"));
  CHECK(relayout(line, 4, 0) == read_all(dir.path / "i4.json"));
  CHECK(relayout(line, -1, 0) == line);

  std::ostringstream os;  // the stream writer gives the same bytes
  torchprobe::io::write_python_json(os, doc);
  CHECK(os.str() == read_all(dir.path / "i1.json"));

  // nlohmann::json keeps keys sorted by UTF-8 bytes, which is code point order = sort_keys=True.
  const auto unordered = nlohmann::json::parse(strings_for_non_finite(doc).dump());
  CHECK(to_python_json(unordered, 1) == read_all(dir.path / "sorted.json"));
}

TEST_CASE("scalars and malformed UTF-8") {
  CHECK(to_python_json(ordered_json(nullptr)) == "null");
  CHECK(to_python_json(ordered_json(true)) == "true");
  CHECK(to_python_json(ordered_json(-7)) == "-7");
  CHECK(to_python_json(ordered_json::array()) == "[]");
  CHECK(to_python_json(ordered_json::object()) == "{}");
  CHECK(to_python_json(ordered_json::array({1, 2}), -1) == "[1, 2]");
  CHECK(to_python_json(ordered_json::object({{"a", ordered_json::array({1})}}), 1) == "{\n \"a\": [\n  1\n ]\n}");
  // Not valid UTF-8 (Python strings never are): each bad byte becomes U+FFFD, the rest survives.
  CHECK(to_python_json(ordered_json("a\xff"
                                    "b\xe4\xb8"
                                    "c")) == "\"a\\ufffdb\\ufffd\\ufffdc\"");
  CHECK(to_python_json(ordered_json("\xc0\xaf")) == "\"\\ufffd\\ufffd\"");  // overlong '/'
}

TEST_CASE("real msprobe files re-dump byte-identically") {
  const fs::path root = msprobe_data_dir();
  REQUIRE(fs::is_directory(root));
  int files = 0;
  bool saw_stat_l1 = false;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file() || e.path().extension() != ".json") continue;
    if (e.path().parent_path().filename() == "configs") continue;  // written by people, not by msprobe
    const std::string original = read_all(e.path());
    const std::string marked = mark_non_finite(original);
    ordered_json j = ordered_json::parse(marked);
    unmark_non_finite(j);
    CAPTURE(e.path().string());
    CHECK(to_python_json(j, 1) == original);
    ++files;
    if (e.path().string().find("stat_L1/step0") != std::string::npos && e.path().filename() == "dump.json")
      saw_stat_l1 = true;
  }
  CHECK(saw_stat_l1);
  CHECK(files >= 7);
}

// Its speed is measured by benchmarks/json_benchmark.cpp (100k entries, against nlohmann's dump).
TEST_CASE("a dump of many entries reads back as the same document") {
  ordered_json data = ordered_json::object();
  for (int i = 0; i < 5000; ++i) {
    const ordered_json t = ordered_json::object({{"type", "torch.Tensor"},
                                                 {"dtype", "torch.float32"},
                                                 {"shape", ordered_json::array({2, 8})},
                                                 {"Max", 1.8408576250076294 * i},
                                                 {"Min", -2.1833977699279785 / (i + 1)},
                                                 {"Mean", -0.08326996862888336},
                                                 {"requires_grad", i % 2 == 0}});
    data["Aten.add." + std::to_string(i) + ".forward"] =
        ordered_json::object({{"input_args", ordered_json::array({t, t})}, {"output", ordered_json::array({t})}});
  }
  std::ostringstream os;
  torchprobe::io::write_python_json(os, data);
  // Every double survives the repr round trip exactly, and the key order is kept.
  const ordered_json back = ordered_json::parse(os.str());
  REQUIRE(back.size() == data.size());
  int differing = 0;
  std::string first;  // the first entry that differs, both ways, for the failure message
  for (auto a = back.cbegin(), b = data.cbegin(); b != data.cend(); ++a, ++b)
    if (a.key() != b.key() || a.value() != b.value())
      if (differing++ == 0) first = a.key() + ": " + a.value().dump() + "\nwant " + b.key() + ": " + b.value().dump();
  CHECK_MESSAGE(differing == 0, differing << " entries differ; the first: " << first);
}

TEST_CASE("one-line text laid out again is the text written at that indent and depth, for any value") {
  std::mt19937 rng(20261206);
  for (int i = 0; i < 2000; ++i) {
    const ordered_json v = random_value(rng, 4);
    const std::string line = to_python_json(v, -1);
    CAPTURE(line);
    for (const int indent : {1, 0, 2}) {
      CHECK(relayout(line, indent, 0) == to_python_json(v, indent));
      CHECK(relayout(line, indent, 2) == written_at(v, indent, 2));  // a body inside dump.json's "data"
    }
  }
  // The layout does not depend on reading a string's quotes wrongly: ", " and "{" inside strings stay.
  const ordered_json tricky = {{"a, \"b\": [", "}, {\\"}, {"", ordered_json::array({"\\", ordered_json::object()})}};
  CHECK(relayout(to_python_json(tricky, -1), 1, 0) == to_python_json(tricky, 1));
}

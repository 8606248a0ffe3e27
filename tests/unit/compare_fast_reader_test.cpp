// compare's fast reader (dump_rows_reader.hpp) makes the rows that load_dump + dump_rows make, field
// by field and value type by value type, on every dump.json of the tests and of the reference
// dumps; what it cannot read as it is (NaN, a repeated entry, invalid JSON, ...) it hands to
// load_dump, so that the result and the error messages stay load_dump's.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "../skip.hpp"
#include "torchprobe/analysis/compare/dump_rows_reader.hpp"
#include "torchprobe/analysis/compare/name_index.hpp"
#include "torchprobe/analysis/compare/text_store.hpp"

namespace compare_fast_reader_test {
namespace fs = std::filesystem;
using namespace torchprobe::compare;

// Every difference between two readings of one dump, as text (empty: the same).
std::string differences(const DumpRows& a, const DumpRows& b) {
  std::string out;
  const auto note = [&](const std::string& what) { out += what + "\n"; };
  if (a.dump.task != b.dump.task || a.dump.level != b.dump.level) note("task or level");
  if (a.dump.has_md5 != b.dump.has_md5) note("has_md5");
  if (a.dump.incomplete != b.dump.incomplete) note("incomplete");
  if (a.dump.data != b.dump.data) note("entry names");
  if (a.dump.stacks != b.dump.stacks || a.dump.has_stack_file != b.dump.has_stack_file) note("stacks");
  if (a.dump.parents != b.dump.parents) note("parents");
  if (a.rows.size() != b.rows.size())
    note("row count " + std::to_string(a.rows.size()) + " vs " + std::to_string(b.rows.size()));
  for (std::size_t i = 0; i < a.rows.size() && i < b.rows.size(); ++i) {
    const Row &x = a.rows[i], &y = b.rows[i];
    bool same = x.name == y.name && x.key == y.key && x.entry() == y.entry() && x.entry_key() == y.entry_key() &&
                x.entry_index() == y.entry_index() && x.place == y.place && x.dtype == y.dtype && x.shape == y.shape &&
                x.requires_grad == y.requires_grad && x.md5 == y.md5 && x.data_name() == y.data_name() &&
                x.stack() == y.stack();
    for (int s = 0; s < 4; ++s)  // dump(): the value and its type (1 unsigned, -1 integer, 1.0 float)
      same = same && x.stat(s).dump() == y.stat(s).dump() && x.stat(s).type() == y.stat(s).type();
    if (!same) note("row " + std::to_string(i) + " (" + std::string(x.name) + ")");
  }
  return out;
}

std::vector<fs::path> committed_dumps() {
  std::vector<fs::path> out;
  for (const fs::path& root : {fs::path(TORCHPROBE_TESTS_DIR) / "data", fs::path(TORCHPROBE_REFERENCE_DUMPS)}) {
    if (!fs::is_directory(root)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root))
      if (e.is_regular_file() && e.path().filename() == "dump.json") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// A dump.json of one entry whose first input's "Max" is `max_text`, and `extra` after the entry.
std::string one_entry_dump(const std::string& max_text, const std::string& extra = "");

// A plain dump whose "level" holds `level_text` (a value the reader has no use for, but must check).
std::string with_level(const std::string& level_text) {
  std::string text = one_entry_dump("1.0");
  const std::string from = R"("level": "L1")";
  return text.replace(text.find(from), from.size(), "\"level\": " + level_text);
}

std::string one_entry_dump(const std::string& max_text, const std::string& extra) {
  return R"({"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": null, "data": {)"
         R"("Aten.add.0.forward": {"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2],)"
         R"( "Max": )" +
         max_text +
         R"(, "Min": 0.5, "Mean": 1, "Norm": -2, "requires_grad": false}], "input_kwargs": {},)"
         R"( "output": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 3.0,)"
         R"( "Min": 1.0, "Mean": 2.0, "Norm": 4.0, "requires_grad": false}]})" +
         extra + "}}";
}

#if defined(TORCHPROBE_HAVE_SIMDJSON)
// What load_dump_rows reads with simdjson, not handing it to load_dump; read in pieces of one byte,
// the file is taken or refused alike.
bool reads_fast_in(const fs::path& path, std::size_t piece) {
  try {
    static_cast<void>(details::dump_rows_in_pieces(path, piece));
    return true;
  } catch (...) {
  }
  return false;
}
bool reads_fast(const fs::path& path) {
  const bool fast = reads_fast_in(path, std::size_t(8) << 20);
  CHECK(reads_fast_in(path, 1) == fast);
  return fast;
}
#endif

TEST_CASE("the fast reader makes load_dump's rows on every committed dump, types of the statistics included" *
          TP_NEEDS("simdjson")) {
#if !defined(TORCHPROBE_HAVE_SIMDJSON)
  TP_SKIP("built without simdjson: compare reads every dump with load_dump");
#else
  const auto dumps = committed_dumps();
  REQUIRE(dumps.size() >= 100);  // tests/data (twins, goldens) and the reference dumps
  std::size_t fast = 0;
  for (const fs::path& path : dumps) {
    CAPTURE(path.string());
    std::string text = read_text_file(path);
    DumpRows through_json;
    try {
      through_json = details::dump_rows_through_json(path, text);
    } catch (const InputError&) {  // a dump made to be rejected: the fast reader must not take it either
      CHECK_FALSE(reads_fast(path));
      continue;
    }
    if (!reads_fast(path)) continue;
    ++fast;
    CHECK(differences(details::dump_rows_in_pieces(path), through_json) == "");
    // read in pieces of 1 and 13 bytes: every key, value and entry split across reads somewhere
    for (const std::size_t piece : {1, 13}) {
      CAPTURE(piece);
      CHECK(differences(details::dump_rows_in_pieces(path, piece), through_json) == "");
    }
    CHECK(differences(load_dump_rows(path), through_json) == "");
  }
  MESSAGE(fast << " of " << dumps.size() << " committed dumps read by the fast reader");
  CHECK(fast * 10 >= dumps.size() * 8);  // NaN-holding dumps aside, nearly all of them
#endif
}

TEST_CASE("a scalar argument's dtype is str(type(value)) as Python prints it, with either reader") {
  const fs::path dir = fs::temp_directory_path() / ("tp_scalar_class_" + std::to_string(::getpid()));
  const fs::path path = dir / "dump.json";
  write(path, R"({"task": "statistics", "level": "L1", "data": {"Functional.pad.0.forward": {"input_args": [)"
              R"({"type": "float", "value": 0.5}, {"type": "int", "value": 2}, {"type": "int", "value": -3},)"
              R"( {"type": "bool", "value": true}, {"type": "str", "value": "constant"}, {"type": "NoneType",)"
              R"( "value": null}, {"type": "list", "value": [1, 2]}], "input_kwargs": {}, "output": []}}})");
  // Python: [str(type(v)) for v in (0.5, 2, -3, True, "constant", None, [1, 2])]
  const std::vector<std::string> python = {"<class 'float'>", "<class 'int'>",      "<class 'int'>", "<class 'bool'>",
                                           "<class 'str'>",   "<class 'NoneType'>", "<class 'list'>"};
  const std::string text = read_text_file(path);
  std::vector<DumpRows> readings;
  readings.push_back(details::dump_rows_through_json(path, text));
  readings.push_back(load_dump_rows(path));
  for (const DumpRows& rows : readings) {
    REQUIRE(rows.rows.size() == python.size());
    for (std::size_t i = 0; i < python.size(); ++i) {
      CAPTURE(i);
      CHECK(rows.rows[i].dtype == python[i]);
      CHECK(rows.rows[i].shape == "[]");
    }
    CHECK(rows.rows[0].stat(0).get<double>() == 0.5);  // a scalar's statistics are its value
  }
  fs::remove_all(dir);
}

TEST_CASE("what the fast reader cannot take is read by load_dump, with its meaning and its messages" *
          TP_NEEDS("simdjson")) {
#if !defined(TORCHPROBE_HAVE_SIMDJSON)
  TP_SKIP("built without simdjson: compare reads every dump with load_dump");
#else
  const fs::path dir = fs::temp_directory_path() / ("tp_fast_reader_" + std::to_string(::getpid()));
  const fs::path path = dir / "dump.json";

  SUBCASE("a plain dump is read fast, integers keeping nlohmann's types; an integer -0 goes to load_dump") {
    write(path, one_entry_dump("-0.0"));
    REQUIRE(reads_fast(path));
    const DumpRows rows = load_dump_rows(path);
    CHECK(differences(rows, details::dump_rows_through_json(path, read_text_file(path))) == "");
    REQUIRE(rows.rows.size() == 2);
    CHECK(rows.rows[0].stat(0).is_number_float());
    CHECK(std::signbit(rows.rows[0].stat(0).get<double>()));
    CHECK(rows.rows[0].stat(2).is_number_unsigned());  // 1
    CHECK(rows.rows[0].stat(3).is_number_integer());   // -2
    CHECK(rows.rows[0].stat(3).get<long>() == -2);
    write(path, one_entry_dump("-0"));
    CHECK_FALSE(reads_fast(path));  // simdjson's DOM reads it as 0 like any other
    const DumpRows zero = load_dump_rows(path);
    CHECK(zero.rows[0].stat(0).is_number_integer());
    CHECK_FALSE(zero.rows[0].stat(0).is_number_unsigned());  // nlohmann's -0: a signed integer
  }
  SUBCASE("Python's NaN, a repeated entry and a repeated key go to load_dump") {
    for (const std::string& text :
         {one_entry_dump("NaN"), one_entry_dump("Infinity"),
          one_entry_dump("1.0", R"(, "Aten.add.0.forward": {"input_args": [], "output": []})"),
          one_entry_dump("1.0, \"Max\": 2.0")}) {
      CAPTURE(text);
      write(path, text);
      CHECK_FALSE(reads_fast(path));
      CHECK(differences(load_dump_rows(path), details::dump_rows_through_json(path, text)) == "");
    }
    write(path, one_entry_dump("NaN"));
    CHECK(load_dump_rows(path).rows[0].stat(0) == "Nan");  // msprobe's set_summary
    write(path, one_entry_dump("1.0, \"Max\": 2.0"));
    CHECK(load_dump_rows(path).rows[0].stat(0).get<double>() == 2.0);  // the last value, as nlohmann keeps
  }
  SUBCASE("invalid JSON and dumps that are not dumps fail with load_dump's message naming the file") {
    for (const std::string& bad :
         {one_entry_dump("01"), one_entry_dump("1e400"), one_entry_dump("1."), one_entry_dump("[1,]"),
          one_entry_dump("\"\\ud800\""), one_entry_dump("\"a\x01b\""), one_entry_dump("\"\xff\""),
          one_entry_dump("123456789012345678901234567890"), one_entry_dump("nan"), one_entry_dump("1") + " x",
          one_entry_dump("1").substr(0, 120), std::string(R"({"task": "statistics", "data": {}})"),
          std::string(R"({"task": "statistics", "data": {"Aten.add.0.forward": 3}})"),
          std::string(R"({"data": {"Aten.add.0.forward": {}}})"), std::string("[1, 2]"), with_level("nul"),
          with_level("[1,,2]"), with_level("{\"a\" 1}")}) {
      CAPTURE(bad);
      write(path, bad);
      CHECK_FALSE(reads_fast(path));
      std::string message;
      try {
        static_cast<void>(load_dump(path));
      } catch (const InputError& e) {
        message = e.what();
      }
      if (bad.find("123456789012345678901234567890") != std::string::npos) {
        CHECK(message.empty());  // nlohmann reads a big integer as a double: valid, just not fast
        continue;
      }
      REQUIRE_FALSE(message.empty());
      CHECK(message.find(path.string()) == 0);
      CHECK_THROWS_WITH_AS(load_dump_rows(path), message.c_str(), InputError);
    }
  }
  SUBCASE("with dump.json and stack.json both bad, the message is dump.json's, as load_dump reads them") {
    write(dir / "stack.json", "{");
    for (const std::string& bad : {std::string(R"({"data": {"Aten.add.0.forward": {}}})"),
                                   one_entry_dump("1").substr(0, 120), one_entry_dump("01")}) {
      CAPTURE(bad);
      write(path, bad);
      std::string message;
      try {
        static_cast<void>(load_dump_rows(path));
      } catch (const InputError& e) {
        message = e.what();
      }
      CHECK(message.find(path.string() + ": ") == 0);
    }
    write(path, one_entry_dump("1.0"));  // a good dump: now the bad stack.json is the error
    std::string message;
    try {
      static_cast<void>(load_dump_rows(path));
    } catch (const InputError& e) {
      message = e.what();
    }
    CHECK(message.find((dir / "stack.json").string()) == 0);
  }
  fs::remove_all(dir);
#endif
}

TEST_CASE("strings with brackets, quotes and backslashes are read whole, wherever the pieces of the file end" *
          TP_NEEDS("simdjson")) {
#if !defined(TORCHPROBE_HAVE_SIMDJSON)
  TP_SKIP("built without simdjson: compare reads every dump with load_dump");
#else
  const fs::path dir = fs::temp_directory_path() / ("tp_fast_pieces_" + std::to_string(::getpid()));
  const fs::path path = dir / "dump.json";
  // An entry name with an escape, a string value ending in an escaped backslash next to a quote,
  // brackets inside strings, and a second entry after them: each must end where its brace does.
  write(path, R"({"task": "statistics", "level": "L1", "data": {)"
              R"("Functional.pad.0.forward": {"input_args": [{"type": "str", "value": "}]{[\\\"}"},)"
              R"( {"type": "str", "value": "a\\"}, {"type": "int", "value": 3}], "input_kwargs": {}, "output": []},)"
              R"( "Aten.\u0061dd.0.forward": {"input_args": [{"type": "str", "value": "]\"}"}], "output": []}}})");
  const DumpRows through_json = details::dump_rows_through_json(path, read_text_file(path));
  REQUIRE(through_json.rows.size() == 4);
  CHECK(through_json.rows[3].name == "Aten.add.0.forward.input.0");  // the escape read as "a"
  for (std::size_t piece = 1; piece <= 48; ++piece) {
    CAPTURE(piece);
    CHECK(differences(details::dump_rows_in_pieces(path, piece), through_json) == "");
  }
  // a control character in an entry name, or invalid UTF-8 there, is load_dump's to report
  for (const std::string& name :
       {std::string("Aten.a") + '\x01' + "dd.0.forward", std::string("Aten.") + '\xff' + "add.0.forward"}) {
    write(path, R"({"task": "statistics", "data": {")" + name + R"(": {"input_args": [], "output": []}}})");
    CHECK_FALSE(reads_fast(path));
    CHECK_THROWS_AS(load_dump_rows(path), InputError);
  }
  fs::remove_all(dir);
#endif
}

TEST_CASE("rows keep their text through a move of their store, and a text kept twice is interned once") {
  TextStore store;
  std::vector<std::string_view> kept;
  std::vector<std::string> expected;
  for (int i = 0; i < 100000; ++i) {  // about 3 MB: several blocks
    expected.push_back("Module.layers." + std::to_string(i) + ".attn.Linear.forward.0.input.0");
    kept.push_back(store.keep(expected.back()));
  }
  const std::string_view a = store.intern("torch.float32"), b = store.intern(std::string("torch.") + "float32");
  CHECK(a.data() == b.data());
  CHECK(store.intern("torch.bfloat16").data() != a.data());
  TextStore moved = std::move(store);
  for (std::size_t i = 0; i < kept.size(); ++i) REQUIRE(kept[i] == expected[i]);
  CHECK(moved.keep("x") == "x");
  CHECK(moved.intern("torch.float32").data() == a.data());  // the interned set moved along
}

TEST_CASE("a name index finds the first item of each name among many, and nothing for a name it lacks") {
  std::vector<std::string> names;
  for (int i = 0; i < 50000; ++i) names.push_back("Aten.add." + std::to_string(i % 20000) + ".forward");
  const auto name_of = [&](std::size_t i) { return std::string_view(names[i]); };
  details::NameIndex index(names.size());
  std::size_t repeats = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::size_t first = index.insert(names[i], i, name_of);
    if (first != details::NameIndex::npos) {
      ++repeats;
      REQUIRE(first == i % 20000);  // the first item of the name, not the latest
    }
  }
  CHECK(repeats == 30000);
  for (std::size_t i = 0; i < 20000; ++i) REQUIRE(index.find(names[i], name_of) == i);
  CHECK(index.find("Aten.add.20000.forward", name_of) == details::NameIndex::npos);
  CHECK(index.find("", name_of) == details::NameIndex::npos);
}

}  // namespace compare_fast_reader_test

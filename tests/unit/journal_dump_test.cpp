// dump.json's items made from the step journal's lines (io/journal_dump.hpp): placed in dump
// order as StepDump::by_first_place places records, laid out as the writer lays out a body, and
// refused (so that the caller writes from the records) whenever the journal cannot serve.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchprobe/io/journal_dump.hpp"
#include "torchprobe/io/python_json.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using torchprobe::io::JournalDump;
using torchprobe::io::JsonText;
using torchprobe::io::to_python_json;

struct Line {
  std::string file, name;
  std::uint64_t order;
  ordered_json body;
  bool construct_only = false;
};

// An entry line as Recorder's EntryLine writes it.
std::string entry_line(const Line& l) {
  std::string out = "{\"file\": \"" + l.file + "\", \"name\": " + to_python_json(l.name, -1) +
                    ", \"order\": " + std::to_string(l.order) + ", \"parent\": \"\"";
  if (l.construct_only) out += ", \"construct_only\": true";
  return out + ", \"body\": " + to_python_json(l.body, -1) + "}";
}

struct Journal {
  fs::path dir;
  Journal() {
    char tmpl[] = "/tmp/tp_journal_dump_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
  }
  ~Journal() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string path() const { return (dir / "journal.jsonl").string(); }
  void write(const std::vector<std::string>& lines, bool last_newline = true) const {
    std::ofstream out(path(), std::ios::binary);
    out << "{\"journal\": 1, \"task\": \"statistics\", \"level\": \"L1\"}\n";
    for (std::size_t i = 0; i < lines.size(); ++i)
      out << lines[i] << (i + 1 < lines.size() || last_newline ? "\n" : "");
  }
};

// What write_items() gives, and what the same items are written straight from their trees.
std::string items_of(JournalDump& d) {
  std::string out;
  {
    JsonText text(out, 1);
    d.write_items(text);
  }
  return out;
}
std::string items_expected(const std::vector<std::pair<std::string, ordered_json>>& items) {
  std::string out;
  {
    JsonText text(out, 1);
    for (std::size_t i = 0; i < items.size(); ++i) {
      text.key(i, 1, items[i].first);
      torchprobe::io::details::write_tree(text, items[i].second, 2);
    }
  }
  return out;
}

ordered_json body(int i) {
  return ordered_json{
      {"input_args", ordered_json::array({{{"type", "torch.Tensor"}, {"Max", i * 0.5}, {"shape", {i, 2}}}})},
      {"input_kwargs", ordered_json::object()},
      {"note", "a, \"b\": [" + std::to_string(i) + "]}"}};
}

}  // namespace

TEST_CASE("the journal's entries come out in dump order, a repeated name in its first place with its last body") {
  Journal j;
  j.write({entry_line({"dump", "B.forward", 2, body(2)}),
           "{\"task_file\": \"free_benchmark.csv\", \"text\": \"a,b\\n\"}",
           entry_line({"dump", "A.forward", 1, body(1)}), entry_line({"debug", "x.0.debug", 0, body(9)}),
           entry_line({"dump", "Module.m.forward", 3, body(0), /*construct_only=*/true}),
           entry_line({"dump", "B.forward", 2, body(22)})});
  std::optional<JournalDump> dump = JournalDump::read(j.path(), 6, "dump");
  REQUIRE(dump);
  CHECK(dump->size() == 2);
  CHECK(items_of(*dump) == items_expected({{"A.forward", body(1)}, {"B.forward", body(22)}}));
  std::optional<JournalDump> debug = JournalDump::read(j.path(), 6, "debug");
  REQUIRE(debug);
  CHECK(items_of(*debug) == items_expected({{"x.0.debug", body(9)}}));
  SUBCASE("only the lines queued before the hand-over count") {
    std::optional<JournalDump> first = JournalDump::read(j.path(), 3, "dump");
    REQUIRE(first);
    CHECK(items_of(*first) == items_expected({{"A.forward", body(1)}, {"B.forward", body(2)}}));
  }
}

TEST_CASE("a journal larger than the reading window, with a line read apart, gives every body") {
  Journal j;
  std::vector<std::string> lines;
  std::vector<std::pair<std::string, ordered_json>> want;
  want.emplace_back("Late.0.forward", body(-1));  // order 0, written last: far behind the window
  for (int i = 0; i < 12000; ++i) {
    lines.push_back(entry_line({"dump", "Aten.add." + std::to_string(i) + ".forward", std::uint64_t(i) + 1, body(i)}));
    want.emplace_back("Aten.add." + std::to_string(i) + ".forward", body(i));
  }
  lines.push_back(entry_line({"dump", "Late.0.forward", 0, body(-1)}));
  j.write(lines);
  REQUIRE(fs::file_size(j.path()) > (std::size_t{3} << 19));  // past 1.5 MiB: the window moves
  std::optional<JournalDump> dump = JournalDump::read(j.path(), lines.size(), "dump");
  REQUIRE(dump);
  CHECK(items_of(*dump) == items_expected(want));
}

TEST_CASE("a journal that cannot serve is refused, so that the records are written instead") {
  Journal j;
  const std::string good = entry_line({"dump", "A.forward", 0, body(1)});
  SUBCASE("fewer lines than were queued") {
    j.write({good});
    CHECK_FALSE(JournalDump::read(j.path(), 2, "dump"));
    CHECK(JournalDump::read(j.path(), 1, "dump"));
  }
  SUBCASE("a last line without its newline (being written)") {
    j.write({good, good}, /*last_newline=*/false);
    CHECK_FALSE(JournalDump::read(j.path(), 2, "dump"));
  }
  SUBCASE("a line of another shape") {
    j.write({good, "{\"end\": true, \"entries\": 1}"});
    CHECK_FALSE(JournalDump::read(j.path(), 2, "dump"));
  }
  SUBCASE("no journal header") {
    std::ofstream(j.path()) << good << "\n";
    CHECK_FALSE(JournalDump::read(j.path(), 1, "dump"));
  }
  SUBCASE("no file") { CHECK_FALSE(JournalDump::read((j.dir / "none.jsonl").string(), 0, "dump")); }
}

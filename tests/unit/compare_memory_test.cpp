// The containers a big compare keeps small (parents.hpp, entries.hpp, rows.hpp), the restart with huge
// pages (huge_pages.hpp), the CSV made by several threads and the report's table data: what each must
// still do exactly as what it replaced.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "compare_support.hpp"
#include "torchprobe/analysis/compare/dump_rows_reader.hpp"
#include "torchprobe/analysis/compare/huge_pages.hpp"
#include "torchprobe/analysis/compare/html_report.hpp"
#include "torchprobe/analysis/compare/matching.hpp"
#include "torchprobe/analysis/compare/msprobe_csv.hpp"
#include "torchprobe/analysis/compare/parents.hpp"

namespace {
namespace fs = std::filesystem;
using namespace torchprobe::compare;
using namespace tp_compare_test;

void write_bytes(const fs::path& p, std::size_t n) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << std::string(n, 'x');
}

// Runs rerun_with_huge_pages in a child process with this environment; its exit status: 42 when it
// returned, else that of `sh -c script` (run instead of this program when it restarts).
int rerun_status(std::vector<std::string> env, const std::string& script) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> envp;
    for (std::string& v : env) envp.push_back(v.data());
    envp.push_back(nullptr);
    std::string sh = "sh", c = "-c", s = script;
    char* argv[] = {sh.data(), c.data(), s.data(), nullptr};
    rerun_with_huge_pages(argv, envp.data(), "/bin/sh");
    ::_exit(42);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("construct.json's parents keep the first parent on insert, the last on set, and copies own their text") {
  auto p = std::make_unique<Parents>();
  std::string key = "Aten.addmm.0.forward", parent = "Module.fc1.Linear.forward.0";
  CHECK(p->insert(key, parent));
  CHECK_FALSE(p->insert(key, "Module.other.forward.0"));  // a repeated key: refused, the first stays
  key.assign(key.size(), '?');                            // the caller's text changes: the map kept its own
  parent.assign(parent.size(), '?');
  REQUIRE(p->find("Aten.addmm.0.forward") != p->end());
  CHECK(p->find("Aten.addmm.0.forward")->second == "Module.fc1.Linear.forward.0");
  p->set("Aten.addmm.0.forward", "Module.fc2.Linear.forward.0");  // load_construct_file: the last value
  p->set("Aten.relu.0.forward", "Module.fc2.Linear.forward.0");
  CHECK(p->size() == 2);
  const Parents copy = *p;
  p.reset();  // the copy's views are of its own text
  CHECK(copy.find("Aten.addmm.0.forward")->second == "Module.fc2.Linear.forward.0");
  CHECK(copy.find("Aten.relu.0.forward")->second == "Module.fc2.Linear.forward.0");
  CHECK(copy.count("Aten.mul.0.forward") == 0);
  Parents other;
  other.insert("Aten.relu.0.forward", "Module.fc2.Linear.forward.0");
  CHECK(other != copy);
  other.insert("Aten.addmm.0.forward", "Module.fc2.Linear.forward.0");
  CHECK(other == copy);
}

TEST_CASE("an entry's rows are the consecutive rows of its name, and the pairs come out in target order") {
  const fs::path dir = temp_dir("entry_rows");
  const DumpRows t = load_dump_rows(three_linear(Variant::same).write(dir / "a"));
  const DumpRows b = load_dump_rows(three_linear(Variant::same).write(dir / "b"));
  fs::remove_all(dir);
  const std::vector<Entry> te = dump_entries(t.rows), be = dump_entries(b.rows);
  std::size_t rows = 0;
  for (const Entry& e : te) {
    REQUIRE_FALSE(e.rows.empty());
    for (const Row* r : e.rows) CHECK(r->entry() == e.name);
    rows += e.rows.size();
  }
  CHECK(rows == t.rows.size());  // every row in exactly one entry
  CHECK(te.size() == t.dump.data.size());
  const Matching m = match_entries(te, be);
  REQUIRE(m.pairs.size() == te.size());
  CHECK(m.target_only.empty());
  CHECK(m.bench_only.empty());
  for (std::size_t i = 0; i < te.size(); ++i) {
    CHECK(m.pairs[i].target == &te[i]);
    REQUIRE(m.pairs[i].bench.size() == 1);
    CHECK(m.pairs[i].bench[0] == &be[i]);
    CHECK(m.pairs[i].links.size() == te[i].rows.size());
  }
}

TEST_CASE("the pairs by target hand out the pairs with bench entries and list the targets without one") {
  const fs::path dir = temp_dir("pairs_by_target");
  const DumpRows t = load_dump_rows(three_linear(Variant::same).write(dir / "a"));
  fs::remove_all(dir);
  const std::vector<Entry> te = dump_entries(t.rows);
  REQUIRE(te.size() >= 4);
  PairsByTarget pairs(te);
  pairs[&te[1]] = EntryPair{&te[1], {&te[1]}, {}, "exact", {}};
  pairs[&te[2]] = EntryPair{&te[2], {}, {}, "template", {}};  // a group member: paired through its lead
  pairs[&te[3]] = EntryPair{&te[3], {&te[0]}, {&te[3]}, "template", {}};
  pairs.erase(&te[1]);
  pairs[&te[1]] = EntryPair{&te[1], {&te[2]}, {}, "value", {}};
  CHECK(pairs.count(&te[0]) == 0);
  CHECK(pairs.count(&te[2]) == 1);
  std::vector<const Entry*> target_only;
  const std::vector<EntryPair> made = pairs.take_pairs(target_only);
  REQUIRE(made.size() == 2);
  CHECK(made[0].target == &te[1]);
  CHECK(made[0].method == "value");
  CHECK(made[1].target == &te[3]);
  CHECK(made[1].bench[0] == &te[0]);
  std::vector<const Entry*> expected{&te[0]};
  for (std::size_t i = 4; i < te.size(); ++i) expected.push_back(&te[i]);
  CHECK(target_only == expected);
}

TEST_CASE("a compare restarts with glibc's huge-page tunable added, unless the environment says otherwise") {
  // Restarted: the old tunables kept, hugetlb appended; the rest of the environment passed on.
  CHECK(rerun_status({"GLIBC_TUNABLES=glibc.malloc.arena_max=2", "KEEP=me"},
                     "[ \"$GLIBC_TUNABLES\" = glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1 ] && [ \"$KEEP\" = me ] "
                     "&& exit 7; exit 9") == 7);
  CHECK(rerun_status({}, "[ \"$GLIBC_TUNABLES\" = glibc.malloc.hugetlb=1 ] && exit 7; exit 9") == 7);
  // Not restarted: the tunable is named already (the second start, or the user's own value), or
  // the user turned it off.
  CHECK(rerun_status({"GLIBC_TUNABLES=glibc.malloc.hugetlb=0"}, "exit 7") == 42);
  CHECK(rerun_status({"GLIBC_TUNABLES=glibc.malloc.hugetlb=1"}, "exit 7") == 42);
  CHECK(rerun_status({"TORCHPROBE_NO_HUGE_PAGES=1"}, "exit 7") == 42);
}

TEST_CASE("the bytes that decide the restart are those of the dump.json files the arguments name") {
  const fs::path dir = temp_dir("huge_pages");
  write_bytes(dir / "target/step0/rank0/dump.json", 1000);
  write_bytes(dir / "target/step1/rank0/dump.json", 300);
  write_bytes(dir / "target/step1/rank0/stack.json", 5000);  // not a dump.json: not counted
  write_bytes(dir / "bench/dump.json", 70);
  CHECK(dump_json_bytes({dir / "target", dir / "bench/dump.json"}) == 1370);
  CHECK(dump_json_bytes({dir / "target/step1"}) == 300);
  CHECK(dump_json_bytes({dir / "missing"}) == 0);
  fs::remove_all(dir);
}

namespace {
// A statistics dump of `n` entries, each a Linear-like call of one input and one output (two rows),
// every 7th an integer statistic; `drift` moves the outputs of entries from `from` on.
fs::path synthetic_dump(const fs::path& dir, std::size_t n, double drift = 0, std::size_t from = 0) {
  fs::create_directories(dir);
  std::ofstream out(dir / "dump.json");
  out << "{\"task\": \"statistics\", \"level\": \"L1\", \"dump_data_dir\": null, \"data\": {";
  for (std::size_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(i % 101) / 7.0 + (i >= from ? drift : 0);
    char stats[200];
    if (i % 7 == 0)
      std::snprintf(stats, sizeof stats, "\"Max\": %zu, \"Min\": 0, \"Mean\": 1, \"Norm\": 2", i % 13);
    else
      std::snprintf(stats, sizeof stats, "\"Max\": %.17g, \"Min\": %.17g, \"Mean\": %.17g, \"Norm\": %.17g", v + 1,
                    v - 1, v, 2 * v + 0.5);
    out << (i ? ",\n" : "\n") << "\"Torch.linear." << i << ".forward\": {\"input_args\": [{\"type\": \"torch.Tensor\", "
        << "\"dtype\": \"torch.float32\", \"shape\": [4, 8], \"Max\": 1.5, \"Min\": -1.5, \"Mean\": 0.25, \"Norm\": "
           "3.0, "
        << "\"requires_grad\": false}], \"input_kwargs\": {}, \"output\": [{\"type\": \"torch.Tensor\", "
        << "\"dtype\": \"torch.float32\", \"shape\": [4, 16], " << stats << ", \"requires_grad\": true}]}";
  }
  out << "\n}}\n";
  return dir / "dump.json";
}
}  // namespace

TEST_CASE("a row's short texts take 8 bytes each and read back as the text, long ones through the store") {
  TextStore store;
  const std::string shape = "[4, 16]";
  const TextRef ref(shape);
  CHECK(ref == "[4, 16]");
  CHECK(ref.view().data() == shape.data());  // a view of the text itself, not a copy
  CHECK(ref.rfind("16") == 4);
  const std::string long_text(70000, 'x');  // beyond the 16 bits a length has
  CHECK_THROWS_AS(TextRef{std::string_view(long_text)}, std::length_error);
  const TextRef kept(long_text, store);
  CHECK(kept.size() == long_text.size());
  CHECK(kept.view() == long_text);
  CHECK(TextRef() == "");
  static_assert(sizeof(TextRef) == 8);
  // Five million rows in a million-entry compare: a row that grows by a string_view costs 80 MB.
  CHECK(sizeof(Row) <= 120);
}

TEST_CASE("a row keeps float statistics as doubles and any other statistic as the cell it was") {
  const fs::path dir = temp_dir("row_stats");
  const DumpRows d = load_dump_rows(synthetic_dump(dir, 8));
  fs::remove_all(dir);
  REQUIRE(d.rows.size() == 16);
  const Row& ints = d.rows[1];  // entry 0's output: integer statistics
  CHECK(ints.stat(0).is_number_unsigned());
  CHECK(ints.stat(0).get<long>() == 0);
  CHECK(ints.stat(3).get<long>() == 2);
  const Row& floats = d.rows[3];  // entry 1's output
  CHECK(floats.stat(2).is_number_float());
  CHECK(floats.stat(2).get<double>() == 1.0 / 7.0);
  CHECK(floats.entry() == "Torch.linear.1.forward");
  CHECK(floats.entry_index() == 1);
  CHECK(floats.data_name() == "-1");
  CHECK_FALSE(floats.stack().has_value());
}

TEST_CASE("the CSV made by several threads at once is, byte for byte, the CSV one thread makes") {
  const fs::path dir = temp_dir("csv_stretches");
  // 40,000 entries: 80,000 rows, three stretches of 32,768 rows
  const DumpRows t = load_dump_rows(synthetic_dump(dir / "t", 40000));
  const DumpRows b = load_dump_rows(synthetic_dump(dir / "b", 40000, 1e-3, 20000));
  fs::remove_all(dir);
  std::string one;
  msprobe_csv_chunks(t.rows, b.rows, CsvMode::summary, false, {}, [&](std::string_view p) { one.append(p); });
  REQUIRE(one.size() > 1000000);
  for (const unsigned threads : {1u, 2u, 3u}) {
    CAPTURE(threads);
    std::string many;
    std::size_t pieces = 0;
    const auto sink = [&](std::string_view p) {
      many.append(p);
      ++pieces;
    };
    CsvStretches<decltype(sink)> csv(t.rows, b.rows, CsvMode::summary, false, {}, sink);
    std::vector<std::thread> others;
    for (unsigned k = 1; k < threads; ++k) others.emplace_back([&] { csv.work(); });
    csv.work();
    for (std::thread& o : others) o.join();
    CHECK(pieces == 3);
    CHECK(many == one);
  }
  // A sink that fails: the error reaches the callers, none waits for ever for its turn.
  int calls = 0;
  const auto failing = [&](std::string_view) {
    if (++calls == 2) throw std::runtime_error("disk full");
  };
  CsvStretches<decltype(failing)> csv(t.rows, b.rows, CsvMode::summary, false, {}, failing);
  std::atomic<int> thrown{0};
  std::thread other([&] {
    try {
      csv.work();
    } catch (const std::runtime_error&) {
      ++thrown;
    }
  });
  try {
    csv.work();
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "disk full");
    ++thrown;
  }
  other.join();
  CHECK(thrown == 2);
  CHECK(calls == 2);
}

TEST_CASE("the report's table of more rows than it draws holds each paired entry's row as data") {
  const fs::path dir = temp_dir("html_data");
  const std::size_t n = html::kStaticTableRows + 10;
  const DumpRows t = load_dump_rows(synthetic_dump(dir / "t", n));
  const DumpRows b = load_dump_rows(synthetic_dump(dir / "b", n, 0.5, n - 3));
  fs::remove_all(dir);
  const Judgement j = judge(t.dump, b.dump, t.rows, b.rows, CsvMode::summary, JudgeMode::tol, -1);
  REQUIRE(j.verdicts.size() == n);
  bool virtualised = false;
  const std::string table = html::entry_table(j, virtualised);
  CHECK(virtualised);
  const std::string open = "id=\"entries-data\">";
  const std::size_t from = table.find(open) + open.size();
  const auto data = nlohmann::json::parse(table.substr(from, table.find("</script>", from) - from));
  REQUIRE(data["rows"].size() == n);
  CHECK(data["methods"] == nlohmann::json::array({"exact"}));
  for (std::size_t i = 0; i < n; ++i) {
    const auto& row = data["rows"][i];
    const EntryVerdict& v = j.verdicts[i];
    CHECK(row[0] == std::string(v.pair->target->name));
    CHECK(row[1] == 0);  // the bench entry has the target's name
    CHECK(row[2] == 0);  // exact
    CHECK(row[3].get<double>() == (std::isinf(v.input_error) ? 1e308 : v.input_error));
    CHECK(row[4].get<double>() == (std::isinf(v.output_error) ? 1e308 : v.output_error));
    CHECK(row[5] == (v.source ? 2 : v.outputs_diverge || v.inputs_diverge ? 1 : 0));
  }
  // the error keys are printf's %.17g of the errors, the form the sorting script reads
  const std::size_t last = n - 3;
  REQUIRE(j.verdicts[last].output_error > 0);
  char expected[40];
  std::snprintf(expected, sizeof expected, "%.17g", j.verdicts[last].output_error);
  CHECK(table.find("\"Torch.linear." + std::to_string(last) + ".forward\",0,0,0," + expected + ",") !=
        std::string::npos);
  CHECK(data["source"] == static_cast<long>(last));
}

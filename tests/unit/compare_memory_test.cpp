// The containers a big compare keeps small (parents.hpp, entries.hpp) and the restart with huge pages
// (huge_pages.hpp): what each must still do exactly as the containers they replaced.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "compare_support.hpp"
#include "torchprobe/analysis/compare/dump_rows_reader.hpp"
#include "torchprobe/analysis/compare/huge_pages.hpp"
#include "torchprobe/analysis/compare/matching.hpp"
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
    for (const Row* r : e.rows) CHECK(r->entry == e.name);
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

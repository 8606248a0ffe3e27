// tools/recover_dump.py from the command line: --check, --keep-journal, damaged journals (a corrupt
// line, a bad header, a torn last line), a missing path, extra_info false, and the temporary files
// of JSON files that a killed process was replacing. The journals come from real Debugger runs: the
// journal is copied after stop() and before step() ends the step, which is what a process killed
// at that moment leaves.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <vector>

#include "recover_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using tptest::contains;

namespace {

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

void write_lines(const std::string& path, const std::vector<std::string>& lines, bool final_newline = true) {
  std::ofstream out(path, std::ios::trunc);
  for (std::size_t i = 0; i < lines.size(); ++i) out << lines[i] << (i + 1 < lines.size() || final_newline ? "\n" : "");
}

// One step of the msprobe reference model at level mix, with a save(): `full` is the rank directory
// the Debugger completed, `cut` one holding only the journal the step had before step() ended it.
struct InterruptedStep {
  tptest::TempDir tmp;
  std::string full, cut;

  explicit InterruptedStep(bool extra_info = true) {
    full = tmp / "full/step0/" + tptest::rank_name();
    cut = tmp / "cut/step0/" + tptest::rank_name();
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(
        tp::Options().dump_path(tmp / "full").extra_info(extra_info));
    torch::manual_seed(5);
    tptest::Net net;
    const at::Tensor x = torch::randn({3, 8}, torch::requires_grad());
    dbg.start(net);
    at::Tensor y = net->forward(x);
    dbg.save(y, "y");
    y.sum().backward();
    dbg.stop();
    dbg.wait_written();  // the journal holds every line of the step once its dump.json is written
    fs::create_directories(cut);
    fs::copy_file(full + "/journal.jsonl", cut + "/journal.jsonl");
    dbg.step();
    dbg.wait_written();
    REQUIRE_FALSE(fs::exists(full + "/journal.jsonl"));
  }
  std::string journal() const { return cut + "/journal.jsonl"; }
  std::size_t dump_entries() const { return tptest::read_json(full + "/dump.json")["data"].size(); }
};

// What a process killed while replacing `path` leaves: a forked child with a 4 KiB file size limit
// is killed by SIGXFSZ inside io::write_file_atomic. Returns the child's pid (part of the name).
pid_t die_while_replacing(const std::string& path) {
  const std::string content(64 * 1024, ' ');
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    struct rlimit no_core {
      0, 0
    }, limit{4096, 4096};
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::setrlimit(RLIMIT_FSIZE, &limit);
    ::signal(SIGXFSZ, SIG_DFL);
    try {
      tp::io::write_file_atomic(path, content);
    } catch (...) {
    }
    ::_exit(0);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGXFSZ);
  return pid;
}

}  // namespace

TEST_CASE("recover_dump.py --check says what it would recover and changes nothing") {
  const InterruptedStep s;
  const std::string before = tptest::read_text(s.journal());
  const tptest::ToolRun r = tptest::run_recover_tool("--check " + s.tmp / "cut");
  CAPTURE(r.out);
  CAPTURE(r.err);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, s.cut + ": would recover " + std::to_string(s.dump_entries()) +
                            " dump entries and 2 debug entries (nothing written)"));
  CHECK(files_in(s.cut) == std::set<std::string>{"journal.jsonl"});
  CHECK(tptest::read_text(s.journal()) == before);
}

TEST_CASE("recover_dump.py --keep-journal writes the step's files and leaves the journal as it was") {
  const InterruptedStep s;
  const std::string before = tptest::read_text(s.journal());
  const tptest::ToolRun r = tptest::run_recover_tool("--keep-journal " + s.cut);
  CAPTURE(r.out);
  CAPTURE(r.err);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "recovered " + std::to_string(s.dump_entries()) +
                            " dump entries and 2 debug entries (dump.json, construct.json, debug.json)"));
  CHECK(files_in(s.cut) == std::set<std::string>{"journal.jsonl", "dump.json", "construct.json", "debug.json"});
  CHECK(tptest::read_text(s.journal()) == before);
  CHECK(tptest::compare_dump_files(s.cut + "/dump.json", s.full + "/dump.json") == "SAME\n");
  CHECK(tptest::compare_dump_files(s.cut + "/debug.json", s.full + "/debug.json") == "SAME\n");
  CHECK(tptest::compare_json_files(s.cut + "/construct.json", s.full + "/construct.json") == "SAME\n");
  // Run again without the option: the same files, and now the journal goes.
  CHECK(tptest::run_recover_tool(s.cut).rc == 0);
  CHECK(files_in(s.cut) == std::set<std::string>{"dump.json", "construct.json", "debug.json"});
  CHECK(tptest::compare_dump_files(s.cut + "/dump.json", s.full + "/dump.json") == "SAME\n");
}

TEST_CASE("a corrupt line inside the journal fails recovery with its line number, and nothing is written or removed") {
  const InterruptedStep s;
  std::vector<std::string> lines = lines_of(s.journal());
  REQUIRE(lines.size() >= 4);
  lines[2] = lines[2].substr(0, lines[2].size() / 2);  // line 3 of the file: cut short, then more lines follow
  write_lines(s.journal(), lines);
  const tptest::ToolRun r = tptest::run_recover_tool(s.tmp / "cut");
  CAPTURE(r.out);
  CHECK(r.rc == 1);
  CHECK(r.err == "error: " + s.journal() + ":3: not a JSON line\n");
  CHECK(files_in(s.cut) == std::set<std::string>{"journal.jsonl"});

  // Valid JSON that is not an entry is refused the same way (rather than a python traceback).
  lines[2] = R"({"file": "dump", "name": "Aten.x.0.forward", "body": {}})";  // no "order"
  write_lines(s.journal(), lines);
  const tptest::ToolRun r2 = tptest::run_recover_tool(s.tmp / "cut");
  CHECK(r2.rc == 1);
  CHECK(r2.err == "error: " + s.journal() + ":3: not a journal entry (no file, name, order or body)\n");
  CHECK(files_in(s.cut) == std::set<std::string>{"journal.jsonl"});
}

TEST_CASE("a journal whose first line is not a TorchProbe header is refused") {
  const InterruptedStep s;
  std::vector<std::string> lines = lines_of(s.journal());
  const Json header = Json::parse(lines[0]);
  for (const std::string& bad : {std::string(R"({"hello": 1})"), std::string("[1, 2]"),
                                 std::string(R"({"journal": 2, "task": "statistics", "level": "mix"})"),
                                 std::string(R"({"journal": 1, "level": "mix"})")}) {
    CAPTURE(bad);
    lines[0] = bad;
    write_lines(s.journal(), lines);
    const tptest::ToolRun r = tptest::run_recover_tool(s.cut);
    CHECK(r.rc == 1);
    CHECK(contains(r.err, "error: " + s.journal() + ": not a TorchProbe journal (first line: b'" + bad + "')"));
    CHECK_FALSE(contains(r.err, "Traceback"));
    CHECK(files_in(s.cut) == std::set<std::string>{"journal.jsonl"});
  }
  CHECK(header["journal"] == 1);  // what the real header says, for contrast
  CHECK(header["task"] == "statistics");
  CHECK(header["level"] == "mix");
}

TEST_CASE("a torn last line is skipped with a warning and the entries before it are recovered") {
  const InterruptedStep s;
  std::vector<std::string> lines = lines_of(s.journal());
  const Json last = Json::parse(lines.back());
  const std::string torn_name = last["name"].get<std::string>();
  REQUIRE(last["file"] == "dump");
  int seen = 0;
  for (const std::string& l : lines) seen += Json::parse(l).value("name", "") == torn_name;
  REQUIRE(seen == 1);  // so the expected result is the full dump less that entry
  lines.back() = lines.back().substr(0, lines.back().size() / 2);
  write_lines(s.journal(), lines, /*final_newline=*/false);  // what a process killed mid-write leaves

  const tptest::ToolRun r = tptest::run_recover_tool(s.cut);
  CAPTURE(r.out);
  CAPTURE(r.err);
  CHECK(r.rc == 0);
  CHECK(r.err == s.journal() + ": ignoring the incomplete last line\n");
  CHECK(contains(r.out, "recovered " + std::to_string(s.dump_entries() - 1) + " dump entries and 2 debug entries"));
  CHECK(tptest::compare_dump_files(s.cut + "/dump.json", s.full + "/dump.json", torn_name) == "SAME\n");
  CHECK(tptest::compare_dump_files(s.cut + "/debug.json", s.full + "/debug.json") == "SAME\n");
  CHECK_FALSE(fs::exists(s.journal()));
}

TEST_CASE("a path that does not exist fails recovery with exit status 1; the other paths are still recovered") {
  const InterruptedStep s;
  const std::string missing = s.tmp / "no/such/dump";
  const tptest::ToolRun r = tptest::run_recover_tool(missing + " " + s.tmp / "cut");
  CAPTURE(r.out);
  CHECK(r.rc == 1);
  CHECK(r.err == "error: " + missing + " does not exist\n");
  CHECK(contains(r.out, s.cut + ": recovered " + std::to_string(s.dump_entries()) + " dump entries"));
  CHECK(tptest::compare_dump_files(s.cut + "/dump.json", s.full + "/dump.json") == "SAME\n");
  // A directory without any journal is no error.
  const tptest::ToolRun none = tptest::run_recover_tool(s.tmp / "full");
  CHECK(none.rc == 0);
  CHECK(none.out == "no interrupted step found (no journal.jsonl)\n");
}

TEST_CASE("with extra_info false the journal says so and recovery writes no construct.json, as the Debugger does") {
  const InterruptedStep s(/*extra_info=*/false);
  CHECK(Json::parse(lines_of(s.journal()).front())["extra_info"] == false);
  CHECK(files_in(s.full) == std::set<std::string>{"dump.json", "debug.json"});
  const tptest::ToolRun r = tptest::run_recover_tool(s.cut);
  CAPTURE(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "recovered " + std::to_string(s.dump_entries()) +
                            " dump entries and 2 debug entries (dump.json, debug.json)\n"));
  CHECK(files_in(s.cut) == files_in(s.full));
  CHECK(tptest::compare_dump_files(s.cut + "/dump.json", s.full + "/dump.json") == "SAME\n");
}

TEST_CASE(
    "temporary files of JSON files a killed process was replacing are removed by recover_dump.py; --check only lists "
    "them") {
  const InterruptedStep s;
  // A complete step whose dump.json and stack.json were being rewritten, and an interrupted one
  // whose dump.json was being written for the first time.
  const pid_t p1 = die_while_replacing(s.full + "/dump.json");
  const pid_t p2 = die_while_replacing(s.full + "/stack.json");
  const pid_t p3 = die_while_replacing(s.cut + "/dump.json");
  // Files that only look alike stay: not hidden, or not a temporary's name.
  std::ofstream(s.full + "/notes.json.tmp1.2") << "x";
  std::ofstream(s.full + "/.dump.json.bak") << "x";
  const std::set<std::string> good = {"dump.json",  "stack.json",        "construct.json",
                                      "debug.json", "notes.json.tmp1.2", ".dump.json.bak"};
  const std::string dump_before = tptest::read_text(s.full + "/dump.json");

  // The names are io::write_file_atomic's own: "." + name + ".tmp" + pid + "." + a counter.
  std::set<std::string> temps;
  for (const auto& [dir, pid, name] : {std::tuple{s.full, p1, "dump.json"}, std::tuple{s.full, p2, "stack.json"},
                                       std::tuple{s.cut, p3, "dump.json"}}) {
    const std::regex expected("\\." + std::regex_replace(std::string(name), std::regex("\\."), "\\.") + "\\.tmp" +
                              std::to_string(pid) + "\\.\\d+");
    int found = 0;
    for (const std::string& f : files_in(dir))
      if (std::regex_match(f, expected)) ++found, temps.insert(dir + "/" + f);
    CHECK(found == 1);
  }
  REQUIRE(temps.size() == 3);

  const tptest::ToolRun check = tptest::run_recover_tool("--check " + s.tmp.path());
  CAPTURE(check.out);
  CHECK(check.rc == 0);
  for (const std::string& t : temps) {
    CHECK(contains(check.out, t + ": would remove (a JSON file that was being replaced)\n"));
    CHECK(fs::exists(t));
  }

  const tptest::ToolRun r = tptest::run_recover_tool(s.tmp.path());
  CAPTURE(r.out);
  CAPTURE(r.err);
  CHECK(r.rc == 0);
  for (const std::string& t : temps) {
    CHECK(contains(r.out, t + ": removed (a JSON file that was being replaced)\n"));
    CHECK_FALSE(fs::exists(t));
  }
  CHECK(files_in(s.full) == good);
  CHECK(tptest::read_text(s.full + "/dump.json") == dump_before);
  CHECK(files_in(s.cut) == std::set<std::string>{"dump.json", "construct.json", "debug.json"});
  CHECK(tptest::compare_dump_files(s.cut + "/dump.json", s.full + "/dump.json") == "SAME\n");
}

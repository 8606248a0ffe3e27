// tools/recover_dump.py from the command line: --check, --keep-journal, damaged journals (a corrupt
// line, a bad header, a torn last line), a missing path, extra_info false, the temporary files of
// JSON files that a killed process was replacing, and what recovery says it could not recover (a
// step interrupted, lines missing, a step lost). The journals come from real Debugger runs: copied
// after stop() and before step() ends the step (`cut`: what a process killed at that moment
// leaves), and after step() returned with the writer held back (`done`: killed after step()).
// Every case is run again through `torchprobe recover` (io/recovery.hpp, in process), which must
// give the same exit status, messages and files.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/analysis/compare/cli.hpp>
#include <torchprobe/analysis/compare/dump_reader.hpp>
#include <torchprobe/analysis/compare/ranks.hpp>
#include <torchprobe/io/recovery.hpp>
#include <torchprobe/torchprobe.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
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
// the Debugger completed, `cut` one holding only the journal the step had before step() ended it,
// `done` one holding the journal as step() left it (every line and the trailer).
struct InterruptedStep {
  tptest::TempDir tmp;
  std::string full, cut, done;

  explicit InterruptedStep(bool extra_info = true) {
    full = tmp / "full/step0/" + tptest::rank_name();
    cut = tmp / "cut/step0/" + tptest::rank_name();
    done = tmp / "done/step0/" + tptest::rank_name();
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
    dbg.background_writer().pause();  // the journal stays until the writer removes it
    dbg.step();
    fs::create_directories(done);
    fs::copy_file(full + "/journal.jsonl", done + "/journal.jsonl");
    dbg.background_writer().resume();
    dbg.wait_written();
    REQUIRE_FALSE(fs::exists(full + "/journal.jsonl"));
  }
  std::string journal() const { return cut + "/journal.jsonl"; }
  std::string done_journal() const { return done + "/journal.jsonl"; }
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

// Every regular file below `root`, by its path relative to it, with its content; in
// dump_error_info.log the time stamp and the pid are masked (two processes wrote them).
std::map<std::string, std::string> tree_of(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    std::string text = tptest::read_text(e.path().string());
    if (e.path().filename() == "dump_error_info.log")
      text = std::regex_replace(std::regex_replace(text, std::regex(R"(^\[[^\]]*\])", std::regex::multiline), "[T]"),
                                std::regex(R"(pid=\d+)"), "pid=P");
    out[fs::relative(e.path(), root).string()] = text;
  }
  return out;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t p = 0; (p = text.find(from, p)) != std::string::npos; p += to.size())
    text.replace(p, from.size(), to);
  return text;
}

// recover_dump.py with `args` (paths below `tmp`, separated by spaces), and `torchprobe recover`
// (io/recovery.hpp, in process) with the same arguments on a copy of `tmp` made before: both must
// agree on the exit status, stdout, stderr and every file they leave. Returns the Python run.
tptest::ToolRun run_both(const tptest::TempDir& tmp, const std::string& args) {
  const tptest::TempDir twin;
  const std::string copy = twin / "t";
  fs::copy(tmp.path(), copy, fs::copy_options::recursive);
  const tptest::ToolRun py = tptest::run_recover_tool(args);
  std::vector<std::string> argv;
  std::istringstream words(replace_all(args, tmp.path(), copy));
  for (std::string w; words >> w;) argv.push_back(w);
  std::ostringstream out, err;
  const int rc = tp::io::recovery::run_recover(argv, out, err);
  CAPTURE(args);
  CHECK(rc == py.rc);
  CHECK(replace_all(out.str(), copy, tmp.path()) == py.out);
  CHECK(replace_all(err.str(), copy, tmp.path()) == py.err);
  std::map<std::string, std::string> mine = tree_of(copy), theirs = tree_of(tmp.path());
  for (auto& kv : mine) kv.second = replace_all(kv.second, copy, tmp.path());
  CHECK(mine == theirs);
  return py;
}

}  // namespace

TEST_CASE("recover_dump.py --check says what it would recover and changes nothing") {
  const InterruptedStep s;
  const std::string before = tptest::read_text(s.journal());
  // An interrupted step: everything it has, and that it is incomplete (exit status 3).
  const tptest::ToolRun r = run_both(s.tmp, "--check " + s.tmp / "cut");
  CAPTURE(r.out);
  CAPTURE(r.err);
  CHECK(r.rc == 3);
  CHECK(contains(r.out, s.cut + ": would recover " + std::to_string(s.dump_entries()) +
                            " dump entries and 2 debug entries (nothing written)\n" + s.cut +
                            ": incomplete: missing the step was interrupted: the entry lines after the "));
  CHECK(r.err == "1 step(s) incomplete or lost (see above)\n");
  CHECK(files_in(s.cut) == std::set<std::string>{"journal.jsonl"});
  CHECK(tptest::read_text(s.journal()) == before);
  // A step that ended: whole, exit status 0.
  const tptest::ToolRun d = run_both(s.tmp, "--check " + s.tmp / "done");
  CHECK(d.rc == 0);
  CHECK(d.out == s.done + ": would recover " + std::to_string(s.dump_entries()) +
                     " dump entries and 2 debug entries (nothing written)\n");
  CHECK(d.err == "");
  CHECK(files_in(s.done) == std::set<std::string>{"journal.jsonl"});
}

TEST_CASE("step() returns after every line of its step is written: the journal ends with a trailer that counts them") {
  const InterruptedStep s;
  std::vector<std::string> lines = lines_of(s.done_journal());
  REQUIRE(lines.size() >= 3);
  // The lines the step had before step(), then the journal lines made when the step ended, then the trailer.
  const std::vector<std::string> cut = lines_of(s.journal());
  REQUIRE(cut.size() < lines.size());
  CHECK(std::equal(cut.begin(), cut.end(), lines.begin()));
  CHECK(lines.back() == tp::io::Journal::trailer_text(lines.size() - 2));
  CHECK(lines.back() == "{\"end\": true, \"entries\": " + std::to_string(lines.size() - 2) + "}");
}

TEST_CASE("recover_dump.py --keep-journal writes the step's files and leaves the journal as it was") {
  const InterruptedStep s;
  const std::string before = tptest::read_text(s.done_journal());
  const tptest::ToolRun r = run_both(s.tmp, "--keep-journal " + s.done);
  CAPTURE(r.out);
  CAPTURE(r.err);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "recovered " + std::to_string(s.dump_entries()) +
                            " dump entries and 2 debug entries (dump.json, construct.json, debug.json)"));
  CHECK(files_in(s.done) == std::set<std::string>{"journal.jsonl", "dump.json", "construct.json", "debug.json"});
  CHECK(tptest::read_text(s.done_journal()) == before);
  // A step that ended comes back byte for byte as the Debugger wrote it.
  for (const char* f : {"dump.json", "debug.json", "construct.json"}) {
    CAPTURE(f);
    CHECK(tptest::read_text(s.done + "/" + f) == tptest::read_text(s.full + "/" + f));
  }
  // Run again without the option: the same files, and now the journal goes.
  CHECK(run_both(s.tmp, s.done).rc == 0);
  CHECK(files_in(s.done) == std::set<std::string>{"dump.json", "construct.json", "debug.json"});
  CHECK(tptest::read_text(s.done + "/dump.json") == tptest::read_text(s.full + "/dump.json"));
}

TEST_CASE(
    "an interrupted step is rebuilt from what its journal has and marked incomplete: dump.json, debug.json, "
    "dump_error_info.log, the message and exit status 3") {
  const InterruptedStep s;
  const std::size_t lines = lines_of(s.journal()).size() - 1;  // the header is not counted
  const tptest::ToolRun r = run_both(s.tmp, s.cut);
  CAPTURE(r.out);
  CAPTURE(r.err);
  CHECK(r.rc == 3);
  const std::string missing = "the step was interrupted: the entry lines after the " + std::to_string(lines) +
                              " written (at most " + std::to_string(tp::io::Journal::kMaxQueued) +
                              ", still queued when the process stopped)";
  CHECK(r.out == s.cut + ": recovered " + std::to_string(s.dump_entries()) +
                     " dump entries and 2 debug entries (dump.json, construct.json, debug.json)\n" + s.cut +
                     ": incomplete: missing " + missing + "\n");
  CHECK(r.err == "1 step(s) incomplete or lost (see above)\n");
  CHECK(files_in(s.cut) == std::set<std::string>{"dump.json", "construct.json", "debug.json", "dump_error_info.log"});
  // The entries are all there (nothing was lost here, but recovery cannot know that), with the mark
  // beside msprobe's keys, after them.
  const Json dump = tptest::read_json(s.cut + "/dump.json"), full = tptest::read_json(s.full + "/dump.json");
  std::vector<std::string> keys;
  for (const auto& kv : dump.items()) keys.push_back(kv.key());
  CHECK(keys == std::vector<std::string>{"task", "level", "framework", "dump_data_dir", "data", "torchprobe_recovery"});
  CHECK(dump["data"] == full["data"]);
  CHECK(dump["torchprobe_recovery"] ==
        Json({{"complete", false}, {"entries_recovered", s.dump_entries()}, {"missing", missing}}));
  const Json debug = tptest::read_json(s.cut + "/debug.json");
  CHECK(debug["torchprobe_recovery"]["complete"] == false);
  CHECK(debug["torchprobe_recovery"]["entries_recovered"] == 2);
  const std::string log = tptest::read_text(s.cut + "/dump_error_info.log");
  CHECK(contains(log, "] [ERROR] recover_dump failed: name=" + s.cut + ", pid="));
  CHECK(contains(log, "torchprobe recover: " + s.cut + ": incomplete: recovered " + std::to_string(s.dump_entries()) +
                          " dump entries and 2 debug entries; missing: " + missing + "\n"));
  // msprobe's compare reads dump.json with json.load and takes "task", "level", "framework",
  // "dump_data_dir" and "data" (compare-spec 1.1, msprobe-reference 2.1): those read as before.
  CHECK(tptest::run_python(
            "import json\n"
            "d = json.load(open('" +
            s.cut +
            "/dump.json'))\n"
            "f = json.load(open('" +
            s.full +
            "/dump.json'))\n"
            "print(all(d[k] == f[k] for k in ('task', 'level', 'framework', 'dump_data_dir', 'data')))\n") == "True\n");
  // and TorchProbe's own reader of msprobe's format takes it as a dump.
  const tp::compare::Dump loaded = tp::compare::load_dump(s.cut + "/dump.json");
  CHECK(loaded.data.size() == s.dump_entries());
  CHECK(loaded.task == "statistics");
}

TEST_CASE(
    "a journal with fewer entry lines than its trailer counts is marked incomplete, naming how many are missing") {
  const InterruptedStep s;
  std::vector<std::string> lines = lines_of(s.done_journal());
  REQUIRE(lines.size() >= 5);
  const Json dropped = Json::parse(lines[2]);
  lines.erase(lines.begin() + 2);  // a line that failed (a full disk) in the middle of the step
  write_lines(s.done_journal(), lines);
  const std::string total = std::to_string(lines.size() - 1);  // the trailer counts the line that is gone
  const tptest::ToolRun r = run_both(s.tmp, s.done);
  CAPTURE(r.out);
  CAPTURE(r.err);
  CHECK(r.rc == 3);
  const std::string missing = "1 of the step's " + total + " journal lines (not written: see dump_error_info.log)";
  CHECK(contains(r.out, s.done + ": incomplete: missing " + missing + "\n"));
  const Json dump = tptest::read_json(s.done + "/dump.json");
  CHECK(dump["torchprobe_recovery"]["missing"] == missing);
  if (dropped["file"] == "dump") CHECK_FALSE(dump["data"].contains(dropped["name"].get<std::string>()));
  CHECK(contains(tptest::read_text(s.done + "/dump_error_info.log"), "missing: " + missing));
}

TEST_CASE("a journal with its header and no line is a lost step: reported, no dump.json that would read as empty") {
  const InterruptedStep s;
  write_lines(s.journal(), {lines_of(s.journal()).front()});
  const tptest::ToolRun r = run_both(s.tmp, s.tmp / "cut");
  CAPTURE(r.out);
  CAPTURE(r.err);
  CHECK(r.rc == 3);
  const std::string message = "lost: the step was interrupted before any entry line reached its journal (at most " +
                              std::to_string(tp::io::Journal::kMaxQueued) +
                              " were still queued); no dump.json is written for it";
  CHECK(r.out == s.cut + ": " + message + "\n");
  CHECK(r.err == "1 step(s) incomplete or lost (see above)\n");
  CHECK(files_in(s.cut) == std::set<std::string>{"dump_error_info.log"});
  CHECK(contains(tptest::read_text(s.cut + "/dump_error_info.log"), "torchprobe recover: " + s.cut + ": " + message));
  // With a trailer that counts no line, the step ended with nothing recorded: an empty dump, whole.
  const std::string header = lines_of(s.done_journal()).front();
  write_lines(s.done_journal(), {header, tp::io::Journal::trailer_text(0)});
  const tptest::ToolRun e = run_both(s.tmp, s.done);
  CHECK(e.rc == 0);
  CHECK(tptest::read_json(s.done + "/dump.json")["data"] == Json::object());
  CHECK_FALSE(tptest::read_json(s.done + "/dump.json").contains("torchprobe_recovery"));
}

TEST_CASE("a corrupt line inside the journal fails recovery with its line number, and nothing is written or removed") {
  const InterruptedStep s;
  std::vector<std::string> lines = lines_of(s.journal());
  REQUIRE(lines.size() >= 4);
  lines[2] = lines[2].substr(0, lines[2].size() / 2);  // line 3 of the file: cut short, then more lines follow
  write_lines(s.journal(), lines);
  const tptest::ToolRun r = run_both(s.tmp, s.tmp / "cut");
  CAPTURE(r.out);
  CHECK(r.rc == 1);
  CHECK(r.err == "error: " + s.journal() + ":3: not a JSON line\n");
  CHECK(files_in(s.cut) == std::set<std::string>{"journal.jsonl"});

  // Valid JSON that is not an entry is refused the same way (rather than a python traceback).
  lines[2] = R"({"file": "dump", "name": "Aten.x.0.forward", "body": {}})";  // no "order"
  write_lines(s.journal(), lines);
  const tptest::ToolRun r2 = run_both(s.tmp, s.tmp / "cut");
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
    const tptest::ToolRun r = run_both(s.tmp, s.cut);
    CHECK(r.rc == 1);
    CHECK(contains(r.err, "error: " + s.journal() + ": not a TorchProbe journal (first line: b'" + bad + "')"));
    CHECK_FALSE(contains(r.err, "Traceback"));
    CHECK(files_in(s.cut) == std::set<std::string>{"journal.jsonl"});
  }
  CHECK(header["journal"] == 1);  // what the real header says, for contrast
  CHECK(header["task"] == "statistics");
  CHECK(header["level"] == "mix");
}

TEST_CASE("a torn last line is skipped with a warning and the entries before it are recovered, marked incomplete") {
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

  const tptest::ToolRun r = run_both(s.tmp, s.cut);
  CAPTURE(r.out);
  CAPTURE(r.err);
  CHECK(r.rc == 3);
  CHECK(r.err == s.journal() + ": ignoring the incomplete last line\n1 step(s) incomplete or lost (see above)\n");
  CHECK(contains(r.out, "recovered " + std::to_string(s.dump_entries() - 1) + " dump entries and 2 debug entries"));
  CHECK(contains(r.out, s.cut + ": incomplete: missing the step was interrupted"));
  CHECK(tptest::compare_dump_files(s.cut + "/dump.json", s.full + "/dump.json", torn_name) == "SAME\n");
  CHECK(tptest::compare_dump_files(s.cut + "/debug.json", s.full + "/debug.json") == "SAME\n");
  CHECK_FALSE(fs::exists(s.journal()));
  // A torn trailer: the step cannot be known to have ended.
  std::vector<std::string> done = lines_of(s.done_journal());
  done.back() = done.back().substr(0, done.back().size() - 3);
  write_lines(s.done_journal(), done, /*final_newline=*/false);
  CHECK(run_both(s.tmp, s.done).rc == 3);
}

TEST_CASE("a path that does not exist fails recovery with exit status 1; the other paths are still recovered") {
  const InterruptedStep s;
  const std::string missing = s.tmp / "no/such/dump";
  const tptest::ToolRun r = run_both(s.tmp, missing + " " + s.tmp / "done");
  CAPTURE(r.out);
  CHECK(r.rc == 1);
  CHECK(r.err == "error: " + missing + " does not exist\n");
  CHECK(contains(r.out, s.done + ": recovered " + std::to_string(s.dump_entries()) + " dump entries"));
  CHECK(tptest::read_text(s.done + "/dump.json") == tptest::read_text(s.full + "/dump.json"));
  // A directory without any journal is no error.
  const tptest::ToolRun none = run_both(s.tmp, s.tmp / "full");
  CHECK(none.rc == 0);
  CHECK(none.out == "no interrupted step found (no journal.jsonl)\n");
  // An unreadable journal wins over an incomplete one: exit status 1.
  write_lines(s.journal(), {"not json", "{}"});
  CHECK(run_both(s.tmp, s.tmp / "cut " + s.tmp / "done").rc == 1);
}

TEST_CASE("with extra_info false the journal says so and recovery writes no construct.json, as the Debugger does") {
  const InterruptedStep s(/*extra_info=*/false);
  CHECK(Json::parse(lines_of(s.journal()).front())["extra_info"] == false);
  CHECK(files_in(s.full) == std::set<std::string>{"dump.json", "debug.json"});
  const tptest::ToolRun r = run_both(s.tmp, s.done);
  CAPTURE(r.out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "recovered " + std::to_string(s.dump_entries()) +
                            " dump entries and 2 debug entries (dump.json, debug.json)\n"));
  CHECK(files_in(s.done) == files_in(s.full));
  CHECK(tptest::read_text(s.done + "/dump.json") == tptest::read_text(s.full + "/dump.json"));
}

TEST_CASE("torchprobe recover: usage errors give exit status 2") {
  std::ostringstream out, err;
  CHECK(tp::io::recovery::run_recover({}, out, err) == 2);
  CHECK(contains(err.str(), "torchprobe recover: no PATH given\nusage: torchprobe recover"));
  std::ostringstream out2, err2;
  CHECK(tp::io::recovery::run_recover({"--bogus", "x"}, out2, err2) == 2);
  CHECK(contains(err2.str(), "torchprobe recover: unknown option '--bogus'"));
  std::ostringstream out3, err3;
  CHECK(tp::io::recovery::run_recover({"--help"}, out3, err3) == 0);
  CHECK(contains(out3.str(), "exit status: 0 every step recovered whole"));
}

TEST_CASE(
    "temporary files of JSON files (and of ranks_digest.bin) a killed process was replacing are removed by "
    "recover_dump.py; --check only lists them") {
  const InterruptedStep s;
  // A complete step whose dump.json and stack.json were being rewritten, and an interrupted one
  // whose dump.json was being written for the first time.
  const pid_t p1 = die_while_replacing(s.full + "/dump.json");
  const pid_t p2 = die_while_replacing(s.full + "/stack.json");
  const pid_t p3 = die_while_replacing(s.done + "/dump.json");
  const pid_t p4 = die_while_replacing(s.done + "/ranks_digest.bin");  // the rank's digest (io/rank_digest.hpp)
  // Files that only look alike stay: not hidden, or not a temporary's name.
  std::ofstream(s.full + "/notes.json.tmp1.2") << "x";
  std::ofstream(s.full + "/.dump.json.bak") << "x";
  const std::set<std::string> good = {"dump.json",  "stack.json",        "construct.json",
                                      "debug.json", "notes.json.tmp1.2", ".dump.json.bak"};
  const std::string dump_before = tptest::read_text(s.full + "/dump.json");

  // The names are io::write_file_atomic's own: "." + name + ".tmp" + pid + "." + a counter.
  std::set<std::string> temps;
  for (const auto& [dir, pid, name] :
       {std::tuple{s.full, p1, "dump.json"}, std::tuple{s.full, p2, "stack.json"}, std::tuple{s.done, p3, "dump.json"},
        std::tuple{s.done, p4, "ranks_digest.bin"}}) {
    const std::regex expected("\\." + std::regex_replace(std::string(name), std::regex("\\."), "\\.") + "\\.tmp" +
                              std::to_string(pid) + "\\.\\d+");
    int found = 0;
    for (const std::string& f : files_in(dir))
      if (std::regex_match(f, expected)) ++found, temps.insert(dir + "/" + f);
    CHECK(found == 1);
  }
  REQUIRE(temps.size() == 4);
  const auto what = [](const std::string& t) {
    return t.find("/.ranks_digest.bin.tmp") != std::string::npos ? "the rank's digest" : "a JSON file";
  };

  tptest::remove_tree(s.tmp / "cut");  // an interrupted step would make the exit status 3
  const tptest::ToolRun check = run_both(s.tmp, "--check " + s.tmp.path());
  CAPTURE(check.out);
  CHECK(check.rc == 0);
  for (const std::string& t : temps) {
    CHECK(contains(check.out, t + ": would remove (" + what(t) + " that was being replaced)\n"));
    CHECK(fs::exists(t));
  }

  const tptest::ToolRun r = run_both(s.tmp, s.tmp.path());
  CAPTURE(r.out);
  CAPTURE(r.err);
  CHECK(r.rc == 0);
  for (const std::string& t : temps) {
    CHECK(contains(r.out, t + ": removed (" + what(t) + " that was being replaced)\n"));
    CHECK_FALSE(fs::exists(t));
  }
  CHECK(files_in(s.full) == good);
  CHECK(tptest::read_text(s.full + "/dump.json") == dump_before);
  CHECK(files_in(s.done) == std::set<std::string>{"dump.json", "construct.json", "debug.json"});
  CHECK(tptest::read_text(s.done + "/dump.json") == dump_before);
}

TEST_CASE("torchprobe compare leaves out what a step recovered incomplete lacks at its end, and says so") {
  const InterruptedStep s;
  std::vector<std::string> lines = lines_of(s.journal());
  const std::string last = Json::parse(lines.back())["name"].get<std::string>();
  lines.pop_back();  // its last line never reached the journal
  write_lines(s.journal(), lines);
  REQUIRE(run_both(s.tmp, s.cut).rc == 3);
  const Json cut = tptest::read_json(s.cut + "/dump.json");
  REQUIRE_FALSE(cut["data"].contains(last));
  auto compare = [&](const std::string& bench, const std::string& out, std::string& log) {
    tp::compare::CompareOptions o = tp::compare::parse_compare_args({s.full + "/dump.json", bench, "-o", s.tmp / out});
    std::ostringstream text;
    const int rc = tp::compare::run_compare(o, text);
    log = text.str();
    return rc;
  };
  std::string log;
  CHECK(compare(s.cut + "/dump.json", "marked", log) == 0);
  CAPTURE(log);
  CHECK(contains(log, "note: " + s.cut + "/dump.json is a step recovered incomplete after a crash (missing: " +
                          cut["torchprobe_recovery"]["missing"].get<std::string>() + "); the 1 entries of " + s.full +
                          "/dump.json after its last one are left out, not reported as unpaired\n"));
  const std::string paired = std::to_string(cut["data"].size());
  CHECK(contains(log, "/dump.json: " + paired + " paired entries, 0 target-only, 0 bench-only; no divergence\n"));
  // The same file without the mark: the entry it lacks counts against it.
  Json unmarked = cut;
  unmarked.erase("torchprobe_recovery");
  fs::create_directories(s.tmp / "plain");
  std::ofstream(s.tmp / "plain/dump.json") << unmarked.dump(1);
  std::string plain_log;
  compare(s.tmp / "plain/dump.json", "plain", plain_log);
  CAPTURE(plain_log);
  CHECK_FALSE(contains(plain_log, "recovered incomplete"));
  CHECK(contains(plain_log, "/dump.json: " + paired + " paired entries, 1 target-only, 0 bench-only; no divergence\n"));
}

TEST_CASE("torchprobe ranks does not count what a rank's incomplete step lacks as a collective it never entered") {
  const tptest::TempDir tmp;
  fs::copy(std::string(TORCHPROBE_TESTS_DIR) + "/data/ranks/step0", tmp / "step0", fs::copy_options::recursive);
  const std::string rank2 = tmp / "step0/rank2/dump.json";
  Json doc = tptest::read_json(rank2);
  REQUIRE(doc["data"].contains("Distributed.all_reduce.0.forward"));
  doc["data"].erase("Distributed.all_reduce.0.forward");
  std::ofstream(rank2) << doc.dump(1);
  auto ranks = [&](std::string& text) {
    std::ostringstream out;
    const int rc = tp::compare::ranks::print_views(tp::compare::ranks::view_dump(tmp / "step0"), out);
    text = out.str();
    return rc;
  };
  std::string text;
  CHECK(ranks(text) == 1);  // unmarked: rank 2 never entered the all_reduce
  CHECK(contains(text, "first disagreement: step -1, rank 2, Distributed.all_reduce.0.forward: never entered"));
  doc["torchprobe_recovery"] = {{"complete", false}, {"entries_recovered", 1}, {"missing", "the step was interrupted"}};
  std::ofstream(rank2) << doc.dump(1);
  CHECK(ranks(text) == 0);
  CAPTURE(text);
  CHECK(contains(text,
                 "  rank 2: incomplete, recovered after a crash (missing: the step was interrupted); what it "
                 "lacks is not counted against it\n"));
  CHECK(contains(text, "  Distributed.all_reduce.0.forward  entered by 0,1, not recovered on 2 (incomplete);"));
  CHECK(contains(text, "the ranks agree on every replicated value\n"));
}

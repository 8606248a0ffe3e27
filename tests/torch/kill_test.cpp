// Crash recovery under SIGKILL, for every task that writes a step journal (tensor, statistics with
// md5 and on the device path, overflow_check, free_benchmark, statistics at L2, tensor with
// async_dump): a child process runs a training loop of short steps (level mix, save() in two steps
// of three) beside busy threads of its own that load the machine, so that the step writer falls
// behind, and is killed at a random moment; what it leaves, once `torchprobe recover` has run, is
// compared with an uninterrupted run of the same program (same seeds, same dump path, rank0).
//
// A step is finished when step() has returned: the child writes its number to a progress file
// (write(2)) right after, without waiting for the writer. After each kill: every finished step has
// its files complete, byte for byte the uninterrupted run's (stack.json excepted, which cannot be
// rebuilt from a journal: it may be missing), whether the writer had written them or recovery
// rebuilt them from the journal. The step it was in has nothing, a "lost" report (no dump.json), a
// complete step (step() had returned, the progress line not yet written), or a dump.json marked
// incomplete whose entries are the uninterrupted step's first ones (values still pending at the
// kill may be null). Every .pt file present is byte for byte the uninterrupted run's, and no
// temporary file is left anywhere. JSON files of the open step are read by python3's json.
//
// This is process death only: the journal and the JSON files are not fsync'ed in an order that a
// power loss would respect, and nothing here tests that.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/io/recovery.hpp>
#include <torchprobe/torchprobe.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "child_process.hpp"
#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

constexpr int kSteps = 24;
constexpr int kKills = 3;        // per case, at random moments of the uninterrupted run's length
constexpr int kBusyThreads = 2;  // in the child: the machine is loaded, the writer falls behind

struct KillCase {
  const char* name;
  // Item keys that a journal line may hold as null while the uninterrupted run has a value:
  // values computed at flush (md5 of large tensors off the training thread; statistics on the
  // device path), which a killed process never reached (docs/tensor.md, "Not recoverable").
  std::set<std::string> deferred;
  bool writes_tensors;
  bool saves;  // save() in two steps of three
};
const KillCase kCases[] = {
    {"tensor", {}, true, true},
    {"statistics, summary_mode md5", {"md5"}, false, true},
    {"statistics on the device path", {"Max", "Min", "Mean", "Norm"}, false, true},
    {"overflow_check", {}, true, true},
    {"free_benchmark", {}, false, false},
    {"statistics at L2", {}, false, true},
    {"tensor with async_dump", {}, true, true},
};

bool saves_in_step(const KillCase& kc, int s) { return kc.saves && s % 3 != 2; }

// ---- the child ------------------------------------------------------------------------------

// The same program for every case. exp(200 y) overflows (overflow_check keeps those entries and
// their tensors); the 1 MiB sigmoid takes md5's off-thread path and the tensor writer's direct I/O.
// Right after each step() the step's number is appended to `progress_fd` with write(2).
template <class D>
void run_steps(D& dbg, int steps, int progress_fd, bool saves) {
  torch::manual_seed(1234);
  tptest::Net net;
  for (int s = 0; s < steps; ++s) {
    torch::manual_seed(7 + s);
    const auto x = torch::randn({64, 8}, torch::requires_grad());
    const auto big = torch::randn({256, 1024});
    net->zero_grad();
    dbg.start(net, 0);  // rank0: the same directory in every run
    const auto y = net->forward(x);
    const auto z = torch::exp(y * 200);
    torch::sigmoid(big);
    if (saves && s % 3 != 2) dbg.save(y, "y");
    (torch::tanh(y).sum() + z.sum()).backward();
    dbg.stop();
    dbg.step();  // finished: every journal line of the step is written
    const std::string line = std::to_string(s) + "\n";
    if (::write(progress_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::_Exit(5);
  }
}

// Threads that only spin, while the child runs: the machine is loaded.
struct BusyThreads {
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  explicit BusyThreads(int n) {
    for (int i = 0; i < n; ++i)
      threads.emplace_back([this] {
        volatile std::uint64_t k = 0;
        while (!stop.load(std::memory_order_relaxed)) k = k + 1;
      });
  }
  ~BusyThreads() {
    stop = true;
    for (auto& t : threads) t.join();
  }
};

int run_case(int which, const std::string& dir, int steps, const std::string& progress) {
  const BusyThreads busy(kBusyThreads);
  const int fd =
      ::open(progress.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);  // its existence says "ready"
  if (fd < 0) return 3;
  const tp::Options options = tp::Options().dump_path(dir);
  const bool saves = kCases[which].saves;
  if (which == 0) {
    tp::Debugger<tp::Level::Mix, tp::Task::Tensor> dbg(options);
    run_steps(dbg, steps, fd, saves);
  } else if (which == 1) {
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options(options).summary_mode("md5"));
    run_steps(dbg, steps, fd, saves);
  } else if (which == 2) {
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(options);
    dbg.task().force_device_path(true);
    run_steps(dbg, steps, fd, saves);
  } else if (which == 3) {
    tp::Debugger<tp::Level::Mix, tp::Task::OverflowCheck> dbg(tp::Options(options).overflow_nums(-1));
    run_steps(dbg, steps, fd, saves);
  } else if (which == 4) {
    tp::Debugger<tp::Level::L1, tp::Task::FreeBenchmark> dbg(options);
    run_steps(dbg, steps, fd, saves);
  } else if (which == 5) {
    // Into relu only: the calls inside addmm and the backward copies read freshly allocated, not yet
    // written tensors (torch::empty), whose statistics differ from run to run.
    tp::Debugger<tp::Level::L2, tp::Task::Statistics> dbg(tp::Options(options).list({"Aten.relu.0.forward"}));
    run_steps(dbg, steps, fd, saves);
  } else {
    tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(
        tp::Options(options).async_dump(true).list({"sigmoid", "exp", "tanh"}));  // async_dump names what it saves
    run_steps(dbg, steps, fd, saves);
  }
  return 0;
}

struct ChildProgram {
  ChildProgram() {
    const char* mode = std::getenv("TORCHPROBE_TEST_CHILD");
    if (!mode || std::string(mode) != "kill") return;  // not a child, or another test file's
    int rc = 2;
    try {
      torch::set_num_threads(1);
      rc = run_case(std::atoi(std::getenv("TORCHPROBE_TEST_CASE")), std::getenv("TORCHPROBE_TEST_DIR"), kSteps,
                    std::getenv("TORCHPROBE_TEST_PROGRESS"));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child failed: %s\n", e.what());
      rc = 4;
    }
    std::fflush(nullptr);
    std::_Exit(rc);
  }
} child_program;

// ---- what a run left ------------------------------------------------------------------------

std::vector<std::string> names_of(const Json& data) {
  std::vector<std::string> names;
  for (const auto& kv : data.items()) names.push_back(kv.key());
  return names;
}

// A JSON file read by python3's json (NaN and Infinity become strings); {"unreadable": reason}
// when python cannot load it.
Json read_json_file(const std::string& path) {
  int rc = -1;
  const std::string out = tptest::run_python(
      "import json\n"
      "try:\n"
      "    print(json.dumps(json.load(open('" +
          path +
          "'), parse_constant=str)))\n"
          "except Exception as e:\n"
          "    print(json.dumps({'unreadable': repr(e)}))\n",
      &rc);
  CAPTURE(out);
  REQUIRE(rc == 0);
  return Json::parse(out);
}

// Regular files below `dir`, by their path relative to it.
std::set<std::string> files_below(const std::string& dir) {
  std::set<std::string> out;
  if (dir.empty() || !fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (!e.is_directory()) out.insert(fs::relative(e.path(), dir).string());
  return out;
}

// Temporary files (write_file_atomic's and the tensor writer's ".NAME.tmpPID.N", the recovery
// tool's own) and anything else hidden.
std::vector<std::string> leftovers(const std::string& dir) {
  std::vector<std::string> out;
  for (const std::string& f : files_below(dir))
    if (fs::path(f).filename().string()[0] == '.' || f.find(".tmp") != std::string::npos) out.push_back(f);
  return out;
}

std::set<std::string> tensor_files(const std::string& rank) { return files_below(rank + "/dump_tensor_data"); }

bool all_leaves_null(const Json& v) {
  if (v.is_object() || v.is_array()) {
    for (const auto& e : v)
      if (!all_leaves_null(e)) return false;
    return true;
  }
  return v.is_null();
}

// `got` equals `want`, but for keys in `deferred` that are null in `got`.
bool same_but_deferred(const Json& got, const Json& want, const std::set<std::string>& deferred) {
  if (got.is_object() && want.is_object()) {
    if (names_of(got) != names_of(want)) return false;
    for (const auto& kv : want.items()) {
      const Json& g = got[kv.key()];
      if (deferred.count(kv.key()) && g.is_null()) continue;
      if (!same_but_deferred(g, kv.value(), deferred)) return false;
    }
    return true;
  }
  if (got.is_array() && want.is_array()) {
    if (got.size() != want.size()) return false;
    for (std::size_t i = 0; i < got.size(); ++i)
      if (!same_but_deferred(got[i], want[i], deferred)) return false;
    return true;
  }
  return got == want;
}

// The entries of a recovered file are the first ones the uninterrupted step committed, placed in
// dump order, with its values: the uninterrupted step's names in order, less only enclosing calls
// still open at the kill (an entry that is committed at its end, after the calls it runs: its name
// is the parent of a recovered entry in the uninterrupted run's construct.json), and less entries
// after the last one recovered. In debug.json (no parents) they are its first entries; a gradient
// entry may still be the placeholder save() commits (backward had not reached it).
void check_prefix(const Json& data, const Json& full, const std::set<std::string>& deferred, bool debug,
                  const Json& parents = Json::object()) {
  const std::vector<std::string> names = names_of(data), all = names_of(full);
  REQUIRE(names.size() <= all.size());
  std::set<std::string> open_calls;  // parents of recovered entries
  for (const std::string& n : names)
    if (parents.contains(n) && parents[n].is_string()) open_calls.insert(parents[n].get<std::string>());
  std::size_t at = 0;  // in `all`
  for (std::size_t i = 0; i < names.size(); ++i) {
    CAPTURE(names[i]);
    while (at < all.size() && all[at] != names[i]) {
      CAPTURE(all[at]);
      CHECK((!debug && open_calls.count(all[at]) == 1));  // skipped: only a call still open
      ++at;
    }
    REQUIRE(at < all.size());
    ++at;
    if (debug && names[i].find("_grad.") != std::string::npos && all_leaves_null(data[names[i]])) continue;
    CAPTURE(data[names[i]].dump());
    CAPTURE(full[names[i]].dump());
    CHECK(same_but_deferred(data[names[i]], full[names[i]], deferred));
  }
}

}  // namespace

TEST_CASE(
    "a child killed with SIGKILL at random moments of a loaded run: every step whose step() returned is complete, "
    "byte for byte, after recovery; the open one is a marked prefix, for every task that keeps a journal") {
  tptest::TempDir tmp;
  std::mt19937 rng(20240611);
  int rebuilt_total = 0;  // finished steps that only the journal held at the kill (the writer was behind)
  for (int which = 0; which < static_cast<int>(std::size(kCases)); ++which) {
    const KillCase& kc = kCases[which];
    const std::string case_name = kc.name;
    CAPTURE(case_name);
    const std::string root = tmp / std::to_string(which);
    const std::string run = root + "/run";  // every run of the case dumps here: the same paths inside
    fs::create_directories(root);
    auto spawn = [&] {
      return tptest::spawn_child("kill", {"TORCHPROBE_TEST_CASE=" + std::to_string(which), "TORCHPROBE_TEST_DIR=" + run,
                                          "TORCHPROBE_TEST_PROGRESS=" + run + ".progress"});
    };
    auto rank_of = [](const std::string& dump, int s) { return dump + "/step" + std::to_string(s) + "/rank0"; };

    // The uninterrupted run, then moved to `full`.
    const pid_t ref_pid = spawn();
    const auto began = tptest::wait_for_progress(run + ".progress", 0);  // the file exists: the child is ready
    const int ref_status = tptest::wait_child(ref_pid);
    const long ref_us =
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - began).count();
    REQUIRE(WIFEXITED(ref_status));
    REQUIRE(WEXITSTATUS(ref_status) == 0);
    REQUIRE(tptest::progress_lines(run + ".progress") == static_cast<std::size_t>(kSteps));
    const std::string full = root + "/full";
    fs::rename(run, full);
    fs::remove(run + ".progress");
    std::vector<std::set<std::string>> ref_files(kSteps);
    for (int s = 0; s < kSteps; ++s) {
      CAPTURE(s);
      ref_files[s] = files_below(rank_of(full, s));
      REQUIRE(ref_files[s].count("dump.json") == 1);
      REQUIRE(ref_files[s].count("debug.json") == (saves_in_step(kc, s) ? 1u : 0u));
      REQUIRE(tensor_files(rank_of(full, s)).empty() == !kc.writes_tensors);
      CHECK(leftovers(rank_of(full, s)) == std::vector<std::string>{});
      CHECK(ref_files[s].count("journal.jsonl") == 0);
    }
    const Json step0 = read_json_file(rank_of(full, 0) + "/dump.json");
    MESSAGE(case_name << ": uninterrupted loop of " << kSteps << " steps, loaded: " << ref_us / 1000 << " ms, "
                      << step0["data"].size() << " entries and " << tensor_files(rank_of(full, 0)).size()
                      << " .pt files in step 0; files of a step: " << ref_files[0].size());

    // The same file of the uninterrupted run, byte for byte.
    auto same_file = [&](const std::string& rank, int s, const std::string& f) {
      std::string a = tptest::read_text(rank + "/" + f), b = tptest::read_text(rank_of(full, s) + "/" + f);
      if (f == "dump_error_info.log")  // two processes: their times and pids differ
        for (std::string* t : {&a, &b})
          *t = std::regex_replace(std::regex_replace(*t, std::regex(R"(^\[[^\]]*\])", std::regex::multiline), "[T]"),
                                  std::regex(R"(pid=\d+)"), "pid=P");
      return a == b;
    };
    // A finished step: every file of the uninterrupted run's step, byte for byte (stack.json may be
    // missing), and nothing else.
    int stack_missing = 0;
    auto check_finished = [&](const std::string& rank, int s) {
      std::set<std::string> got = files_below(rank), want = ref_files[s];
      if (!got.count("stack.json") && want.erase("stack.json")) ++stack_missing;
      CHECK(got == want);
      for (const std::string& f : got) {
        CAPTURE(f);
        if (want.count(f)) CHECK(same_file(rank, s, f));
      }
    };

    int kills = 0, finished = 0, rebuilt = 0, incomplete = 0, lost = 0, empty = 0, unreported = 0;
    for (int round = 0; round < kKills; ++round) {
      CAPTURE(round);
      const pid_t pid = spawn();
      tptest::wait_for_progress(run + ".progress", 0);
      std::uniform_int_distribution<long> moment(0, ref_us);
      std::this_thread::sleep_for(std::chrono::microseconds(moment(rng)));
      ::kill(pid, SIGKILL);
      const int status = tptest::wait_child(pid);
      if (WIFSIGNALED(status))
        ++kills;
      else
        REQUIRE(WEXITSTATUS(status) == 0);  // it finished first: every step is checked as finished

      std::set<int> done;
      {
        std::ifstream in(run + ".progress");
        for (int s; in >> s;) done.insert(s);
      }
      const int open_step = done.empty() ? 0 : *done.rbegin() + 1;  // steps finish in order
      CHECK(static_cast<int>(done.size()) == open_step);
      std::set<int> present;
      if (fs::exists(run))
        for (const auto& e : fs::directory_iterator(run))
          if (e.path().filename().string().rfind("step", 0) == 0)
            present.insert(std::stoi(e.path().filename().string().substr(4)));
      for (int s : done) CHECK(present.count(s) == 1);
      for (int s : present) CHECK((done.count(s) == 1 || s == open_step));
      for (int s : done)
        if (fs::exists(rank_of(run, s) + "/journal.jsonl")) ++rebuilt;  // the writer had not finished it
      const bool journal = fs::exists(rank_of(run, open_step) + "/journal.jsonl");

      // Recovery, as `torchprobe recover RUN` runs it.
      std::ostringstream out, err;
      const int rc = fs::exists(run) ? tp::io::recovery::run_recover({run}, out, err) : 0;
      CAPTURE(out.str());
      CAPTURE(err.str());
      CHECK((rc == 0 || rc == tp::io::recovery::kIncomplete));
      CHECK(leftovers(run) == std::vector<std::string>{});
      for (int s : done) {
        CAPTURE(s);
        check_finished(rank_of(run, s), s);
        ++finished;
      }
      if (present.count(open_step)) {
        const int s = open_step;
        const std::string rank = rank_of(run, s);
        CAPTURE(s);
        CAPTURE(journal);
        const std::set<std::string> files = files_below(rank);
        CHECK_FALSE(files.count("journal.jsonl"));
        for (const std::string& f : tensor_files(rank)) {  // a .pt file present is the uninterrupted run's
          CAPTURE(f);
          REQUIRE(ref_files[s].count("dump_tensor_data/" + f) == 1);
          CHECK(same_file(rank, s, "dump_tensor_data/" + f));
        }
        if (!files.count("dump.json")) {
          // Killed before its journal held a line: reported lost (or nothing of the step was there).
          const bool reported = out.str().find(rank + ": lost: ") != std::string::npos;
          CHECK(reported == journal);
          CHECK(rc == (journal ? tp::io::recovery::kIncomplete : 0));
          ++(journal ? lost : empty);
        } else {
          const Json dump = read_json_file(rank + "/dump.json");
          if (!dump.contains("torchprobe_recovery")) {
            ++unreported;  // step() had returned, its progress line not yet written
            check_finished(rank, s);
            CHECK(rc == 0);
          } else {
            ++incomplete;
            CHECK(journal);
            CHECK(rc == tp::io::recovery::kIncomplete);
            CHECK(out.str().find(rank + ": incomplete: missing ") != std::string::npos);
            CHECK(dump["torchprobe_recovery"]["complete"] == false);
            CHECK(dump["torchprobe_recovery"]["entries_recovered"] == dump["data"].size());
            const Json full_dump = read_json_file(rank_of(full, s) + "/dump.json");
            const std::string construct = rank_of(full, s) + "/construct.json";
            check_prefix(dump["data"], full_dump["data"], kc.deferred, false,
                         fs::exists(construct) ? read_json_file(construct) : Json::object());
            if (files.count("debug.json")) {
              CHECK(saves_in_step(kc, s));
              check_prefix(read_json_file(rank + "/debug.json")["data"],
                           read_json_file(rank_of(full, s) + "/debug.json")["data"], kc.deferred, true);
            }
            CHECK(tptest::read_text(rank + "/dump_error_info.log").find("incomplete: recovered") != std::string::npos);
          }
        }
      } else {
        CHECK(rc == 0);
      }
      tptest::remove_tree(run);
      fs::remove(run + ".progress");
    }
    MESSAGE(case_name << ": kills " << kills << ", finished steps checked " << finished << " (rebuilt from the journal "
                      << rebuilt << ", stack.json missing " << stack_missing << "), open step: incomplete "
                      << incomplete << ", lost " << lost << ", empty " << empty << ", finished but unreported "
                      << unreported);
    CHECK(finished > 0);
    rebuilt_total += rebuilt;
  }
  // The point of the test: steps that step() had finished and the writer had not yet written.
  CHECK(rebuilt_total > 0);
}

// Crash recovery under SIGKILL, for every task that writes a step journal: a child process runs a
// training loop (level mix, with save() in two steps of three) and is killed at a random moment;
// what it leaves is compared with an uninterrupted run of the same program (same seeds).
//
// After each kill: every step the child reported finished has its complete dump.json (and
// debug.json where save() ran), equal to the uninterrupted run's, and no journal. The step it was
// in has either nothing in its rank directory or a journal that tools/recover_dump.py turns into a
// prefix of the uninterrupted step. Every .pt file present is byte for byte the uninterrupted
// run's, and no temporary file is left anywhere. JSON files are read by python3's json.
//
// This is process death only: the journal and the JSON files are not fsync'ed in an order that a
// power loss would respect, and nothing here tests that.
#include <torch/torch.h>
#include <doctest/doctest.h>

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
#include <set>
#include <thread>

#include "child_process.hpp"
#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

constexpr int kSteps = 8;
constexpr int kKills = 4;  // per case, at a random moment inside steps 0, 2, 4 and 6

struct KillCase {
  const char* name;
  // Item keys that a journal line may hold as null while the uninterrupted run has a value:
  // values computed at flush (md5 of large tensors off the training thread; statistics on the
  // device path), which a killed process never reached (docs/tensor.md, "Not recoverable").
  std::set<std::string> deferred;
  bool writes_tensors;
};
const KillCase kCases[] = {
    {"tensor", {}, true},
    {"statistics, summary_mode md5", {"md5"}, false},
    {"statistics on the device path", {"Max", "Min", "Mean", "Norm"}, false},
    {"overflow_check", {}, true},
};

bool saves_in_step(int s) { return s % 3 != 2; }

// ---- the child ------------------------------------------------------------------------------

// The same program for every case. exp(200 y) overflows (overflow_check keeps those entries and
// their tensors); the 1 MiB sigmoid takes md5's off-thread path and the tensor writer's direct I/O.
// After each step() and wait_written() the step's number is appended to `progress_fd`.
template <class D>
void run_steps(D& dbg, int steps, int progress_fd) {
  torch::manual_seed(1234);
  tptest::Net net;
  for (int s = 0; s < steps; ++s) {
    torch::manual_seed(7 + s);
    const auto x = torch::randn({64, 8}, torch::requires_grad());
    const auto big = torch::randn({256, 1024});
    net->zero_grad();
    dbg.start(net);
    const auto y = net->forward(x);
    const auto z = torch::exp(y * 200);
    torch::sigmoid(big);
    if (saves_in_step(s)) dbg.save(y, "y");
    (torch::tanh(y).sum() + z.sum()).backward();
    dbg.stop();
    dbg.step();
    dbg.wait_written();  // step() hands the step to the writer's thread: "finished" means on disk
    const std::string line = std::to_string(s) + "\n";
    if (::write(progress_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::_Exit(5);
  }
}

int run_case(int which, const std::string& dir, int steps, const std::string& progress) {
  const int fd =
      ::open(progress.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);  // its existence says "ready"
  if (fd < 0) return 3;
  const tp::Options options = tp::Options().dump_path(dir);
  if (which == 0) {
    tp::Debugger<tp::Level::Mix, tp::Task::Tensor> dbg(options);
    run_steps(dbg, steps, fd);
  } else if (which == 1) {
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options(options).summary_mode("md5"));
    run_steps(dbg, steps, fd);
  } else if (which == 2) {
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(options);
    dbg.task().force_device_path(true);
    run_steps(dbg, steps, fd);
  } else {
    tp::Debugger<tp::Level::Mix, tp::Task::OverflowCheck> dbg(tp::Options(options).overflow_nums(-1));
    run_steps(dbg, steps, fd);
  }
  return 0;
}

struct ChildProgram {
  ChildProgram() {
    const char* mode = std::getenv("TORCHPROBE_TEST_CHILD");
    if (!mode || std::string(mode) != "kill") return;  // not a child, or another test file's
    int rc = 2;
    try {
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

// Every *.json file below `root`, loaded by python3's json (NaN and Infinity become strings), as
// {"step3/dump.json": ...}: the rank directory is left out of the key. A file that python cannot
// load appears as {"unreadable": reason}. With `recover`: {"before": files, "rc": what
// tools/recover_dump.py returned for `root`, "after": files} (one python process per kill).
Json read_json_files(const std::string& root, bool recover) {
  int rc = -1;
  const std::string out = tptest::run_python(
      "import contextlib, io, json, os, sys\n"
      "sys.path.insert(0, '" +
          std::string(TORCHPROBE_TESTS_DIR) +
          "/../tools')\n"
          "import recover_dump\n"
          "root = '" +
          root +
          "'\n"
          "def read():\n"
          "    out = {}\n"
          "    for base, dirs, files in os.walk(root):\n"
          "        for f in files:\n"
          "            if not f.endswith('.json'): continue\n"
          "            parts = os.path.relpath(os.path.join(base, f), root).split(os.sep)\n"
          "            key = '/'.join(parts[:1] + parts[2:])\n"
          "            try:\n"
          "                out[key] = json.load(open(os.path.join(base, f)), parse_constant=str)\n"
          "            except Exception as e:\n"
          "                out[key] = {'unreadable': repr(e)}\n"
          "    return out\n"
          "if " +
          std::string(recover ? "True" : "False") +
          ":\n"
          "    before = read()\n"
          "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
          "        # killed before the Debugger made its first directory: nothing to recover (the tool says\n"
          "        # 'does not exist', status 1)\n"
          "        rc = recover_dump.main([root]) if os.path.isdir(root) else 0\n"
          "    print(json.dumps({'before': before, 'rc': rc, 'after': read()}))\n"
          "else:\n"
          "    print(json.dumps(read()))\n",
      &rc);
  CAPTURE(out);
  REQUIRE(rc == 0);
  return Json::parse(out);
}

std::string rank_dir_of(const std::string& step_dir) {
  std::vector<std::string> ranks;
  for (const auto& e : fs::directory_iterator(step_dir)) ranks.push_back(e.path().string());
  REQUIRE(ranks.size() <= 1);
  return ranks.empty() ? std::string() : ranks.front();
}

// Regular files below `dir`, by their path relative to it.
std::set<std::string> files_below(const std::string& dir) {
  std::set<std::string> out;
  if (dir.empty() || !fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (!e.is_directory()) out.insert(fs::relative(e.path(), dir).string());
  return out;
}

// Temporary files (write_file_atomic's and the tensor writer's ".NAME.tmpPID.N") and anything
// else hidden.
std::vector<std::string> leftovers(const std::string& rank) {
  std::vector<std::string> out;
  for (const std::string& f : files_below(rank))
    if (fs::path(f).filename().string()[0] == '.' || f.find(".tmp") != std::string::npos) out.push_back(f);
  return out;
}

std::set<std::string> tensor_files(const std::string& rank) {
  return files_below(rank.empty() ? rank : rank + "/dump_tensor_data");
}

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

// The entries of a recovered file are the first ones of the uninterrupted step's, in order, with
// its values. In debug.json a gradient entry may still be the placeholder save() commits (backward
// had not reached it).
void check_prefix(const Json& data, const Json& full, const std::set<std::string>& deferred, bool debug) {
  const std::vector<std::string> names = names_of(data), all = names_of(full);
  REQUIRE(names.size() <= all.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    CAPTURE(names[i]);
    REQUIRE(names[i] == all[i]);
    if (debug && names[i].find("_grad.") != std::string::npos && all_leaves_null(data[names[i]])) continue;
    CAPTURE(data[names[i]].dump());
    CAPTURE(full[names[i]].dump());
    CHECK(same_but_deferred(data[names[i]], full[names[i]], deferred));
  }
}

}  // namespace

TEST_CASE(
    "a child killed with SIGKILL at random points leaves complete finished steps and a recoverable prefix, for every "
    "task") {
  tptest::TempDir tmp;
  std::mt19937 rng(20240611);
  for (int which = 0; which < static_cast<int>(std::size(kCases)); ++which) {
    const KillCase& kc = kCases[which];
    const std::string case_name = kc.name;
    CAPTURE(case_name);
    const std::string root = tmp / std::to_string(which);
    fs::create_directories(root);
    auto spawn = [&](const std::string& dir) {
      return tptest::spawn_child("kill", {"TORCHPROBE_TEST_CASE=" + std::to_string(which), "TORCHPROBE_TEST_DIR=" + dir,
                                          "TORCHPROBE_TEST_PROGRESS=" + dir + ".progress"});
    };

    // The uninterrupted run and when each step ended. Kills are spread over steps, not over time:
    // step 0 takes most of it (libtorch's first calls, the first stack symbolized) and varies.
    const std::string ref = root + "/full";
    const pid_t ref_pid = spawn(ref);
    const auto began = tptest::wait_for_progress(ref + ".progress", 0);  // the file exists: the child is ready
    std::vector<long> step_end_us;                                       // after `began`
    int ref_status = 0;
    for (pid_t r = 0; r != ref_pid; std::this_thread::sleep_for(std::chrono::microseconds(500))) {
      r = ::waitpid(ref_pid, &ref_status, WNOHANG);
      REQUIRE((r >= 0 || errno == EINTR));
      while (step_end_us.size() < tptest::progress_lines(ref + ".progress"))
        step_end_us.push_back(
            std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - began).count());
    }
    REQUIRE(WIFEXITED(ref_status));
    REQUIRE(WEXITSTATUS(ref_status) == 0);
    const Json full = read_json_files(ref, false);
    std::vector<std::string> ref_rank(kSteps);
    for (int s = 0; s < kSteps; ++s) {
      ref_rank[s] = rank_dir_of(ref + "/step" + std::to_string(s));
      const std::string key = "step" + std::to_string(s);
      REQUIRE(full.contains(key + "/dump.json"));
      REQUIRE(full[key + "/dump.json"]["data"].size() >= 1);
      REQUIRE(full.contains(key + "/debug.json") == saves_in_step(s));
      REQUIRE(tensor_files(ref_rank[s]).empty() == !kc.writes_tensors);
    }
    CHECK(full.dump().find("\"unreadable\"") == std::string::npos);
    REQUIRE(step_end_us.size() == static_cast<std::size_t>(kSteps));
    MESSAGE(case_name << ": uninterrupted loop of " << kSteps << " steps: " << step_end_us.back() / 1000
                      << " ms (step 0: " << step_end_us[0] / 1000 << " ms), " << full["step0/dump.json"]["data"].size()
                      << " entries and " << tensor_files(ref_rank[0]).size() << " .pt files in step 0");

    // A .pt file present is the uninterrupted run's file of the same name, byte for byte.
    auto check_tensor_bytes = [&](const std::string& rank, int s) {
      for (const std::string& f : tensor_files(rank)) {
        CAPTURE(f);
        const std::string theirs = ref_rank[s] + "/dump_tensor_data/" + f;
        REQUIRE(fs::exists(theirs));
        CHECK(tptest::read_text(rank + "/dump_tensor_data/" + f) == tptest::read_text(theirs));
      }
    };
    // A finished step: complete, equal to the uninterrupted run's, without journal or temporary file.
    auto check_finished_files = [&](const std::string& rank, int s) {
      CHECK_FALSE(fs::exists(rank + "/journal.jsonl"));
      CHECK(leftovers(rank) == std::vector<std::string>{});
      CHECK(tensor_files(rank) == tensor_files(ref_rank[s]));
      check_tensor_bytes(rank, s);
    };
    auto check_finished_json = [&](const Json& got, int s) {
      const std::string key = "step" + std::to_string(s);
      REQUIRE(got.contains(key + "/dump.json"));
      const Json& data = got[key + "/dump.json"]["data"];
      CHECK(names_of(data) == names_of(full[key + "/dump.json"]["data"]));
      CHECK(data == full[key + "/dump.json"]["data"]);
      REQUIRE(got.contains(key + "/debug.json") == saves_in_step(s));
      if (saves_in_step(s)) CHECK(got[key + "/debug.json"]["data"] == full[key + "/debug.json"]["data"]);
    };

    int kills = 0, finished = 0, recovered = 0, empty = 0, unreported = 0;
    for (int round = 0; round < kKills; ++round) {
      CAPTURE(round);
      const std::string dir = root + "/kill" + std::to_string(round);
      const pid_t pid = spawn(dir);
      // Inside step `target`: once the child has reported the steps before it, within that step's
      // length in the uninterrupted run.
      const int target = round * kSteps / kKills;
      tptest::wait_for_progress(dir + ".progress", target);
      std::uniform_int_distribution<long> moment(0, step_end_us[target] - (target == 0 ? 0 : step_end_us[target - 1]));
      std::this_thread::sleep_for(std::chrono::microseconds(moment(rng)));
      ::kill(pid, SIGKILL);
      const int status = tptest::wait_child(pid);
      if (WIFSIGNALED(status))
        ++kills;
      else
        REQUIRE(WEXITSTATUS(status) == 0);  // it finished first: every step is checked as finished

      std::set<int> done;
      {
        std::ifstream in(dir + ".progress");
        for (int s; in >> s;) done.insert(s);
      }
      const int open_step = done.empty() ? 0 : *done.rbegin() + 1;  // steps finish in order
      CHECK(static_cast<int>(done.size()) == open_step);
      std::map<int, std::string> ranks;  // step -> rank directory ("" when it has none)
      if (fs::exists(dir))
        for (const auto& e : fs::directory_iterator(dir))
          ranks[std::stoi(e.path().filename().string().substr(4))] = rank_dir_of(e.path().string());
      for (int s : done) CHECK(ranks.count(s) == 1);
      for (const auto& [s, rank] : ranks) CHECK((done.count(s) == 1 || s == open_step));

      for (int s : done) {
        CAPTURE(s);
        check_finished_files(ranks[s], s);
      }
      const bool journal = ranks.count(open_step) && fs::exists(ranks[open_step] + "/journal.jsonl");
      const Json files = read_json_files(dir, true);
      const Json &before = files["before"], &after = files["after"];
      for (int s : done) {
        CAPTURE(s);
        check_finished_json(before, s);
      }
      CHECK(files["rc"] == 0);
      CHECK(before.dump().find("\"unreadable\"") ==
            std::string::npos);  // written whole or not at all, the open step's too
      CHECK(after.dump().find("\"unreadable\"") == std::string::npos);
      for (int s : done) {
        CAPTURE(s);
        check_finished_files(ranks[s], s);  // recovery leaves finished steps alone
        check_finished_json(after, s);
        ++finished;
      }
      if (!ranks.count(open_step)) continue;
      const int s = open_step;
      const std::string key = "step" + std::to_string(s), rank = ranks[s];
      CAPTURE(s);
      CAPTURE(journal);
      CHECK_FALSE(fs::exists(rank + "/journal.jsonl"));
      CHECK(leftovers(rank) == std::vector<std::string>{});
      if (journal) {
        ++recovered;
        REQUIRE(after.contains(key + "/dump.json"));
        check_prefix(after[key + "/dump.json"]["data"], full[key + "/dump.json"]["data"], kc.deferred, false);
        if (before.contains(key + "/dump.json"))  // killed after step() wrote it: the journal held at least as much
          CHECK(after[key + "/dump.json"]["data"].size() >= before[key + "/dump.json"]["data"].size());
        if (after.contains(key + "/debug.json")) {
          CHECK(saves_in_step(s));
          check_prefix(after[key + "/debug.json"]["data"], full[key + "/debug.json"]["data"], kc.deferred, true);
        }
        check_tensor_bytes(rank, s);
      } else if (after.contains(key + "/dump.json")) {
        ++unreported;  // killed after step() had finished the step, before the child reported it
        check_finished_files(rank, s);
        check_finished_json(after, s);
      } else {
        ++empty;  // killed before the journal was in place: nothing of the step was recorded
        CHECK(files_below(rank) == std::set<std::string>{});
      }
    }
    MESSAGE(case_name << ": kills " << kills << ", finished steps checked " << finished << ", journals recovered "
                      << recovered << ", empty rank directories " << empty << ", finished but unreported "
                      << unreported);
    CHECK(finished > 0);
    CHECK(recovered > 0);
  }
}

// Disk trouble for real. A size-limited tmpfs fills up under the dump, so that the journal's lines,
// the journal itself, dump.json and stack.json fail with ENOSPC; and dump directories are removed
// while a step runs. Training must give the same values as without the probe, each failure must be
// reported, and tools/recover_dump.py must rebuild from the kept journals, once there is room again,
// the same dump.json as a run on a normal disk.
//
// Where the errors go when the disk is full: dump_error_info.log needs room too. An entry that
// cannot be written goes to stderr at once (with its reason) and is kept, then written in its place
// at the next flush (or the next entry) once there is room; the test pins both.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <set>
#include <thread>
#include <vector>

#include "recover_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using tptest::contains;

namespace {

using Probe = tp::Debugger<tp::Level::Mix, tp::Task::Statistics>;
constexpr std::size_t kPage = 4096;  // tmpfs counts whole pages against its size
std::size_t pages(std::size_t bytes) { return (bytes + kPage - 1) / kPage; }

// A tmpfs of `bytes` on a fresh directory (mounting needs root) and a filler file that sets how
// much room is left on it.
class SmallDisk {
 public:
  explicit SmallDisk(std::size_t bytes) {
    if (::mount("tmpfs", dir_.path().c_str(), "tmpfs", 0, ("size=" + std::to_string(bytes)).c_str()) != 0) {
      why_ = tp::io::errno_text(errno);
      return;
    }
    mounted_ = true;
    filler_ = ::open(filler_path().c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  }
  ~SmallDisk() {
    if (filler_ >= 0) ::close(filler_);
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_ && filler_ >= 0; }
  const std::string& why() const { return why_; }
  std::string operator/(const std::string& rel) const { return dir_ / rel; }
  std::string filler_path() const { return dir_ / "filler"; }

  std::size_t free_bytes() const {
    struct statvfs st {};
    REQUIRE(::statvfs(dir_.path().c_str(), &st) == 0);
    return st.f_bavail * st.f_frsize;
  }
  // Grows or shrinks the filler so that exactly `bytes` (whole pages) are left.
  void leave_free(std::size_t bytes) {
    struct stat st {};
    REQUIRE(::fstat(filler_, &st) == 0);
    const off_t target = st.st_size + static_cast<off_t>(free_bytes()) - static_cast<off_t>(bytes);
    REQUIRE(target >= 0);
    if (target > st.st_size)
      REQUIRE(::fallocate(filler_, 0, 0, target) == 0);
    else
      REQUIRE(::ftruncate(filler_, target) == 0);
    REQUIRE(free_bytes() == bytes);
  }

 private:
  tptest::TempDir dir_;
  bool mounted_ = false;
  int filler_ = -1;
  std::string why_;
};

// Catches what is written to fd 2 (std::cerr, the error log's fallback) in a file while it lives.
class StderrCapture {
 public:
  StderrCapture() {
    std::fflush(stderr);
    saved_ = ::dup(STDERR_FILENO);
    const int fd = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  ~StderrCapture() { restore(); }
  void restore() {
    if (saved_ < 0) return;
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  std::string text() const { return tptest::read_text(file_); }
  // Waits (up to 20 s) until `part` has been written.
  bool wait_for(const std::string& part) const {
    for (int i = 0; i < 2000; ++i, std::this_thread::sleep_for(std::chrono::milliseconds(10)))
      if (contains(text(), part)) return true;
    return false;
  }

 private:
  tptest::TempDir dir_;
  std::string file_ = dir_ / "stderr.txt";
  int saved_ = -1;
};

// `steps` steps of training Net with plain SGD, each with four batches and an evaluation after the
// backward pass; with `dbg` every step is dumped (start, ..., stop, step). `at(step, point)` runs at
// the points "start", "mid" (after backward), "stop" and "step". Returns every loss, evaluation
// and gradient, to compare runs value for value.
std::vector<at::Tensor> train(Probe* dbg, int steps, const std::function<void(int, const std::string&)>& at = {}) {
  auto hook = [&](int s, const char* point) {
    if (at) at(s, point);
  };
  torch::manual_seed(42);
  tptest::Net net;
  std::vector<at::Tensor> values;
  for (int s = 0; s < steps; ++s) {
    const at::Tensor x = torch::randn({4, 16, 8}), x_eval = torch::randn({16, 8});
    net->zero_grad();
    hook(s, "start");
    if (dbg) dbg->start(net);
    at::Tensor loss = torch::zeros({});
    for (int b = 0; b < 4; ++b) loss = loss + net->forward(x[b]).pow(2).mean();
    loss.backward();
    hook(s, "mid");
    const at::Tensor eval = net->forward(x_eval).sum();
    hook(s, "stop");
    // The writer's thread writes what stop() and step() hand over; the disk's state at each point
    // is set for the write of that point, so each write is waited for.
    if (dbg) {
      dbg->stop();
      dbg->wait_written();
    }
    hook(s, "step");
    if (dbg) {
      dbg->step();
      dbg->wait_written();
    }
    values.push_back(loss.detach().clone());
    values.push_back(eval.detach().clone());
    torch::NoGradGuard no_grad;
    for (at::Tensor& p : net->parameters()) {
      values.push_back(p.grad().clone());
      p.sub_(0.1 * p.grad());
    }
  }
  return values;
}

void check_same_values(const std::vector<at::Tensor>& probed, const std::vector<at::Tensor>& plain) {
  REQUIRE(probed.size() == plain.size());
  for (std::size_t i = 0; i < plain.size(); ++i) {
    CAPTURE(i);
    CHECK(torch::equal(probed[i], plain[i]));
  }
}

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

std::string rank_dir(const std::string& dump_path, int step) {
  return dump_path + "/step" + std::to_string(step) + "/" + tptest::rank_name();
}

}  // namespace

TEST_CASE(
    "a full disk (tmpfs): journal, dump.json and stack.json fail with ENOSPC, training goes on, recover_dump.py "
    "rebuilds the steps" *
    TP_NEEDS("root")) {
  SmallDisk disk(8 << 20);
  if (!disk.mounted()) TP_SKIP("cannot mount a tmpfs here (" << disk.why() << "); needs root");
  const std::vector<at::Tensor> plain = train(nullptr, 4);

  // The same run on a normal disk: the expected files, and how large each step's files are.
  tptest::TempDir normal;
  std::vector<std::size_t> journal_size(4);
  {
    Probe dbg(tp::Options().dump_path(normal.path()));
    train(&dbg, 4, [&](int s, const std::string& point) {
      if (point == "step") journal_size[s] = fs::file_size(rank_dir(normal.path(), s) + "/journal.jsonl");
    });
  }
  auto size_of = [&](int s, const char* file) { return fs::file_size(rank_dir(normal.path(), s) + "/" + file); };
  REQUIRE(pages(size_of(0, "dump.json")) >= 2);
  REQUIRE(pages(size_of(2, "stack.json")) >= 2);
  REQUIRE(pages(journal_size[3]) >= 3);

  const std::string dump = disk / "dump";
  const std::string r0 = rank_dir(dump, 0), r1 = rank_dir(dump, 1), r2 = rank_dir(dump, 2), r3 = rank_dir(dump, 3);
  const std::string enospc = tp::io::errno_text(ENOSPC);
  StderrCapture err;
  std::vector<at::Tensor> probed;
  std::string journal3_copy;
  {
    Probe dbg(tp::Options().dump_path(dump));
    probed = train(&dbg, 4, [&](int s, const std::string& point) {
      if (point == "start")
        fs::create_directories(rank_dir(dump, s));  // directories take no pages; made now, they are not counted
      if (s == 0 && point == "start")
        disk.leave_free((pages(journal_size[0]) + 1) * kPage);  // the journal, and one page for the log
      if (s == 1 && point == "start") disk.leave_free(0);       // not even the journal's first line fits
      if (s == 1 && point == "mid") disk.leave_free(1 << 20);
      if (s == 2 && point == "start")  // the journal and dump.json fit, with one page left for the log
        disk.leave_free((pages(journal_size[2]) + pages(size_of(2, "dump.json")) + 1) * kPage);
      if (s == 3 && point == "start") disk.leave_free(kPage);  // the journal's header, then its lines fail
      if (s == 3 && point == "mid") {
        REQUIRE(err.wait_for("cannot write the journal '" + r3 + "/journal.jsonl'"));
        disk.leave_free(1 << 20);  // room again: the evaluation's lines are written
      }
      if (s == 3 && point == "step") {  // the journal as a process killed now would leave it
        journal3_copy = disk / "copy/step3/" + tptest::rank_name();
        fs::create_directories(journal3_copy);
        fs::copy_file(r3 + "/journal.jsonl", journal3_copy + "/journal.jsonl");
      }
    });
  }
  err.restore();
  const std::string stderr_text = err.text();
  CAPTURE(stderr_text);
  check_same_values(probed, plain);
  auto log_of = [](const std::string& rank) { return tptest::read_text(rank + "/dump_error_info.log"); };

  // Step 0: dump.json did not fit; the journal is kept.
  CHECK(contains(stderr_text, "torchprobe: could not write the dump of step 0: torchprobe: cannot write file '" + r0 +
                                  "/dump.json': " + enospc));
  CHECK(contains(log_of(r0), "] [ERROR] write_json failed: name=" + r0 + ", pid="));
  CHECK(contains(log_of(r0), "cannot write file '" + r0 + "/dump.json': " + enospc));
  CHECK(files_in(r0) == std::set<std::string>{"journal.jsonl", "dump_error_info.log"});
  // Step 1: its journal could not be created. start() went on, the error went to stderr at once and
  // to the log once there was room; the step was dumped whole, and step 0's kept journal is untouched.
  const std::string journal_error = "cannot write file '" + r1 + "/journal.jsonl': " + enospc;
  CHECK(contains(stderr_text, "torchprobe: cannot write '" + r1 + "/dump_error_info.log' (" + enospc +
                                  "); write_journal failed: name=" + r1 + ": torchprobe: " + journal_error));
  CHECK(contains(log_of(r1), "] [ERROR] write_journal failed: name=" + r1 + ", pid="));
  CHECK(contains(log_of(r1), journal_error));
  CHECK(files_in(r1) == std::set<std::string>{"dump.json", "stack.json", "construct.json", "dump_error_info.log"});
  CHECK(tptest::compare_dump_files(r1 + "/dump.json", rank_dir(normal.path(), 1) + "/dump.json") == "SAME\n");
  // Step 2: dump.json was written, stack.json did not fit; the journal is kept.
  CHECK(contains(log_of(r2), "cannot write file '" + r2 + "/stack.json': " + enospc));
  CHECK(files_in(r2) == std::set<std::string>{"journal.jsonl", "dump.json", "dump_error_info.log"});
  CHECK(tptest::compare_dump_files(r2 + "/dump.json", rank_dir(normal.path(), 2) + "/dump.json") == "SAME\n");
  // Step 3: journal lines failed mid-step; dump.json (from memory) is complete and the journal gone.
  CHECK(contains(log_of(r3), "] [ERROR] write_journal failed: name="));
  CHECK(contains(log_of(r3), "cannot write the journal '" + r3 + "/journal.jsonl': " + enospc));
  CHECK(files_in(r3) == std::set<std::string>{"dump.json", "stack.json", "construct.json", "dump_error_info.log"});
  CHECK(tptest::compare_dump_files(r3 + "/dump.json", rank_dir(normal.path(), 3) + "/dump.json") == "SAME\n");

  // Room again: the kept journals rebuild steps 0 and 2 as the normal disk has them.
  REQUIRE(::unlink(disk.filler_path().c_str()) == 0);
  const tptest::ToolRun r = tptest::run_recover_tool(dump);
  CAPTURE(r.out);
  CAPTURE(r.err);
  CHECK(r.rc == 0);
  for (const int s : {0, 2}) {
    CAPTURE(s);
    const std::string ours = rank_dir(dump, s), theirs = rank_dir(normal.path(), s);
    const std::size_t entries = tptest::read_json(theirs + "/dump.json")["data"].size();
    CHECK(contains(r.out, ours + ": recovered " + std::to_string(entries) +
                              " dump entries and 0 debug entries (dump.json, construct.json)\n"));
    CHECK(tptest::compare_dump_files(ours + "/dump.json", theirs + "/dump.json") == "SAME\n");
    CHECK(tptest::compare_json_files(ours + "/construct.json", theirs + "/construct.json") == "SAME\n");
    CHECK(files_in(ours) ==
          std::set<std::string>{"dump.json", "construct.json", "dump_error_info.log"});  // stack.json cannot be rebuilt
  }

  // Step 3's journal lost the lines that did not fit, but whole: the lines written after them are
  // readable, and every entry recovered from it is the normal disk's. Copied before step() ended the
  // step, it has no trailer: recovered, and marked incomplete (exit status 3).
  const tptest::ToolRun r3run = tptest::run_recover_tool(journal3_copy);
  CAPTURE(r3run.out);
  CAPTURE(r3run.err);
  CHECK(r3run.rc == 3);
  CHECK(contains(r3run.out, journal3_copy + ": incomplete: missing the step was interrupted"));
  CHECK(tptest::read_json(journal3_copy + "/dump.json")["torchprobe_recovery"]["complete"] == false);
  CHECK(tptest::run_python(
            "import json\n"
            "ours = json.load(open('" +
            journal3_copy +
            "/dump.json'))['data']\n"
            "full = json.load(open('" +
            rank_dir(normal.path(), 3) +
            "/dump.json'))['data']\n"
            "names = [n for n in full if n in ours]\n"
            "ok = list(ours) == names and all(ours[n] == full[n] for n in names)\n"
            "print(ok, 0 < len(ours) < len(full), any(n.startswith('Module.fc.Linear.forward.4') for n in ours))\n") ==
        "True True True\n");
}

TEST_CASE(
    "a dump directory removed while the step runs: no crash, the same training, the failure reported, the next step "
    "dumped") {
  const std::vector<at::Tensor> plain = train(nullptr, 2);
  tptest::TempDir normal;
  {
    Probe dbg(tp::Options().dump_path(normal.path()));
    train(&dbg, 2);
  }
  for (const std::string removed : {"rank directory", "dump_path"}) {
    CAPTURE(removed);
    tptest::TempDir tmp;
    const std::string dump = tmp / "dump", r0 = rank_dir(dump, 0), r1 = rank_dir(dump, 1);
    StderrCapture err;
    std::vector<at::Tensor> probed;
    {
      Probe dbg(tp::Options().dump_path(dump));
      probed = train(&dbg, 2, [&](int s, const std::string& point) {
        if (s == 0 && point == "mid") tptest::remove_tree(removed == "dump_path" ? dump : r0);
      });
    }
    err.restore();
    const std::string stderr_text = err.text();
    CAPTURE(stderr_text);
    check_same_values(probed, plain);
    // The step's files cannot be written: reported on stderr and in a log in the directory made
    // again for it; nothing else of the step is written there.
    const std::string failure = "cannot write file '" + r0 + "/dump.json': " + tp::io::errno_text(ENOENT);
    CHECK(contains(stderr_text, "torchprobe: could not write the dump of step 0: torchprobe: " + failure));
    CHECK(files_in(r0) == std::set<std::string>{"dump_error_info.log"});
    CHECK(
        contains(tptest::read_text(r0 + "/dump_error_info.log"), "] [ERROR] write_json failed: name=" + r0 + ", pid="));
    CHECK(contains(tptest::read_text(r0 + "/dump_error_info.log"), failure));
    // The next step is dumped whole.
    CHECK(files_in(r1) == std::set<std::string>{"dump.json", "stack.json", "construct.json"});
    CHECK(tptest::compare_dump_files(r1 + "/dump.json", rank_dir(normal.path(), 1) + "/dump.json") == "SAME\n");
  }
}

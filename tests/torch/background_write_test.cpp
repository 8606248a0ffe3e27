// Steps written off the training thread (details/step_writer.hpp): with DirectorySink, stop() and
// step() hand the step over and return; wait_written() and the destructor wait for the files.
// The writer's pause() (a test hook) holds the jobs, so that "handed over, not written yet" is a
// state the tests can look at rather than a race they might lose.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;

namespace {

// DirectorySink written by stop()/step() themselves: the reference for byte equality.
struct ForegroundDirectorySink : tp::DirectorySink {
  static constexpr bool writes_in_background = false;
};

// Which steps were written, in what order, and on which thread.
struct LoggingSink : tp::DirectorySink {
  static std::vector<std::int64_t>& steps() {
    static std::vector<std::int64_t> s;
    return s;
  }
  static std::vector<std::thread::id>& threads() {
    static std::vector<std::thread::id> t;
    return t;
  }
  void write_step(const tp::StepDump& d) {
    steps().push_back(d.step);
    threads().push_back(std::this_thread::get_id());
    tp::DirectorySink::write_step(d);
  }
};

// One step of a few ops, the same call sites for every debugger (stack.json names them).
__attribute__((noinline)) void one_step(tp::DebuggerInterface& dbg, int ops) {
  const auto a = torch::arange(16, torch::kFloat32);
  const auto b = torch::full({16}, 0.5f);
  dbg.start_with(tp::ModelRef{}, std::nullopt);
  for (int i = 0; i < ops; ++i) torch::add(a, b * i);
  torch::relu(a - 3);
  dbg.stop();
  dbg.step();
}

// one_step() for each debugger from one call site (a loop the compiler cannot unroll), so that
// their stack.json files name the same frames.
__attribute__((noinline)) void one_step_each(const std::vector<tp::DebuggerInterface*>& debuggers, int ops) {
  for (tp::DebuggerInterface* d : debuggers) one_step(*d, ops);
}

using Stats = tp::Debugger<tp::Level::L1, tp::Task::Statistics>;

std::string rank_of(const std::string& dump_path, int step) {
  return dump_path + "/step" + std::to_string(step) + "/proc" + std::to_string(::getpid());
}

}  // namespace

TEST_CASE(
    "stop() and step() hand the step to the writer; wait_written() makes the files complete and byte-identical to a "
    "write on the training thread") {
  tptest::TempDir tmp;
  Stats bg(tp::Options().dump_path(tmp / "bg"));
  tp::Debugger<tp::Level::L1, tp::Task::Statistics, ForegroundDirectorySink> fg(tp::Options().dump_path(tmp / "fg"));
  bg.background_writer().pause();
  one_step_each({&bg, &fg}, 5);
  // The foreground sink wrote in step(); the background one has only handed the step over.
  const std::string b = rank_of(tmp / "bg", 0), f = rank_of(tmp / "fg", 0);
  CHECK(fs::exists(f + "/dump.json"));
  CHECK_FALSE(fs::exists(b + "/dump.json"));
  CHECK(fs::exists(b + "/journal.jsonl"));                  // the step is recoverable meanwhile
  CHECK(bg.background_writer().stats().pending_jobs == 2);  // the step's write, then its journal's removal

  bg.background_writer().resume();
  bg.wait_written();
  CHECK(bg.background_writer().stats().pending_jobs == 0);
  CHECK_FALSE(fs::exists(b + "/journal.jsonl"));
  for (const char* file : {"dump.json", "stack.json", "construct.json"}) {
    CAPTURE(file);
    REQUIRE(fs::exists(b + "/" + file));
    CHECK(tptest::read_text(b + "/" + file) == tptest::read_text(f + "/" + file));
  }
  // Read by python3: the entries of the step, in call order.
  int rc = -1;
  const std::string out = tptest::run_python(
      "import json\nd = json.load(open('" + b + "/dump.json'))\n" + "print(' '.join(d['data']))\n", &rc);
  CHECK(rc == 0);
  CHECK(out ==
        "Aten.mul.0.forward Aten.add.0.forward Aten.mul.1.forward Aten.add.1.forward Aten.mul.2.forward "
        "Aten.add.2.forward Aten.mul.3.forward Aten.add.3.forward Aten.mul.4.forward Aten.add.4.forward "
        "Aten.sub.0.forward Aten.relu.0.forward\n");
}

TEST_CASE("steps are written in the order they were handed over, on the writer's thread, all of a restarted step") {
  tptest::TempDir tmp;
  LoggingSink::steps().clear();
  LoggingSink::threads().clear();
  tp::Debugger<tp::Level::L1, tp::Task::Statistics, LoggingSink> dbg(tp::Options().dump_path(tmp.path()));
  dbg.background_writer().pause();
  const auto x = torch::ones({4});
  // Step 0 is stopped and started again: its second write must hold the entries of both halves.
  dbg.start();
  torch::exp(x);
  dbg.stop();
  dbg.start();
  torch::tanh(x);
  dbg.stop();
  dbg.step();
  one_step(dbg, 1);  // step 1
  one_step(dbg, 2);  // step 2
  CHECK(LoggingSink::steps().empty());
  dbg.background_writer().resume();
  dbg.wait_written();
  CHECK(LoggingSink::steps() == std::vector<std::int64_t>{0, 0, 1, 2});
  for (const std::thread::id& id : LoggingSink::threads()) CHECK(id != std::this_thread::get_id());
  const auto data = tptest::read_json(rank_of(tmp.path(), 0) + "/dump.json")["data"];
  std::vector<std::string> names;
  for (const auto& kv : data.items()) names.push_back(kv.key());
  CHECK(names == std::vector<std::string>{"Aten.exp.0.forward", "Aten.tanh.0.forward"});
  CHECK(tptest::read_json(rank_of(tmp.path(), 2) + "/dump.json")["data"].size() == 6);
}

TEST_CASE(
    "a write that fails after step() returned is logged in that step's dump_error_info.log; its journal is kept, the "
    "next step's is removed") {
  tptest::TempDir tmp;
  Stats dbg(tp::Options().dump_path(tmp.path()));
  dbg.background_writer().pause();
  one_step(dbg, 1);
  // Step 0's dump.json cannot be renamed into place: a directory has its name.
  const std::string s0 = rank_of(tmp.path(), 0), s1 = rank_of(tmp.path(), 1);
  fs::create_directories(s0 + "/dump.json");
  one_step(dbg, 1);
  dbg.background_writer().resume();
  dbg.wait_written();

  const std::string log0 = tptest::read_text(s0 + "/dump_error_info.log");
  CAPTURE(log0);
  CHECK(log0.find("write_json failed: name=" + s0) != std::string::npos);
  CHECK(fs::exists(s0 + "/journal.jsonl"));  // for tools/recover_dump.py
  CHECK_FALSE(fs::exists(s1 + "/dump_error_info.log"));
  CHECK_FALSE(fs::exists(s1 + "/journal.jsonl"));
  CHECK(tptest::read_json(s1 + "/dump.json")["data"].size() == 4);
}

TEST_CASE("the destructor writes every step still pending, and removes their journals") {
  tptest::TempDir tmp;
  {
    Stats dbg(tp::Options().dump_path(tmp.path()));
    dbg.background_writer().pause();  // held until the destructor
    one_step(dbg, 1);
    one_step(dbg, 2);
    CHECK_FALSE(fs::exists(rank_of(tmp.path(), 0) + "/dump.json"));
  }
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    CHECK(tptest::read_json(rank_of(tmp.path(), s) + "/dump.json")["data"].size() == 2u * (s + 1) + 2);
    CHECK_FALSE(fs::exists(rank_of(tmp.path(), s) + "/journal.jsonl"));
  }
}

TEST_CASE("past max_pending_mb of unwritten records, the training thread waits for the writer instead of growing") {
  tptest::TempDir tmp;
  constexpr int kOps = 2500;  // about 1.5 MiB of records by the writer's estimate: one step passes 1 MiB
  auto run = [&](std::int64_t max_pending_mb, double* handover_seconds) {
    Stats dbg(tp::Options().dump_path(tmp / std::to_string(max_pending_mb)).max_pending_mb(max_pending_mb));
    tp::details::StepWriter& writer = dbg.background_writer();
    writer.pause();
    one_step(dbg, kOps);
    const std::size_t one = writer.stats().pending_bytes;
    // Step 1's hand-over: with the budget spent by step 0 it must wait until the writer runs. The
    // writer is resumed 300 ms after the hand-over waits (or, within the budget, has returned), not
    // after a fixed time: under the sanitizers step 1's ops alone took longer than 300 ms, and the
    // writer then ran before anything waited for it.
    const auto a = torch::arange(16, torch::kFloat32);
    dbg.start_with(tp::ModelRef{}, std::nullopt);
    for (int i = 0; i < kOps; ++i) torch::add(a, a * i);
    torch::relu(a - 3);
    std::atomic<bool> handed_over{false};
    std::thread releaser([&] {
      for (int i = 0; i < 20000 && writer.stats().waits == 0 && !handed_over; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      writer.resume();
    });
    const auto began = std::chrono::steady_clock::now();
    dbg.stop();  // the hand-over: stop() flushes the step's records to the writer
    dbg.step();
    handed_over = true;
    *handover_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    releaser.join();
    dbg.wait_written();
    const tp::details::StepWriter::Stats st = writer.stats();
    CHECK(tptest::read_json(rank_of(tmp / std::to_string(max_pending_mb), 1) + "/dump.json")["data"].size() ==
          2 * kOps + 2);
    return std::make_pair(one, st);
  };
  double waited = 0, free_run = 0;
  const auto [one, tight] = run(1, &waited);
  REQUIRE(one > (std::size_t{1} << 20));
  CHECK(tight.waits == 1);
  CHECK(waited >= 0.25);
  CHECK(tight.peak_bytes == one);  // never two steps' records at once
  const auto [one_again, loose] = run(1024, &free_run);
  CHECK(loose.waits == 0);
  CHECK(loose.peak_bytes >= 2 * one_again);  // both steps waited together
  MESSAGE("hand-over of a " << kOps << "-op step: " << waited * 1e3 << " ms over budget, " << free_run * 1e3
                            << " ms within it; records of one step " << one / 1024 << " KiB by the estimate");
}

TEST_CASE(
    "journal lines reach the file within a few milliseconds without a flush, the capture thread only queues them") {
  tptest::TempDir tmp;
  Stats dbg(tp::Options().dump_path(tmp.path()));
  const auto x = torch::ones({2});
  dbg.start();
  torch::add(x, x);
  const std::string journal = dbg.directory() + "/journal.jsonl";
  // One line: the thread is woken by the first line after a pause, writes it within kMaxDelay.
  auto lines_within_a_second = [&](std::size_t want) {
    std::size_t lines = 0;
    for (int i = 0; i < 200 && lines < want; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      const std::string text = tptest::read_text(journal);
      lines = static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
    }
    return lines;
  };
  CHECK(lines_within_a_second(2) == 2);  // header and the entry
  // The thread has gone idle; the next line wakes it again and goes to the same file.
  torch::mul(x, x);
  CHECK(lines_within_a_second(3) == 3);
  dbg.stop();
}

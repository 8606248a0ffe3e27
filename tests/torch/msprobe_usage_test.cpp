// What an msprobe user does, read against msprobe's dump guide (issue 44): start() without a model
// where a level needs one, start(rank_id) without one where it does not, msprobe's older
// forward_backward_dump_end(), the rank filter on one card, the line that says where the dump
// went, and the process's debugger reached from another file (process_debugger_loop.cpp).
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

// process_debugger_loop.cpp, a translation unit of its own that never sees the debugger: it drives
// the process's debugger through torchprobe::start()/stop()/step() only. C linkage: the test batch
// (tests/unity_build.cmake) wraps this file in a namespace of its own.
extern "C" void tp_process_loop_train(tptest::Net& net, int steps);

namespace {

std::string proc_dir() { return "proc" + std::to_string(::getpid()); }

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

// The launchers' rank variables, unset while it lives (a process without a rank), restored after.
class NoLauncherRank {
 public:
  NoLauncherRank() {
    for (const char* name : kNames) {
      const char* v = std::getenv(name);
      saved_.push_back(v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(name);
    }
  }
  ~NoLauncherRank() {
    for (std::size_t i = 0; i < saved_.size(); ++i)
      if (saved_[i]) ::setenv(kNames[i], saved_[i]->c_str(), 1);
  }

 private:
  static constexpr const char* kNames[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "LOCAL_RANK"};
  std::vector<std::optional<std::string>> saved_;
};

std::size_t count_of(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("start() without a model is refused at L0 and mix, as msprobe refuses it, and nothing is dumped") {
  tptest::TempDir tmp;
  const std::string l0 = message_of([&] {
    tp::Debugger<tp::Level::L0, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp / "l0"));
    dbg.start();
  });
  CHECK(l0 ==
        "torchprobe: start(): missing the parameter 'model': level \"L0\" dumps the modules of the model given to "
        "start(model); start() and start(rank_id) without a model are for levels \"L1\", \"L2\" and \"debug\"");
  CHECK(message_of([&] {
          tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp / "mix"));
          dbg.start(2);
        }).find("level \"mix\" dumps the modules") != std::string::npos);
  CHECK(message_of([&] {
          tp::Debugger<tp::Level::Mix, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp / "scoped"));
          tp::ScopedDump scope(dbg);
        }).find("missing the parameter 'model'") != std::string::npos);
  // PrecisionDebugger, whose level comes from the config: refused, also with dump_enable false.
  CHECK(message_of([&] {
          tp::PrecisionDebugger dbg(tp::Options().dump_path(tmp / "precision").level("mix"));
          dbg.start();
        }).find("level \"mix\" dumps the modules") != std::string::npos);
  CHECK(message_of([&] {
          tp::PrecisionDebugger dbg(tp::Options().dump_path(tmp / "precision").level("mix").set("dump_enable", false));
          dbg.start();
        }).find("level \"mix\" dumps the modules") != std::string::npos);
  for (const char* dir : {"l0", "mix", "scoped", "precision"}) CHECK_FALSE(fs::exists(tmp / dir));
  // With the model it starts; a later start() without one uses it again, as msprobe keeps it.
  tptest::Net net;
  tp::Debugger<tp::Level::L0, tp::Task::Statistics, tp::MemorySink> dbg(tp::Options().dump_path(tmp / "with_model"));
  dbg.start(net);
  CHECK(dbg.running());
  dbg.stop();
  dbg.step();
  dbg.start();
  (void)net->forward(torch::ones({2, 8}));
  dbg.stop();
  CHECK(dbg.sink().step(1).dump["data"].contains("Module.fc.Linear.forward.0"));
}

TEST_CASE("start() and start(rank_id) without a model work at L1, L2 and debug; rank_id names the rank directory") {
  tptest::TempDir tmp;
  const auto a = torch::ones({4}), b = torch::full({4}, 2.0);
  {
    tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp / "l1"));
    dbg.start(3);
    (void)torch::add(a, b);
    dbg.stop();
    dbg.wait_written();
  }
  const Json l1 = tptest::read_json(tmp / "l1/step0/rank3/dump.json");
  CHECK(l1["data"].contains("Aten.add.0.forward"));
  {
    tp::Debugger<tp::Level::L2, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp / "l2"));
    dbg.start(4);
    (void)torch::add(a, b);
    dbg.stop();
    dbg.wait_written();
  }
  CHECK(tptest::read_json(tmp / "l2/step0/rank4/dump.json")["data"].contains("Aten.add.0.forward"));
  {
    tp::Debugger<tp::Level::Debug, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp / "debug"));
    dbg.start(5);
    dbg.save(a, "a");
    dbg.stop();
    dbg.wait_written();
  }
  CHECK(tptest::read_json(tmp / "debug/step0/rank5/debug.json")["data"].contains("a.0.debug"));
  {
    tp::PrecisionDebugger dbg(tp::Options().dump_path(tmp / "precision"));  // msprobe's default level: L1
    dbg.start(6);
    (void)torch::add(a, b);
    dbg.stop();
    dbg.wait_written();
  }
  CHECK(tptest::read_json(tmp / "precision/step0/rank6/dump.json")["data"].contains("Aten.add.0.forward"));
  CHECK(message_of([&] {
          tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp / "negative"));
          dbg.start(-1);
        }) == "torchprobe: start(): rank_id -1 is invalid; it must be >= 0");
}

TEST_CASE("forward_backward_dump_end(), the name earlier msprobe releases gave stop(), stops and writes the dump") {
  tptest::TempDir tmp;
  tp::PrecisionDebugger dbg(tp::Options().dump_path(tmp.path()));
  dbg.start();
  (void)torch::mul(torch::ones({3}), 2.0);
  dbg.forward_backward_dump_end();
  CHECK_FALSE(dbg.running());
  dbg.wait_written();
  CHECK(tptest::read_json(tmp / ("step0/" + proc_dir() + "/dump.json"))["data"].contains("Aten.mul.0.forward"));
}

TEST_CASE("a rank filter on a process without a rank warns once, naming the key and the rank it counts as") {
  NoLauncherRank no_rank;
  tptest::TempDir tmp;
  const auto a = torch::ones({4});
  tp::Debugger<tp::Level::L1, tp::Task::Statistics, tp::MemorySink> dbg(
      tp::Options().dump_path(tmp.path()).rank({1, 3}));
  const std::string said = tptest::stderr_of([&] {
    for (int s = 0; s < 2; ++s) {
      dbg.start();
      (void)torch::neg(a);
      dbg.stop();
      dbg.step();
    }
  });
  CHECK(count_of(said, "torchprobe: warning: config key \"rank\" is [1, 3], but this process has no rank") == 1);
  CHECK(said.find("it counts as rank 0, so nothing is dumped; on one card leave \"rank\" empty ([])") !=
        std::string::npos);
  CHECK(dbg.sink().steps().empty());
  // A rank the process has, or an empty filter: nothing to say.
  tp::Debugger<tp::Level::L1, tp::Task::Statistics, tp::MemorySink> ranked(
      tp::Options().dump_path(tmp.path()).rank({1, 3}));
  tp::Debugger<tp::Level::L1, tp::Task::Statistics, tp::MemorySink> unfiltered(tp::Options().dump_path(tmp.path()));
  const std::string quiet = tptest::stderr_of([&] {
    ranked.start(1);
    (void)torch::neg(a);
    ranked.stop();
    unfiltered.start();
    (void)torch::neg(a);
    unfiltered.stop();
  });
  CHECK(quiet.empty());
  CHECK(ranked.sink().steps().count(0) == 1);
}

TEST_CASE("one line per run says where the dump goes, on standard error with the other messages") {
  NoLauncherRank no_rank;
  tptest::TempDir tmp;
  const auto a = torch::ones({4});
  const std::string said = tptest::stderr_of([&] {
    tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp / "dump"));
    for (int s = 0; s < 3; ++s) {
      dbg.start();
      (void)torch::neg(a);
      dbg.stop();
      dbg.step();
    }
  });
  CHECK(said == "torchprobe: the dump goes to " + (tmp / "dump") + "/step0/" + proc_dir() +
                    " (each step in a step{N}/ folder of " + (tmp / "dump") + ")\n");
  CHECK(fs::exists(tmp / ("dump/step2/" + proc_dir() + "/dump.json")));
  // A sink that writes no files there says nothing.
  const std::string memory = tptest::stderr_of([&] {
    tp::Debugger<tp::Level::L1, tp::Task::Statistics, tp::MemorySink> dbg(tp::Options().dump_path(tmp / "memory"));
    dbg.start();
    (void)torch::neg(a);
    dbg.stop();
  });
  CHECK(memory.empty());
}

TEST_CASE("the first PrecisionDebugger is the process's: another file drives it with torchprobe::start/stop/step") {
  NoLauncherRank no_rank;
  CHECK(message_of([] { tp::stop(); }).rfind("torchprobe: no PrecisionDebugger exists in this process", 0) == 0);
  tptest::TempDir tmp;
  tptest::Net net;
  {
    tp::PrecisionDebugger dbg(tp::Options().dump_path(tmp / "dump").level("mix"));
    tp::PrecisionDebugger second(tp::Options().dump_path(tmp / "second"));  // not the process's: made later
    CHECK(&tp::PrecisionDebugger::instance() == &dbg);
    CHECK(&tp::process_debugger() == &dbg);
    tp_process_loop_train(net, 2);
    CHECK_FALSE(dbg.running());
    dbg.wait_written();
  }
  for (int s = 0; s < 2; ++s) {
    const Json d = tptest::read_json(tmp / ("dump/step" + std::to_string(s) + "/" + proc_dir() + "/dump.json"));
    CHECK(d["data"].contains("Module.fc.Linear.forward.0"));
    CHECK(d["data"].contains("Module.fc.Linear.backward.0"));
  }
  CHECK_FALSE(fs::exists(tmp / "second"));
  // Gone with its scope: the next PrecisionDebugger made takes its place.
  CHECK(message_of([] { tp::PrecisionDebugger::instance(); }).rfind("torchprobe: no PrecisionDebugger", 0) == 0);
  tp::PrecisionDebugger next(tp::Options().dump_path(tmp / "next"));
  CHECK(&tp::PrecisionDebugger::instance() == &next);
}

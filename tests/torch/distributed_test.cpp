// Many ranks: data-parallel training over c10d's Gloo on loopback, each rank a process started by
// tools/launch_ranks.sh (this test executable again, as a child: no executable of its own).
// Every rank trains the same small model for 3 steps on data of its own and all-reduces the
// gradients through torchprobe::dist or through the dispatcher (c10d::ops on 1.13, a
// c10d::ProcessGroup's methods on 2.x); what the ranks wrote is read back by python3's json.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/analysis/compare/ranks.hpp>
#include <torchprobe/distributed.hpp>
#include <torchprobe/io/recovery.hpp>
#include <torchprobe/torchprobe.hpp>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <limits>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "c10d_dispatch.hpp"  // collectives through the dispatcher, on either libtorch
#include "child_process.hpp"  // declares environ at global scope (the unity build wraps this file in a namespace)
#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace dist_test {

using tptest::dispatch::d_allgather;
using tptest::dispatch::d_allreduce;
using tptest::dispatch::d_barrier;
using tptest::dispatch::d_broadcast;
using tptest::dispatch::d_gather;
using tptest::dispatch::d_recv;
using tptest::dispatch::d_reduce;
using tptest::dispatch::d_scatter;
using tptest::dispatch::d_send;
using tptest::dispatch::dispatching;
using tptest::dispatch::Group;

constexpr int kSteps = 3;

c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                      int size) {
  auto gloo = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(40));
  gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo);
}

// ---- the child: one rank ---------------------------------------------------------------------
// TORCHPROBE_TEST_MODE: "plain"; "filter" (rank [0, "2-3"], step [0, 2]); "kill" (the last rank
// is killed by SIGKILL in its last step, once the others have finished); "fault" (rank 2 adds
// 1e-3 to fc.weight at the start of step 1, before its forward and all_reduce); "drift-L0",
// "drift-mix": the same fault at level L0 or mix; "nodiv-L0", "nodiv-mix": rank 2 does not divide
// its all-reduced gradients by the world size in step 0 (its parameters differ from step 1 on);
// "inf-mix": in step 1 rank 1 writes an inf into a row of its fc.weight gradient before the all_reduce;
// "skip-mix": two steps, and in step 1 the last rank never calls the all_reduce of fc.bias's gradient
// and ends; the others wait for it until a Gloo timeout of 4 s, then hang, as a job whose watchdog
// does not abort it, until the launcher's timeout kills them.
template <tp::Level L>
int run_rank_at(const std::string& dir, const std::string& mode) {
  const int rank = std::atoi(std::getenv("RANK"));
  const int world = std::atoi(std::getenv("WORLD_SIZE"));
  auto store = c10::make_intrusive<c10d::FileStore>(dir + "/store", world);
  const bool skip = mode == "skip-mix";
  auto gloo = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(skip ? 4 : 40));
  gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, gloo);
  // TORCHPROBE_TEST_DISPATCH: the gradients go through the dispatcher instead of torchprobe::dist.
  const bool dispatch = std::getenv("TORCHPROBE_TEST_DISPATCH") != nullptr;
  const Group dispatching_pg = dispatching(store, pg);

  tp::Options options = tp::Options().dump_path(dir + "/dump").process_group(pg);
  if (mode == "filter") options.rank({0, "2-3"}).step({0, 2});
  tp::Debugger<L, tp::Task::Statistics> dbg(options);
  const bool drift = mode == "fault" || mode.rfind("drift-", 0) == 0;
  const bool skip_division = mode.rfind("nodiv-", 0) == 0 && rank == 2;
  // The issue-48 modes dump forward, backward and the reduction, not the update: an in-place update
  // of a parameter while the probe runs is an episode of its module (docs/capture.md), which would
  // show the undivided gradient one step early, as that episode's input.
  const bool stop_before_update = mode.find('-') != std::string::npos;
  torch::manual_seed(1);  // the same initial parameters on every rank
  tptest::Net net;
  // The README's overhead figure: TORCHPROBE_TEST_STEPS steps, mode "bare" never starts the probe.
  const char* steps_env = std::getenv("TORCHPROBE_TEST_STEPS");
  const int steps = steps_env ? std::atoi(steps_env) : skip ? 2 : kSteps;
  const auto began = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    torch::manual_seed(100 + 10 * s + rank);  // data of its own
    const auto x = torch::randn({16, 8});
    net->zero_grad();
    if (drift && rank == 2 && s == 1) {  // a planted fault: this rank's weight drifts
      torch::NoGradGuard no_grad;
      net->fc->weight.add_(1e-3);
    }
    if (mode != "bare") dbg.start(net);
    net->forward(x).pow(2).mean().backward();
    if (mode == "inf-mix" && rank == 1 && s == 1)
      net->fc->weight.grad().select(0, 0).fill_(std::numeric_limits<float>::infinity());
    const std::vector<at::Tensor> params = net->parameters();
    for (std::size_t k = 0; k < params.size(); ++k) {
      const at::Tensor& p = params[k];
      if (skip && s == 1 && rank == world - 1 && k + 1 == params.size()) continue;  // never enters it
      try {
        if (dispatch)
          d_allreduce(dispatching_pg, {p.grad()})->wait();
        else
          tp::dist::all_reduce(pg, p.grad());
      } catch (const std::exception&) {
        if (!skip) throw;
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // hung, until the launcher kills it
      }
      if (!(skip_division && s == 0)) p.grad().div_(world);
    }
    if (stop_before_update) dbg.stop();
    {
      torch::NoGradGuard no_grad;
      for (auto& p : net->parameters()) p.sub_(0.1 * p.grad());
    }
    if (mode == "kill" && rank == world - 1 && s == steps - 1) {
      // Killed in the middle of a step, after its collectives, once the others have ended.
      for (int i = 0; i < 6000; ++i) {
        int done = 0;
        for (int r = 0; r < world - 1; ++r) done += fs::exists(dir + "/done" + std::to_string(r));
        if (done == world - 1) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      dbg.wait_written();
      ::raise(SIGKILL);
    }
    if (!stop_before_update) dbg.stop();
    dbg.step();
  }
  dbg.wait_written();
  if (steps_env && rank == 0)
    std::printf("rank 0: %d steps in %.3f s\n", steps,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  std::ofstream(dir + "/done" + std::to_string(rank)) << "done\n";
  return 0;
}

// "gather": each rank dumps one step at mix, then rank 0 gathers the ranks' digests over Gloo into
// DIR/gathered (torchprobe::dist::gather_rank_digests).
int run_gather_rank(const std::string& dir) {
  const int rank = std::atoi(std::getenv("RANK"));
  const int world = std::atoi(std::getenv("WORLD_SIZE"));
  auto store = c10::make_intrusive<c10d::FileStore>(dir + "/store", world);
  auto pg = gloo_group(store, rank, world);
  tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(dir + "/dump").process_group(pg));
  torch::manual_seed(1);
  tptest::Net net;
  dbg.start(net);
  torch::manual_seed(100 + rank);
  net->forward(torch::randn({16, 8})).pow(2).mean().backward();
  for (auto& p : net->parameters()) {
    tp::dist::all_reduce(pg, p.grad());
    p.grad().div_(world);
  }
  dbg.stop();
  const std::string rank_dir = dbg.directory();
  dbg.step();
  dbg.wait_written();
  const int written = tp::dist::gather_rank_digests(pg, rank_dir, dir + "/gathered", 0);
  if (written != (rank == 0 ? world : 0)) return 5;
  std::ofstream(dir + "/done" + std::to_string(rank)) << "done\n";
  return 0;
}

int run_rank(const std::string& dir, const std::string& mode) {
  const bool l0 = mode.size() > 3 && mode.compare(mode.size() - 3, 3, "-L0") == 0;
  return l0 ? run_rank_at<tp::Level::L0>(dir, mode) : run_rank_at<tp::Level::Mix>(dir, mode);
}

// Two ranks call collectives the way libtorch routes them through the dispatcher, never through
// torchprobe::dist (but once, to see that a wrapped call makes one entry, not two). Every tensor
// is made before start(), so the only ATen calls in the dump are the one mul this rank makes.
int run_dispatch_rank(const std::string& dir) {
  const int rank = std::atoi(std::getenv("RANK"));
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::FileStore>(dir + "/store", 2);
  const Group pg = dispatching(store, gloo_group(store, rank, 2));
  // A group of this rank alone, registered with its global rank.
  auto own_store = c10::make_intrusive<c10d::PrefixStore>("own" + std::to_string(rank), store);
  const Group own = dispatching(own_store, gloo_group(own_store, 0, 1));
  tp::dist::set_group_ranks(own, {rank});
  bool mismatch_refused = false;
  try {
    tp::dist::set_group_ranks(pg, {0});
  } catch (const std::invalid_argument&) {
    mismatch_refused = true;
  }

  const auto sum = torch::full({4}, static_cast<double>(rank + 1));
  const auto later = torch::full({4}, static_cast<double>(10 * (rank + 1)));
  const auto root = torch::full({3}, static_cast<double>(10 * rank + 5));
  std::vector<at::Tensor> gathered{torch::zeros({2}), torch::zeros({2})};
  const auto mine = torch::full({2}, static_cast<double>(rank));
  const auto message = rank == 0 ? torch::full({2}, 7.0) : torch::zeros({2});
  const auto wrapped = torch::full({2}, static_cast<double>(rank + 1));
  const auto alone = torch::full({2}, 3.0);
  const auto scale = torch::full({1}, 2.0);
  const auto reduced = torch::full({2}, static_cast<double>(rank + 1));
  const auto own_part = torch::full({2}, static_cast<double>(rank + 5));
  const std::vector<at::Tensor> parts =
      rank == 0 ? std::vector<at::Tensor>{torch::zeros({2}), torch::zeros({2})} : std::vector<at::Tensor>{};
  const auto piece = torch::zeros({2});
  const std::vector<at::Tensor> pieces =
      rank == 0 ? std::vector<at::Tensor>{torch::full({2}, 10.0), torch::full({2}, 20.0)} : std::vector<at::Tensor>{};

  tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(dir + "/dump").process_group(pg));
  tptest::Net net;
  dbg.start(net);
  d_allreduce(pg, {sum})->wait();
  const auto scaled = sum.mul(scale);  // finds the work completed: the entry's output is read first
  auto pending = d_allreduce(pg, {later});
  d_broadcast(pg, {root}, 0)->wait();
  d_allgather(pg, {gathered}, {mine})->wait();
  if (rank == 0)
    d_send(pg, {message}, 1, 3)->wait();
  else
    d_recv(pg, {message}, 0, 3)->wait();
  d_barrier(pg)->wait();
  d_reduce(pg, {reduced}, 0)->wait();
  d_gather(pg, rank == 0 ? std::vector<std::vector<at::Tensor>>{parts} : std::vector<std::vector<at::Tensor>>{},
           {own_part}, 0)
      ->wait();
  d_scatter(pg, {piece},
            rank == 0 ? std::vector<std::vector<at::Tensor>>{pieces} : std::vector<std::vector<at::Tensor>>{}, 0)
      ->wait();
  tp::dist::all_reduce(pg, wrapped);
  d_allreduce(own, {alone})->wait();
  pending->wait();  // the last all_reduce's output is read at stop()
  dbg.stop();
  dbg.wait_written();
  if (!mismatch_refused || scaled.max().item<double>() != 6.0) return 3;
  std::ofstream(dir + "/done" + std::to_string(rank)) << "done\n";
  return 0;
}

struct ChildProgram {
  ChildProgram() {
    const char* child = std::getenv("TORCHPROBE_TEST_CHILD");
    if (!child || std::string(child) != "dist") return;
    int rc = 2;
    try {
      const std::string mode = std::getenv("TORCHPROBE_TEST_MODE");
      rc = mode == "dispatch" ? run_dispatch_rank(std::getenv("TORCHPROBE_TEST_DIR"))
           : mode == "gather" ? run_gather_rank(std::getenv("TORCHPROBE_TEST_DIR"))
                              : run_rank(std::getenv("TORCHPROBE_TEST_DIR"), mode);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %s failed: %s\n", std::getenv("RANK"), e.what());
      rc = 4;
    }
    std::fflush(nullptr);
    std::_Exit(rc);
  }
} child_program;

// ---- the parent ------------------------------------------------------------------------------

// tools/launch_ranks.sh starts `world` ranks of this executable; returns its exit status.
int launch(int world, const std::string& mode, const std::string& dir, bool dispatch = false, int timeout_s = 50) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string script = std::string(TORCHPROBE_TESTS_DIR) + "/../tools/launch_ranks.sh";
  std::vector<std::string> env = {"TORCHPROBE_TEST_CHILD=dist", "TORCHPROBE_TEST_MODE=" + mode,
                                  "TORCHPROBE_TEST_DIR=" + dir};
  if (dispatch) env.push_back("TORCHPROBE_TEST_DISPATCH=1");
  std::vector<char*> envp;
  for (char** e = ::environ; *e; ++e)
    if (std::string(*e).rfind("TORCHPROBE_TEST_", 0) != 0) envp.push_back(*e);
  for (std::string& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = {"bash", script, "-t", std::to_string(timeout_s), std::to_string(world), self};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  REQUIRE(::posix_spawn(&pid, "/bin/bash", nullptr, nullptr, argv.data(), envp.data()) == 0);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Every step{S}/rank{R}/dump.json below `dump`, as python3's json reads it:
// {"step0": {"rank1": {"Distributed.all_reduce.0.forward": {...}, ...}}}, only Distributed
// entries, plus "rank dirs" listing each step's directories.
Json read_dumps(const std::string& dump) {
  int rc = -1;
  const std::string out = tptest::run_python(
      "import json, os\n"
      "root = '" +
          dump +
          "'\n"
          "res = {}\n"
          "for step in sorted(os.listdir(root)):\n"
          "    res[step] = {}\n"
          "    for rank in sorted(os.listdir(os.path.join(root, step))):\n"
          "        p = os.path.join(root, step, rank, 'dump.json')\n"
          "        data = json.load(open(p))['data'] if os.path.exists(p) else None\n"
          "        res[step][rank] = None if data is None else {k: v for k, v in data.items() if "
          "k.startswith('Distributed.')}\n"
          "print(json.dumps(res))\n",
      &rc);
  REQUIRE_MESSAGE(rc == 0, out);
  return Json::parse(out);
}

// Checks the all_reduce entries of one step: one per parameter (weight, bias) on every rank, the
// input a rank's own gradient, the output the sum over ranks, the same on every rank. The
// gradients' Means are linear, so the output's Mean is the sum of the inputs' Means.
void check_all_reduces(const Json& step, const std::vector<std::string>& ranks, bool every_rank = true) {
  for (int k = 0; k < 2; ++k) {
    const std::string name = "Distributed.all_reduce." + std::to_string(k) + ".forward";
    double mean_sum = 0;
    const Json* first_output = nullptr;
    for (const std::string& r : ranks) {
      INFO(r << " " << name);
      REQUIRE(step.contains(r));
      REQUIRE(step[r].contains(name));
      const Json& e = step[r][name];
      CHECK(e["input_kwargs"]["op"]["value"] == "RedOpType.SUM");
      if (every_rank) CHECK(e["input_kwargs"]["group"]["group_ranks"].size() == ranks.size());
      mean_sum += e["input_args"][0]["Mean"].get<double>();
      REQUIRE(e.contains("output"));
      const Json& out = e["output"][0];
      if (!first_output) first_output = &out;
      for (const char* stat : {"Max", "Min", "Mean", "Norm"}) CHECK(out[stat] == (*first_output)[stat]);
    }
    if (every_rank) CHECK(((*first_output)["Mean"].get<double>() == doctest::Approx(mean_sum).epsilon(1e-5)));
  }
}

std::vector<std::string> rank_names(int world) {
  std::vector<std::string> r;
  for (int i = 0; i < world; ++i) r.push_back("rank" + std::to_string(i));
  return r;
}

TEST_CASE(
    "2 and 4 ranks over Gloo, wrapped or dispatched: every rank writes rank{R}, all_reduce entries hold each rank's "
    "input and the common sum") {
  const std::pair<int, bool> runs[] = {{2, false}, {2, true}, {4, false}, {4, true}};
  for (const auto& [world, dispatch] : runs) {
    INFO("world size " << world << (dispatch ? ", through the dispatcher" : ", through torchprobe::dist"));
    tptest::TempDir dir;
    REQUIRE(launch(world, "plain", dir.path(), dispatch) == 0);
    const Json dumps = read_dumps(dir / "dump");
    REQUIRE(dumps.size() == kSteps);
    for (int s = 0; s < kSteps; ++s) {
      const Json& step = dumps["step" + std::to_string(s)];
      CHECK(step.size() == static_cast<std::size_t>(world));
      check_all_reduces(step, rank_names(world));
    }
  }
}

TEST_CASE("the rank filter [0, \"2-3\"] and the step filter [0, 2] hold on every rank of a 4-rank run") {
  tptest::TempDir dir;
  REQUIRE(launch(4, "filter", dir.path()) == 0);
  const Json dumps = read_dumps(dir / "dump");
  CHECK(dumps.size() == 2);
  for (const char* s : {"step0", "step2"}) {
    INFO(s);
    REQUIRE(dumps.contains(s));
    const Json& step = dumps[s];
    CHECK(step.size() == 3);
    CHECK_FALSE(step.contains("rank1"));
    check_all_reduces(step, {"rank0", "rank2", "rank3"}, /*every_rank=*/false);
  }
}

TEST_CASE(
    "a rank killed by SIGKILL mid-step leaves the others' dumps complete and a journal that recovers its collectives") {
  tptest::TempDir dir;
  CHECK(launch(4, "kill", dir.path()) == 128 + SIGKILL);  // the launcher reports the killed rank
  const std::string killed = dir / "dump/step2/rank3";
  CHECK_FALSE(fs::exists(killed + "/dump.json"));
  REQUIRE(fs::exists(killed + "/journal.jsonl"));
  int rc = -1;
  const std::string out =
      tptest::run_python("import subprocess, sys\nsys.exit(subprocess.call([sys.executable, '" +
                             std::string(TORCHPROBE_TESTS_DIR) + "/../tools/recover_dump.py', '" + killed + "']))\n",
                         &rc);
  // Killed mid-step: its entries so far come back, marked incomplete (exit status 3).
  REQUIRE_MESSAGE(rc == 3, out);
  CHECK_MESSAGE(out.find(killed + ": incomplete: missing the step was interrupted") != std::string::npos, out);
  const Json dumps = read_dumps(dir / "dump");
  for (int s = 0; s < kSteps; ++s) {
    INFO("step " << s);
    check_all_reduces(dumps["step" + std::to_string(s)], rank_names(4));  // rank 3's step 2 recovered
  }
}

TEST_CASE(
    "rank detection: start's rank_id, then the process group, then RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, "
    "SLURM_PROCID, LOCAL_RANK") {
  const char* const vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "LOCAL_RANK"};
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  for (const char* v : vars) {
    const char* was = std::getenv(v);
    saved.emplace_back(v, was ? std::optional<std::string>(was) : std::nullopt);
  }
  for (std::size_t i = 0; i < 5; ++i) ::setenv(vars[i], std::to_string(i + 1).c_str(), 1);  // RANK=1 ... LOCAL_RANK=5

  struct FakeGroup {
    int getRank() const { return 6; }
  };
  const auto group = std::make_shared<FakeGroup>();
  tp::Config config = tp::Options().process_group(group).resolve();
  CHECK(config.group_rank == std::optional<int64_t>(6));
  tp::details::Session session(config);
  session.resolve_rank(7);
  CHECK(session.rank() == std::optional<std::int64_t>(7));
  session.resolve_rank(std::nullopt);
  CHECK(session.rank() == std::optional<std::int64_t>(6));
  config.group_rank.reset();
  for (std::size_t i = 0; i < 5; ++i) {
    INFO("after unsetting " << i << " variables");
    session.resolve_rank(std::nullopt);
    CHECK(session.rank() == std::optional<std::int64_t>(i + 1));
    ::setenv(vars[i], "not a number", 1);  // skipped, as an absent one
  }
  session.resolve_rank(std::nullopt);
  CHECK_FALSE(session.rank().has_value());
  CHECK(session.rank_dir_name() == "proc" + std::to_string(::getpid()));

  // start(model, pg) names the directory by the group's rank.
  tptest::TempDir dir;
  tptest::Net net;
  tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(dir.path()));
  dbg.start(net, group);
  CHECK(fs::path(dbg.directory()).filename() == "rank6");
  dbg.stop();

  for (const auto& [name, value] : saved)
    if (value)
      ::setenv(name.c_str(), value->c_str(), 1);
    else
      ::unsetenv(name.c_str());
}

TEST_CASE("the cross-rank view names the rank, the parameter and the step of a planted fault, and nothing else") {
  tptest::TempDir dir;
  REQUIRE(launch(4, "fault", dir.path()) == 0);
  namespace ranks = tp::compare::ranks;
  ranks::ViewOptions every_dump;  // each rank's dump.json, its own data too (the lone-outlier rule)
  every_dump.digests = false;
  const std::vector<ranks::StepView> views = ranks::view_dump(dir / "dump", every_dump);
  REQUIRE(views.size() == 2);  // step 0 agrees; the view stops at step 1
  CHECK(views[0].ranks == std::vector<long>{0, 1, 2, 3});
  CHECK_FALSE(views[0].first.has_value());
  for (const ranks::StepView& v : views) {
    REQUIRE(v.collectives.size() == 2);
    for (const ranks::CollectiveCall& c : v.collectives) {
      CHECK(c.entered == std::vector<long>{0, 1, 2, 3});
      CHECK_FALSE(c.inputs_agree);  // each rank's own gradients
      CHECK(c.outputs_agree);
    }
  }
  REQUIRE(views[1].first.has_value());
  const ranks::Disagreement& d = *views[1].first;
  CHECK(d.step == 1);
  CHECK(d.rank == 2);
  // fc.weight, [4, 8], is first read by Linear's transpose (linear = addmm(bias, x, weight.t())).
  CHECK(d.entry == "Aten.t.0.forward");
  CHECK(d.item == "input_args.0");
  CHECK(d.shape == "[4,8]");
  CHECK(d.agreeing == std::vector<long>{0, 1, 3});
  std::ostringstream text;
  CHECK(ranks::print_views(views, text) == 1);
  CHECK(text.str().find("first disagreement: step 1, rank 2, Aten.t.0.forward input_args.0 (shape [4,8])") !=
        std::string::npos);
  // The digests every rank wrote beside its dump.json: the module's parameter itself, at the same step.
  const std::vector<ranks::StepView> digests = ranks::view_dump(dir / "dump");
  REQUIRE(digests.size() == 2);
  CHECK(digests[0].source.digests);
  CHECK(digests[1].source.digests);
  REQUIRE(digests[1].first.has_value());
  CHECK(digests[1].first->rank == 2);
  CHECK(digests[1].first->entry == "Module.fc.Linear.forward.0");
  CHECK(digests[1].first->item == "parameters.weight");
  CHECK(digests[1].first->agreeing == std::vector<long>{0, 1, 3});
}

// Issue 48: the replicated values at both levels. A parameter drifts on rank 2 at step 1, or rank 2
// skips dividing its all-reduced gradients at step 0 (its parameters differ from step 1 on): the
// view names step 1, rank 2 and the module's parameter, at L0 through the module entry alone.
TEST_CASE("4 Gloo ranks at L0 and mix: a drifted parameter and a skipped gradient division are named at step 1") {
  namespace ranks = tp::compare::ranks;
  for (const std::string fault : {"drift", "nodiv"}) {
    for (const std::string level : {"L0", "mix"}) {
      CAPTURE(fault);
      CAPTURE(level);
      tptest::TempDir dir;
      REQUIRE(launch(4, fault + "-" + level, dir.path()) == 0);
      ranks::ViewOptions every_dump;
      every_dump.digests = false;
      const std::vector<ranks::StepView> views = ranks::view_dump(dir / "dump", every_dump);
      REQUIRE(views.size() == 2);  // step 0 agrees (the undivided update shows in step 1's parameters)
      CHECK_FALSE(views[0].first.has_value());
      CHECK(views[0].replicated.parameters == 2);  // fc.weight and fc.bias
      const ranks::StepView& v = views[1];
      REQUIRE(v.first_parameter.has_value());
      const ranks::Disagreement& p = *v.first_parameter;
      CHECK(p.step == 1);
      CHECK(p.rank == 2);
      CHECK(p.entry == "Module.fc.Linear.forward.0");
      CHECK(p.item == "parameters.weight");
      CHECK(p.agreeing == std::vector<long>{0, 1, 3});
      REQUIRE(v.first.has_value());
      CHECK(v.first->rank == 2);
      // At L0 the module entry is all there is; at mix the transpose that reads the weight comes first.
      CHECK(v.first->entry == (level == "L0" ? "Module.fc.Linear.forward.0" : "Aten.t.0.forward"));
      std::ostringstream text;
      CHECK(ranks::print_views(views, text) == 1);
      CHECK(text.str().find("first disagreement: step 1, rank 2, ") != std::string::npos);
      if (level == "mix")
        CHECK(text.str().find("first module parameter that differs: step 1, rank 2, Module.fc.Linear.forward.0 "
                              "parameters.weight (shape [4,8]) differs from ranks 0,1,3\n") != std::string::npos);
      // From the ranks' digests: the parameter is the first disagreement, at both levels.
      const std::vector<ranks::StepView> digests = ranks::view_dump(dir / "dump");
      REQUIRE(digests.size() == 2);
      CHECK(digests[1].source.digests);
      CHECK(digests[1].replicated.parameters == v.replicated.parameters);
      CHECK(digests[1].replicated.collective_outputs == v.replicated.collective_outputs);
      REQUIRE(digests[1].first.has_value());
      CHECK(digests[1].first->rank == 2);
      CHECK(digests[1].first->entry == "Module.fc.Linear.forward.0");
      CHECK(digests[1].first->item == "parameters.weight");
      CHECK(digests[1].first->agreeing == std::vector<long>{0, 1, 3});
    }
  }
}

TEST_CASE(
    "4 Gloo ranks: an inf one rank writes into its gradient is named at that rank, not where the all_reduce took it") {
  namespace ranks = tp::compare::ranks;
  tptest::TempDir dir;
  REQUIRE(launch(4, "inf-mix", dir.path()) == 0);
  const std::vector<ranks::StepView> views = ranks::view_dump(dir / "dump");
  REQUIRE(views.size() >= 2);
  CHECK_FALSE(views[0].nonfinite.has_value());
  REQUIRE(views[1].nonfinite.has_value());
  const ranks::NonFinite& n = *views[1].nonfinite;
  CHECK(n.step == 1);
  CHECK(n.rank == 1);
  CHECK(n.entry.rfind("Aten.", 0) == 0);  // the op that wrote it (fill_ on libtorch 1.13 and 2.x)
  CHECK(n.item == "output.0");
  CHECK(n.inputs_finite);
  CHECK(n.reached == std::vector<long>{0, 2, 3});
  CHECK(n.through == "Distributed.all_reduce.0.forward");  // fc.weight's gradient, reduced first
  REQUIRE(views[1].source.digests);                        // found while each rank wrote its digest: the same origin
  ranks::ViewOptions every_dump;
  every_dump.digests = false;
  const std::vector<ranks::StepView> dumps = ranks::view_dump(dir / "dump", every_dump);
  REQUIRE(dumps.size() == views.size());
  REQUIRE(dumps[1].nonfinite.has_value());
  CHECK(dumps[1].nonfinite->rank == n.rank);
  CHECK(dumps[1].nonfinite->entry == n.entry);
  CHECK(dumps[1].nonfinite->item == n.item);
  CHECK(dumps[1].nonfinite->reached == n.reached);
  std::ostringstream text;
  ranks::print_views(views, text);
  CHECK(text.str().find("first non-finite value: step 1, rank 1, " + n.entry +
                        " output.0 (made there: its inputs are "
                        "finite); reached ranks 0,2,3 through Distributed.all_reduce.0.forward\n") !=
        std::string::npos);
}

// Issue 48: a rank that misses a collective. The others wait for it in vain and hang until the
// launcher's timeout kills them; `torchprobe recover` rebuilds their interrupted step 1 (and its
// digest) from the journals, and the view names the rank that never entered the all_reduce.
TEST_CASE("4 Gloo ranks: a rank that never enters an all_reduce is named from the dumps recovered after the hang") {
  namespace ranks = tp::compare::ranks;
  tptest::TempDir dir;
  CHECK(launch(4, "skip-mix", dir.path(), false, 20) == 124);  // the launcher's timeout ended it
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(fs::exists(fs::path(dir / ("dump/step1/rank" + std::to_string(r))) / "journal.jsonl"));
    CHECK_FALSE(fs::exists(fs::path(dir / ("dump/step1/rank" + std::to_string(r))) / "dump.json"));
  }
  CHECK(fs::exists(dir / "dump/step1/rank3/dump.json"));  // it ended its step
  std::ostringstream out, err;
  CHECK(tp::io::recovery::run_recover({dir / "dump"}, out, err) == 3);  // incomplete steps
  CAPTURE(out.str());
  CAPTURE(err.str());
  for (int r = 0; r < 3; ++r)
    CHECK(fs::exists(fs::path(dir / ("dump/step1/rank" + std::to_string(r))) / tp::io::kRankDigestFile));
  for (const bool digests : {true, false}) {
    CAPTURE(digests);
    ranks::ViewOptions options;
    options.digests = digests;
    const std::vector<ranks::StepView> views = ranks::view_dump(dir / "dump", options);
    REQUIRE(views.size() == 2);
    CHECK_FALSE(views[0].first.has_value());
    const ranks::StepView& v = views[1];
    CHECK(v.source.digests == digests);
    CHECK(v.incomplete.size() == 3);  // ranks 0-2: interrupted while they waited
    CHECK(v.incomplete.count(3) == 0);
    REQUIRE(v.first.has_value());
    CHECK(v.first->step == 1);
    CHECK(v.first->rank == 3);
    CHECK(v.first->entry == "Distributed.all_reduce.1.forward");
    CHECK(v.first->item.empty());  // never entered
    CHECK(v.first->agreeing == std::vector<long>{0, 1, 2});
    std::ostringstream text;
    CHECK(ranks::print_views(views, text) == 1);
    CHECK(text.str().find("first disagreement: step 1, rank 3, Distributed.all_reduce.1.forward: never entered "
                          "(ranks 0,1,2 did)\n") != std::string::npos);
  }
}

namespace {
std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
}  // namespace

// Issue 48, item 4: the digest is made from the step's records on the writer's thread (API calls
// in compact form are only walked for the first non-finite value); the same digest made from the
// dump.json written beside it, as `torchprobe ranks` reads that, has the very same bytes.
TEST_CASE("a rank's ranks_digest.bin holds, byte for byte, what the view reads of the dump.json beside it") {
  tptest::TempDir dir;
  {
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(dir / "dump"));
    torch::manual_seed(3);
    tptest::Net net;
    for (int s = 0; s < 2; ++s) {
      dbg.start(net, 5);
      auto y = net->forward(torch::randn({16, 8}));
      if (s == 1) y = y + torch::zeros({1}).log();  // -inf, made by an API call of its own
      y.sum().backward();
      dbg.stop();
      dbg.step();
    }
    dbg.wait_written();
  }
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    const std::string rank = dir / ("dump/step" + std::to_string(s) + "/rank5");
    const std::string file = rank + "/" + tp::io::kRankDigestFile;
    REQUIRE(fs::exists(file));
    const Json doc = tp::compare::read_json_file(rank + "/dump.json");
    tp::io::RankDigestBuilder again;
    for (auto it = doc["data"].begin(); it != doc["data"].end(); ++it)
      again.add<tp::io::rank_items::NlohmannNodes>(it.key(), &it.value());
    CHECK(file_bytes(file) == tp::io::encode_rank_digest(again.digest()));
    const tp::io::RankDigest d = tp::io::read_rank_digest(file);
    CHECK(d.dump_entries == doc["data"].size());
    std::vector<std::string> kept;
    for (const auto& e : d.entries) kept.push_back(d.strings[e.name]);
    // The module with parameters (forward) and its parameters_grad; no API call, no backward entry.
    CHECK(kept == std::vector<std::string>{"Module.fc.Linear.forward.0", "Module.fc.Linear.parameters_grad.0"});
    REQUIRE(d.nonfinite.has_value() == (s == 1));
    if (s == 1) {
      CHECK(d.nonfinite->entry == "Aten.log.0.forward");
      CHECK(d.nonfinite->item == "output.0");
      CHECK(d.nonfinite->inputs_finite);
      CHECK_FALSE(d.nonfinite->received);
    }
  }
  // Not written when asked not to, nor by a process without a rank (proc{pid}: no ranks to compare).
  for (const bool with_rank : {true, false}) {
    tptest::TempDir off;
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(
        with_rank ? tp::Options().dump_path(off / "dump").rank_digest(false) : tp::Options().dump_path(off / "dump"));
    tptest::Net net;
    if (with_rank)
      dbg.start(net, 1);
    else
      dbg.start(net);
    net->forward(torch::randn({2, 8})).sum().backward();
    dbg.stop();
    dbg.wait_written();
    CHECK(fs::exists(fs::path(dbg.directory()) / "dump.json"));
    CHECK_FALSE(fs::exists(fs::path(dbg.directory()) / tp::io::kRankDigestFile));
  }
}

// docs/distributed.md's way of looking at a job whose ranks write to disks of their own: rank 0
// gathers the ranks' digests over c10d, and the view of the gathered digests alone is the view of
// the dump.
TEST_CASE("rank 0 gathers every rank's ranks_digest.bin over Gloo; the gathered digests alone give the dump's view") {
  namespace ranks = tp::compare::ranks;
  tptest::TempDir dir;
  REQUIRE(launch(4, "gather", dir.path()) == 0);
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    const std::string rank = "/step0/rank" + std::to_string(r) + "/" + tp::io::kRankDigestFile;
    const std::string gathered = file_bytes(dir / ("gathered" + rank));
    CHECK(gathered.size() > 20);
    CHECK(gathered == file_bytes(dir / ("dump" + rank)));
  }
  CHECK_FALSE(fs::exists(dir / "gathered/step0/rank0/dump.json"));
  const std::vector<ranks::StepView> gathered = ranks::view_dump(dir / "gathered");
  const std::vector<ranks::StepView> dumped = ranks::view_dump(dir / "dump");
  REQUIRE(gathered.size() == 1);
  REQUIRE(dumped.size() == 1);
  CHECK(gathered[0].source.digests);
  CHECK(gathered[0].ranks == std::vector<long>{0, 1, 2, 3});
  CHECK_FALSE(gathered[0].first.has_value());
  CHECK(gathered[0].replicated.parameters == 2);
  CHECK(gathered[0].replicated.collective_outputs == 2);
  REQUIRE(gathered[0].collectives.size() == 2);
  for (const ranks::CollectiveCall& c : gathered[0].collectives) {
    CHECK(c.entered == std::vector<long>{0, 1, 2, 3});
    CHECK(c.outputs_agree);
  }
  std::ostringstream a, b;
  CHECK(ranks::print_views(gathered, a) == 0);
  CHECK(ranks::print_views(dumped, b) == 0);
  CHECK(a.str() == b.str());
}

// step0's dump.json of each rank, whole, as python3's json reads it: {"rank0": {entry: ...}, ...}.
Json read_step0(const std::string& dump, int world) {
  int rc = -1;
  const std::string out = tptest::run_python(
      "import json\n"
      "print(json.dumps({'rank%d' % r: json.load(open('" +
          dump + "/step0/rank%d/dump.json' % r))['data'] for r in range(" + std::to_string(world) + ")}))\n",
      &rc);
  REQUIRE_MESSAGE(rc == 0, out);
  return Json::parse(out);
}

TEST_CASE(
    "collectives that go through the dispatcher are recorded once each, with msprobe's arguments and the result "
    "read after their work completed") {
  tptest::TempDir dir;
  REQUIRE(launch(2, "dispatch", dir.path()) == 0);
  const Json data = read_step0(dir / "dump", 2);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const Json& d = data["rank" + std::to_string(r)];
    const auto max_of = [](const Json& item) { return item["Max"].get<double>(); };
    std::vector<std::string> names;
    for (const auto& [name, entry] : d.items()) names.push_back(name);
    // Every call once, in call order; nothing from the ops Gloo's own thread runs inside all_gather.
    const std::string peer = r == 0 ? "Distributed.send.0.forward" : "Distributed.recv.0.forward";
    CHECK(names == std::vector<std::string>{"Distributed.all_reduce.0.forward", "Aten.mul.0.forward",
                                            "Distributed.all_reduce.1.forward", "Distributed.broadcast.0.forward",
                                            "Distributed.all_gather.0.forward", peer, "Distributed.barrier.0.forward",
                                            "Distributed.reduce.0.forward", "Distributed.gather.0.forward",
                                            "Distributed.scatter.0.forward", "Distributed.all_reduce.2.forward",
                                            "Distributed.all_reduce.3.forward"});
    const Json world_group = {{"type", "torch.ProcessGroup"}, {"group_ranks", {0, 1}}, {"group_id", "77849d8c"}};

    const Json& ar = d["Distributed.all_reduce.0.forward"];
    CHECK(max_of(ar["input_args"][0]) == r + 1);
    CHECK(max_of(ar["output"][0]) == 3);  // 1 + 2, read before the mul that followed the wait
    CHECK(ar["input_kwargs"]["op"] == Json({{"type", "torch.distributed.ReduceOp"}, {"value", "RedOpType.SUM"}}));
    CHECK(ar["input_kwargs"]["group"] == world_group);
    CHECK(max_of(d["Aten.mul.0.forward"]["input_args"][0]) == 3);
    CHECK(max_of(d["Distributed.all_reduce.1.forward"]["output"][0]) == 30);  // waited on after the others

    const Json& bc = d["Distributed.broadcast.0.forward"];
    CHECK(max_of(bc["input_args"][0]) == 10 * r + 5);
    CHECK(max_of(bc["output"][0]) == 5);
    CHECK(bc["input_kwargs"]["src"] == Json({{"type", "int"}, {"value", 0}}));

    const Json& ag = d["Distributed.all_gather.0.forward"];  // all_gather(tensor_list, tensor)
    REQUIRE(ag["input_args"][0].size() == 2);
    CHECK(max_of(ag["input_args"][0][1]) == 0);
    CHECK(max_of(ag["input_args"][1]) == r);
    CHECK(max_of(ag["output"][0][0]) == 0);
    CHECK(max_of(ag["output"][0][1]) == 1);

    const Json& p2p = d[peer];
    CHECK(p2p["input_kwargs"][r == 0 ? "dst" : "src"]["value"] == 1 - r);
    CHECK(p2p["input_kwargs"]["tag"]["value"] == 3);
    CHECK(max_of(p2p["output"][0]) == 7);

    CHECK(d["Distributed.barrier.0.forward"]["input_kwargs"]["group"] == world_group);

    const Json& rd = d["Distributed.reduce.0.forward"];  // reduce(tensor, dst, op)
    CHECK(rd["input_kwargs"]["dst"]["value"] == 0);
    CHECK(rd["input_kwargs"]["op"]["value"] == "RedOpType.SUM");
    if (r == 0) CHECK(max_of(rd["output"][0]) == 3);

    const Json& ga = d["Distributed.gather.0.forward"];  // gather(tensor, gather_list, dst)
    CHECK(max_of(ga["input_args"][0]) == r + 5);
    CHECK(ga["input_kwargs"]["dst"]["value"] == 0);
    if (r == 0) {
      REQUIRE(ga["output"][1].size() == 2);
      CHECK(max_of(ga["output"][1][0]) == 5);
      CHECK(max_of(ga["output"][1][1]) == 6);
    } else {
      CHECK(ga["input_args"][1] == Json::array());  // no gather_list off the destination
    }

    const Json& sc = d["Distributed.scatter.0.forward"];  // scatter(tensor, scatter_list, src)
    CHECK(max_of(sc["input_args"][0]) == 0);
    CHECK(sc["input_args"][1].size() == (r == 0 ? 2u : 0u));
    CHECK(sc["input_kwargs"]["src"]["value"] == 0);
    CHECK(max_of(sc["output"][0]) == 10 * (r + 1));
    CHECK(max_of(d["Distributed.all_reduce.2.forward"]["output"][0]) == 3);  // the wrapper's, once

    const Json& own = d["Distributed.all_reduce.3.forward"]["input_kwargs"]["group"];
    CHECK(own["group_ranks"] == Json::array({r}));
    CHECK(own["group_id"] == (r == 0 ? "553403f9" : "4c2f32b8"));  // crc32 of "[0]" and "[1]"
  }
}

}  // namespace dist_test

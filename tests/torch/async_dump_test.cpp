// async_dump: tensor files are handed to the writer only when the step is written (stop()/step()),
// and a CUDA tensor's copy to the host is queued on its stream without waiting for it. The files
// are those async_dump false writes, bit for bit. Without a GPU the CUDA tests print "SKIPPED".
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

std::string rank_dir(const std::string& dump) { return dump + "/step0/proc" + std::to_string(::getpid()); }

struct Run {
  std::uint64_t handed_during_step = 0;  // tensor files given to the writer before stop()
  double host_seconds = 0;               // the training thread's time from the first call to stop()
};

// mul of a transposed view, relu, then an in-place add_ on relu's result: each file must hold the
// values of its call, not what the tensor holds at stop(). `before` runs first, on the device.
template <class Before>
Run run_program(const std::string& dump, bool async_dump, const torch::Device& device, Before&& before) {
  tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(
      tp::Options().dump_path(dump).async_dump(async_dump).list({"mul", "relu", "add_"}));
  const at::Tensor x = (torch::arange(12, at::kFloat) * 0.25 - 1.5).reshape({3, 4}).to(device);
  dbg.start();
  const auto t0 = Clock::now();
  before();
  at::Tensor w = torch::relu(torch::mul(x.t(), 2.0));
  w.add_(1.0);
  Run r;
  r.host_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.handed_during_step = dbg.task().saver().writer()->ticket();
  dbg.stop();
  dbg.wait_written();
  return r;
}
Run run_program(const std::string& dump, bool async_dump, const torch::Device& device) {
  return run_program(dump, async_dump, device, [] {});
}

const std::vector<std::string> kFiles = {"Aten.add_.0.forward.input.0.pt", "Aten.add_.0.forward.output.0.pt",
                                         "Aten.mul.0.forward.input.0.pt",  "Aten.mul.0.forward.output.0.pt",
                                         "Aten.relu.0.forward.input.0.pt", "Aten.relu.0.forward.output.0.pt"};

std::vector<std::string> files_in(const std::string& rank) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(rank + "/dump_tensor_data")) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// python3's torch.load of each file against the values python computes itself.
void check_with_python(const std::string& rank) {
  int rc = 0;
  const std::string out = tptest::run_python(
      "import torch\n"
      "d = '" +
          rank +
          "/dump_tensor_data/'\n"
          "x = (torch.arange(12, dtype=torch.float32) * 0.25 - 1.5).reshape(3, 4)\n"
          "m = x.t() * 2.0\n"
          "r = torch.relu(m)\n"
          "want = {'mul.0.forward.input.0': x.t(), 'mul.0.forward.output.0': m, 'relu.0.forward.input.0': m,\n"
          "        'relu.0.forward.output.0': r, 'add_.0.forward.input.0': r, 'add_.0.forward.output.0': r + 1}\n"
          "for k in sorted(want):\n"
          "    t = torch.load(d + 'Aten.' + k + '.pt')\n"
          "    print(k, t.device.type == 'cpu' and t.dtype == torch.float32 and t.is_contiguous() and "
          "torch.equal(t, want[k]))\n",
      &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out ==
        "add_.0.forward.input.0 True\nadd_.0.forward.output.0 True\nmul.0.forward.input.0 True\n"
        "mul.0.forward.output.0 True\nrelu.0.forward.input.0 True\nrelu.0.forward.output.0 True\n");
}

void check_same_bytes(const std::string& rank_a, const std::string& rank_b) {
  REQUIRE(files_in(rank_a) == kFiles);
  REQUIRE(files_in(rank_b) == kFiles);
  for (const std::string& f : kFiles) {
    CAPTURE(f);
    const std::string a = tptest::read_text(rank_a + "/dump_tensor_data/" + f);
    CHECK(!a.empty());
    CHECK(a == tptest::read_text(rank_b + "/dump_tensor_data/" + f));
  }
}

// at::cuda::sleep(cycles) from libtorch_cuda, found at run time: the tests link no CUDA library.
using SleepFn = void (*)(std::int64_t);
SleepFn cuda_sleep() { return reinterpret_cast<SleepFn>(::dlsym(RTLD_DEFAULT, "_ZN2at4cuda5sleepEl")); }

}  // namespace

TEST_CASE("async_dump: tensor files reach the writer at stop(), equal async_dump false's bit for bit") {
  tptest::TempDir tmp;
  const Run held = run_program(tmp / "async", true, torch::kCPU);
  const Run direct = run_program(tmp / "sync", false, torch::kCPU);
  CHECK(held.handed_during_step == 0);
  CHECK(direct.handed_during_step == kFiles.size());  // without async_dump, each as its entry is kept
  check_same_bytes(rank_dir(tmp / "async"), rank_dir(tmp / "sync"));
  check_with_python(rank_dir(tmp / "async"));
  CHECK_FALSE(fs::exists(rank_dir(tmp / "async") + "/dump_error_info.log"));
}

TEST_CASE("async_dump: a step's held files are written with that step, and the next step starts with none") {
  tptest::TempDir tmp;
  tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(tp::Options().dump_path(tmp.path()).async_dump(true).list({"neg"}));
  dbg.start();
  torch::ones({2}).neg();
  dbg.step();
  CHECK(dbg.task().saver().writer()->ticket() == 2);
  torch::full({3}, 2.0).neg();
  CHECK(dbg.task().saver().writer()->ticket() == 2);
  dbg.stop();
  dbg.wait_written();
  const std::string step1 = tmp.path() + "/step1/proc" + std::to_string(::getpid());
  int rc = 0;
  const std::string out = tptest::run_python(
      "import torch\n"
      "for s, want in ((0, torch.ones(2)), (1, torch.full((3,), 2.0))):\n"
      "    d = '" +
          tmp.path() + "/step%d/proc" + std::to_string(::getpid()) +
          "/dump_tensor_data/' % s\n"
          "    a = torch.load(d + 'Aten.neg.0.forward.input.0.pt')\n"
          "    b = torch.load(d + 'Aten.neg.0.forward.output.0.pt')\n"
          "    print(s, torch.equal(a, want) and torch.equal(b, -want))\n",
      &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out == "0 True\n1 True\n");
  CHECK(files_in(step1).size() == 2);
}

TEST_CASE("async_dump: a step's snapshots stay in memory past max_pending_mb's cap, and every file is written") {
  tptest::TempDir tmp;
  tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(
      tp::Options().dump_path(tmp.path()).async_dump(true).max_pending_mb(1).list({"neg"}));
  // Four calls of 2 MiB each, input and output: 16 MiB of snapshots against a cap of 1 MiB. A cap
  // that made the step wait for the writer would never be lifted (the files go at stop()): run the
  // step on another thread so that a hang fails the case instead of the suite.
  auto step = std::async(std::launch::async, [&] {
    dbg.start();
    for (int k = 0; k < 4; ++k) torch::full({1 << 19}, double(k + 1)).neg();
    const auto handed = dbg.task().saver().writer()->ticket();
    dbg.stop();
    return handed;
  });
  REQUIRE(step.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  CHECK(step.get() == 0);  // nothing handed over during the step
  dbg.wait_written();
  int rc = 0;
  const std::string out = tptest::run_python(
      "import torch\n"
      "d = '" +
          rank_dir(tmp.path()) +
          "/dump_tensor_data/'\n"
          "ok = all(torch.equal(torch.load(d + 'Aten.neg.%d.forward.input.0.pt' % k), torch.full((1 << 19,), k + "
          "1.0))\n"
          "         and torch.equal(torch.load(d + 'Aten.neg.%d.forward.output.0.pt' % k), torch.full((1 << 19,), -k - "
          "1.0))\n"
          "         for k in range(4))\n"
          "print(ok)\n",
      &rc);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out == "True\n");
}

TEST_CASE("async_dump: CUDA tensors are copied without waiting for the device, files equal to the CPU run's" *
          TP_NEEDS("cuda")) {
  if (!torch::cuda::is_available()) TP_SKIP("no CUDA device");
  tptest::TempDir tmp;
  const torch::Device cuda(torch::kCUDA, 0);
  const Run held = run_program(tmp / "cuda", true, cuda);
  CHECK(held.handed_during_step == 0);
  run_program(tmp / "cpu", true, torch::kCPU);
  check_same_bytes(rank_dir(tmp / "cuda"), rank_dir(tmp / "cpu"));
  check_with_python(rank_dir(tmp / "cuda"));
  CHECK_FALSE(fs::exists(rank_dir(tmp / "cuda") + "/dump_error_info.log"));
}

TEST_CASE("async_dump: the training thread does not wait for the device while the step runs (CUDA)" *
          TP_NEEDS("cuda")) {
  if (!torch::cuda::is_available()) TP_SKIP("no CUDA device");
  const SleepFn sleep = cuda_sleep();
  if (!sleep) TP_SKIP("at::cuda::sleep not found in the loaded libtorch");
  tptest::TempDir tmp;
  const torch::Device cuda(torch::kCUDA, 0);
  run_program(tmp / "warm", true, cuda);  // pinned host blocks and kernels are ready from here on
  // About a second of device time queued ahead of the dumped calls: a copy that waits for the
  // device keeps the training thread that long; a queued one does not.
  const auto busy = [&] { sleep(std::int64_t{2000} * 1000 * 1000); };
  const Run held = run_program(tmp / "async", true, cuda, busy);
  const Run direct = run_program(tmp / "sync", false, cuda, busy);
  MESSAGE("host time before stop(): async_dump " << held.host_seconds << " s, without " << direct.host_seconds << " s");
  CHECK(direct.host_seconds > 0.3);  // the sleep is long enough to be seen
  CHECK(held.host_seconds < 0.1);
  check_same_bytes(rank_dir(tmp / "async"), rank_dir(tmp / "sync"));
  check_with_python(rank_dir(tmp / "async"));
}

// Cost of the live check (bench_path; issue 47) per op: the statistics task judging every entry
// against a reference dump as the run goes, against the same task without the check, measured
// alternately in the same run (the ratio is the median of the per-round ratios). The same for the
// md5 summary mode against an md5 reference (msprobe's own live check). Goal: within 20% of the
// task without the check (ratio <= 1.2). Files are written each step with the default sink.
//
// The model is a stack of N x (Linear(64, 64) + relu) on a batch of 8, at N = 4, 40 and 400 (1x, 10x
// and 100x the entries per step): the per-op cost must not grow with the number of entries the
// reference holds (one hash lookup an entry).
//
//   build/benchmarks/torchprobe_benchmarks live_check
#include <torch/torch.h>
#include <torchprobe/torchprobe.hpp>

#include "registry.hpp"
#include "bench_support.hpp"
#include "../tests/remove_tree.hpp"  // not std::filesystem::remove_all: see there

#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace tp = torchprobe;

namespace {

struct StackImpl : torch::nn::Module {
  explicit StackImpl(int n) {
    for (int i = 0; i < n; ++i) layers.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(64, 64)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = torch::relu(l(x));
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};
TORCH_MODULE(Stack);

// One probed step: forward, sum().backward(), the step's files written.
template <class Dbg>
void probed_step(Dbg& dbg, Stack& model, const torch::Tensor& x) {
  dbg.start(model.ptr());
  model->forward(x).sum().backward();
  dbg.stop();
  dbg.step();
  dbg.wait_written();  // the step's files complete on disk: what a user pays
}

// The rank directory of the step written under `dir`.
std::string rank_dir(const std::string& dir) {
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(dir) / "step0"))
    return e.path().string();
  return {};
}

void measure(int layers, const std::string& summary_mode, int steps, int rounds) {
  torch::manual_seed(1234);
  Stack model(layers);
  const torch::Tensor x = torch::randn({8, 64}, torch::requires_grad());
  const std::string base = (std::filesystem::temp_directory_path() / "torchprobe_live_check_bench").string();
  tptest::remove_tree(base);
  // The reference: one step of the same model, same task and mode.
  {
    tp::Debugger<tp::Level::Mix, tp::Task::Statistics> ref(
        tp::Options().dump_path(base + "/ref").summary_mode(summary_mode));
    probed_step(ref, model, x);
  }
  const std::string reference = rank_dir(base + "/ref");
  tp::Debugger<tp::Level::Mix, tp::Task::Statistics> plain(
      tp::Options().dump_path(base + "/plain").summary_mode(summary_mode));
  tp::Debugger<tp::Level::Mix, tp::Task::Statistics> checked(
      tp::Options().dump_path(base + "/checked").summary_mode(summary_mode).bench_path(reference));
  const tpbench::Alternated r = tpbench::alternate([&] { probed_step(plain, model, x); },
                                                   [&] { probed_step(checked, model, x); }, steps, rounds, 2);
  // Entries per step: N Linear modules and N relu calls forward, their backward, N addmm/t... (read
  // from the reference itself).
  std::size_t entries = 0;
  {
    std::ifstream in(reference + "/dump.json");
    const auto doc = nlohmann::json::parse(in);
    entries = doc["data"].size();
  }
  const double added_per_entry = (r.probed_us - r.plain_us) / static_cast<double>(entries);
  std::printf("  %-8s N = %-4d %6zu entries  %10.1f us  %10.1f us  %6.3fx  %+7.3f us/entry\n", summary_mode.c_str(),
              layers, entries, r.plain_us, r.probed_us, r.ratio, added_per_entry);
  tptest::remove_tree(base);
}

}  // namespace

TORCHPROBE_BENCHMARK(live_check) {
  const bool quick = tpbench::quick_mode();
  std::printf(
      "TorchProbe live check (bench_path) cost: mix level, a step = forward + sum().backward() of N x\n"
      "(Linear(64,64) + relu), batch 8, its files written; baseline = the same task and summary_mode\n"
      "without the check, timed alternately in the same run (median ratio of the rounds). Goal <= 1.2x\n\n"
      "  %-8s %-8s %13s  %13s  %13s  %7s  %s\n",
      "mode", "", "", "without", "with check", "ratio", "added");
  for (const char* mode : {"statistics", "md5"})
    for (const int n : {4, 40, 400}) {
      if (quick && n > 4) continue;
      const int steps = quick ? 1 : std::max(1, 400 / n);
      measure(n, mode, steps, quick ? 1 : 9);
    }
  return 0;
}

// Issue 14, writing a step at memory speed and off the training thread: the end-to-end cost of the
// default DirectorySink (until the step's files are complete), the writer's throughput against a
// memcpy, the fixed cost of a step, two models against their un-probed step, and the memory an open
// step and its writing take. Every figure comes with its baseline of the same run.
//
//   cmake -S . -B build-bench -DTORCHPROBE_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release
//   cmake --build build-bench --target torchprobe_benchmarks &&
//   build-bench/benchmarks/torchprobe_benchmarks step_write [SECTION ...]   (1-6; default: all)
#include <torch/torch.h>
#include <torchprobe/torchprobe.hpp>

#include <nlohmann/json.hpp>

#include "registry.hpp"
#include "step_write_support.hpp"
#include "../tests/remove_tree.hpp"  // not std::filesystem::remove_all: see there

#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <algorithm>
#include <string>
#include <unistd.h>
#include <vector>

namespace tp = torchprobe;
namespace fs = std::filesystem;
using tpbench::Clock;
using tpbench::Round;
using tpbench::us_since;
using tpbench::Variant;

namespace {

template <tp::Level L, class Sink>
using Stats = tp::Debugger<L, tp::Task::Statistics, Sink>;
using L1Dir = Stats<tp::Level::L1, tp::DirectorySink>;

// The default sink as it was before issue 45: dump.json made again from the records, not laid out
// from the journal's text (each entry's text made twice). The same files, the same journal.
struct TextTwiceSink : tp::DirectorySink {
  void write_step(const tp::StepDump& d) {
    tp::StepDump without = d;
    without.journal = {};
    tp::DirectorySink::write_step(without);
  }
};
using L1TextTwice = Stats<tp::Level::L1, TextTwiceSink>;
using MixDir = Stats<tp::Level::Mix, tp::DirectorySink>;

volatile std::int64_t g_keep = 0;  // keeps the adds' results observable

void adds(const at::Tensor& a, const at::Tensor& b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) g_keep = at::add(a, b).numel();
}

tp::Options options(const fs::path& dir) { return tp::Options().dump_path(dir.string()); }

double file_mb(const fs::path& p) {
  std::error_code ec;
  const auto size = fs::file_size(p, ec);
  return ec ? 0.0 : static_cast<double>(size) / 1e6;
}

std::size_t dump_entries(const fs::path& dump_json) {
  std::ifstream in(dump_json);
  if (!in) return 0;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  return j.is_object() && j.contains("data") ? j["data"].size() : 0;
}

// ---- 1. tiny op end-to-end ---------------------------------------------------------------------
// Wall time, and the CPU time of every thread (issue 45 counts them all: a writer thread's work is
// a core the training cannot use), per op, against the un-probed loop of the same rounds.
void print_cpu(const std::vector<Variant>& v, std::int64_t n) {
  std::vector<std::string> roles = {"training", "tp-journal", "tp-step-writer", "tp-tensor-files", "other"};
  for (const Variant& x : v)
    for (const Round& r : x.rounds)
      for (const auto& [role, us] : r.cpu_us)
        if (std::find(roles.begin(), roles.end(), role) == roles.end()) roles.push_back(role);
  std::printf("  CPU time added per op (us), by thread; median of the rounds [min-max]:\n  %-28s %20s", "",
              "all threads");
  for (const std::string& role : roles) std::printf(" %16s", role.c_str());
  std::printf("\n");
  const Variant& plain = v[0];
  for (std::size_t k = 1; k < v.size(); ++k) {
    const Variant& x = v[k];
    auto added = [&](const Round& r, const std::string* role) {
      const std::size_t i = static_cast<std::size_t>(&r - x.rounds.data());
      const Round& p = plain.rounds[std::min(i, plain.rounds.size() - 1)];
      return (role ? r.cpu(*role) - p.cpu(*role) : r.cpu_total() - p.cpu_total()) / static_cast<double>(n);
    };
    double lo = 0, hi = 0;
    const double all = x.med_of([&](const Round& r) { return added(r, nullptr); }, &lo, &hi);
    char cell[64];
    std::snprintf(cell, sizeof cell, "%.2f [%.2f-%.2f]", all, lo, hi);
    std::printf("  %-28s %20s", x.name.c_str(), cell);
    for (const std::string& role : roles)
      std::printf(" %16.2f", x.med_of([&](const Round& r) { return added(r, &role); }));
    std::printf("\n");
  }
}

void tiny_op(const fs::path& root, std::int64_t n, int steps, int rounds, bool loaded) {
  const at::Tensor a = torch::randn({16}), b = torch::randn({16});
  const fs::path dir = root / ("tiny" + std::to_string(n));
  Stats<tp::Level::L1, tp::NullSink> null_sink(options(dir));
  L1Dir l1(options(dir / "l1"));
  L1TextTwice twice(options(dir / "twice"));
  MixDir mix(options(dir / "mix"));
  L1Dir ranked(options(dir / "ranked"));  // a process with a rank also writes ranks_digest.bin
  torch::nn::Linear model(1, 1);          // mix dumps a model's modules, so start() needs one
  std::vector<Variant> v;
  v.push_back({"un-probed", [&] { return tpbench::plain_round([&] { adds(a, b, n); }, steps); }, {}});
  auto probed = [&](const char* name, auto& d) {
    v.push_back({name,
                 [&, dp = &d] {
                   return tpbench::probed_round(
                       *dp,
                       [&] {
                         if constexpr (std::is_same_v<std::decay_t<decltype(d)>, MixDir>) {
                           dp->start(model);
                         } else if constexpr (std::is_same_v<std::decay_t<decltype(d)>, L1Dir>) {
                           if (dp == &ranked)
                             dp->start(model, 0);
                           else
                             dp->start();
                         } else {
                           dp->start();
                         }
                         adds(a, b, n);
                       },
                       steps);
                 },
                 {}});
  };
  probed("L1 NullSink", null_sink);
  probed("L1 DirectorySink (default)", l1);
  probed("Mix DirectorySink", mix);
  probed("L1 text made twice (before)", twice);
  probed("L1 DirectorySink, rank 0", ranked);  // v[5]: the default sink with the rank's digest
  {
    std::optional<tpbench::BusyThreads> load;
    if (loaded) load.emplace(2);
    tpbench::run_rounds(v, rounds);
  }
  std::printf("\n  N = %lld adds per step, %d steps per round, median of %d interleaved rounds%s\n",
              static_cast<long long>(n), steps, rounds,
              loaded ? "; LOADED: two threads spinning beside it (no bound applies)" : "; quiet");
  std::printf("  %-28s %11s %9s %18s %22s %16s\n", "", "us/step", "x plain", "+us/op [min-max]",
              "in stop()+step() us/op", "final wait us/op");
  const double plain = v[0].med(&Round::step_us);
  for (const Variant& x : v) {
    const double us = x.med(&Round::step_us);
    double lo = 0, hi = 0;
    x.med_of([&](const Round& r) { return r.step_us; }, &lo, &hi);
    char cell[64];
    std::snprintf(cell, sizeof cell, "%.2f [%.2f-%.2f]", (us - plain) / n, (lo - plain) / n, (hi - plain) / n);
    std::printf("  %-28s %11.0f %8.2fx %18s %22.3f %16.3f\n", x.name.c_str(), us, us / plain, cell,
                x.med(&Round::inside_us) / n, x.med(&Round::drain_us) / n);
  }
  print_cpu(v, n);
  auto cpu_added = [&](const std::string* role) {
    return v[2].med_of([&](const Round& r) {
      const Round& p = v[0].rounds[static_cast<std::size_t>(&r - v[2].rounds.data())];
      return (role ? r.cpu(*role) - p.cpu(*role) : r.cpu_total() - p.cpu_total()) / static_cast<double>(n);
    });
  };
  const std::string training = "training";
  const double all = cpu_added(nullptr), train = cpu_added(&training);
  const double dir_added = (v[2].med(&Round::step_us) - plain) / n;
  if (loaded) {
    std::printf("  loaded: %.2f us of CPU added per op (all threads), %.2f on the training thread, %.2f us wall\n", all,
                train, dir_added);
  } else {
    std::printf("  goal: <= 2 us of CPU added per op, all threads, default sink: %.2f us = %.2fx the goal\n", all,
                all / 2.0);
    std::printf("  goal: <= 1 us of CPU added per op on the training thread: %.2f us = %.2fx the goal\n", train,
                train / 1.0);
    std::printf("  wall time added per op with the directory sink: %.2f us\n", dir_added);
    const double ranked_all = v[5].med_of([&](const Round& r) {
      const Round& p = v[0].rounds[static_cast<std::size_t>(&r - v[5].rounds.data())];
      return (r.cpu_total() - p.cpu_total()) / static_cast<double>(n);
    });
    std::printf(
        "  goal: <= 2 us of CPU added per op, all threads, default sink with a rank (+ ranks_digest.bin): "
        "%.2f us = %.2fx the goal\n",
        ranked_all, ranked_all / 2.0);
  }
  tptest::remove_tree(dir);
}

// ---- 2. writer throughput ----------------------------------------------------------------------
// dump.json's text alone, on the thread that writes it: a sink that produces the text from the
// step's records into a drain that only counts it (no file, no journal, no fsync).
class CountingDrain final : public tp::io::TextDrain {
 public:
  void take(std::string_view text) override { bytes += text.size(); }
  std::size_t bytes = 0;
};

struct TextOnlySink {
  double us = 0;
  std::size_t bytes = 0;
  void open(const std::string&) {}
  void write_step(const tp::StepDump& d) {
    CountingDrain drain;
    std::string buf;
    buf.reserve(std::size_t{1} << 20);
    tp::io::JsonText out(buf, 1, &drain);
    const auto t0 = Clock::now();
    tp::step_text::write_dump(out, d);
    out.drain();
    us = us_since(t0);
    bytes = drain.bytes;
  }
};

void text_throughput(std::int64_t n, int rounds) {
  const at::Tensor a = torch::randn({16}), b = torch::randn({16});
  std::vector<double> mbps;
  for (int r = 0; r < rounds; ++r) {
    tp::Debugger<tp::Level::L1, tp::Task::Statistics, TextOnlySink> d;
    d.start();
    adds(a, b, n);
    d.stop();
    mbps.push_back(static_cast<double>(d.sink().bytes) / d.sink().us);
  }
  std::printf("  dump.json text alone, from the records on one core: %.1f MB/s = %.3fx the goal (400 MB/s)\n",
              tpbench::median(mbps), tpbench::median(mbps) / 400.0);
}

void throughput(const fs::path& root, std::int64_t n, int rounds) {
  const at::Tensor a = torch::randn({16}), b = torch::randn({16});
  std::vector<double> total_us, inside_us;
  double dump = 0, stack = 0, construct = 0;
  for (int r = 0; r < rounds; ++r) {
    const fs::path dir = root / "throughput";
    {
      L1Dir d(options(dir));
      d.start();
      adds(a, b, n);
      const fs::path where = d.directory();
      const auto t0 = Clock::now();
      d.stop();
      d.step();
      inside_us.push_back(us_since(t0));
      tpbench::wait_written(d);
      total_us.push_back(us_since(t0));
      dump = file_mb(where / "dump.json");
      stack = file_mb(where / "stack.json");
      construct = file_mb(where / "construct.json");
    }
    tptest::remove_tree(dir);
  }
  const double t = tpbench::median(total_us), mbps = dump / (t / 1e6);
  // Baseline: a memcpy of a buffer the size of dump.json, both buffers touched beforehand.
  const std::size_t bytes = static_cast<std::size_t>(dump * 1e6) + 1;
  std::vector<char> src(bytes, 'x'), dst(bytes, 'y');
  std::vector<double> copy_us;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    copy_us.push_back(us_since(t0));
    g_keep = dst[bytes / 2 + r % 2];
  }
  const double copy_mbps = dump / (tpbench::median(copy_us) / 1e6);
  std::printf("  %lld entries, median of %d; %s\n", static_cast<long long>(n), rounds, tpbench::writer_kind<L1Dir>());
  std::printf("  dump.json %.2f MB (%.0f bytes/entry), stack.json %.3f MB, construct.json %.3f MB\n", dump,
              dump * 1e6 / n, stack, construct);
  std::printf("  stop()+step() on the training thread %.1f ms, until the files are complete %.1f ms\n",
              tpbench::median(inside_us) / 1e3, t / 1e3);
  std::printf(
      "  dump.json written at %.1f MB/s = %.4fx memcpy of the same size (%.0f MB/s) = %.3fx the goal (400 MB/s)\n",
      mbps, mbps / copy_mbps, copy_mbps, mbps / 400.0);
}

// ---- 3. fixed cost of a step -------------------------------------------------------------------
template <class D>
std::vector<double> one_entry_steps(D& d, const at::Tensor& a, const at::Tensor& b, int steps, double& drain_ms) {
  std::vector<double> ms;
  for (int s = 0; s < steps + 3; ++s) {  // 3 warm-up steps
    const auto t0 = Clock::now();
    d.start();
    adds(a, b, 1);
    d.stop();
    d.step();
    if (s >= 3) ms.push_back(us_since(t0) / 1e3);
  }
  const auto t0 = Clock::now();
  tpbench::wait_written(d);
  drain_ms = us_since(t0) / 1e3;
  return ms;
}

void fixed_cost(const fs::path& root, int steps) {
  const at::Tensor a = torch::randn({16}), b = torch::randn({16});
  const fs::path dir = root / "fixed";
  double null_drain = 0, dir_drain = 0;
  std::vector<double> null_ms, dir_ms;
  {
    Stats<tp::Level::L1, tp::NullSink> null_sink(options(dir));
    L1Dir d(options(dir));
    null_ms = one_entry_steps(null_sink, a, b, steps, null_drain);
    dir_ms = one_entry_steps(d, a, b, steps, dir_drain);
  }
  const double plain_ms = tpbench::plain_round([&] { adds(a, b, 1); }, 1000).step_us / 1e3;
  const double nul = tpbench::median(null_ms), dms = tpbench::median(dir_ms);
  std::printf("  median of %d steps (start(); one add; stop(); step()), on the training thread\n", steps);
  std::printf("  %-28s %10.4f ms\n", "one add, un-probed", plain_ms);
  std::printf("  %-28s %10.4f ms  %8.1fx un-probed\n", "L1 NullSink", nul, nul / plain_ms);
  std::printf("  %-28s %10.4f ms  %8.1fx NullSink  %6.2fx the goal (0.3 ms); final wait %.2f ms for all %d steps\n",
              "L1 DirectorySink", dms, dms / nul, dms / 0.3, dir_drain, steps);
  tptest::remove_tree(dir);
}

// ---- 4, 5. models against their un-probed step -------------------------------------------------
template <class Model, class Body>
void model_ratio(const fs::path& dir, Model& model, const Body& body, int steps, int rounds, double goal) {
  MixDir d(options(dir));
  std::vector<Variant> v;
  v.push_back({"un-probed", [&] { return tpbench::plain_round(body, steps); }, {}});
  v.push_back({"Mix statistics DirectorySink",
               [&] {
                 return tpbench::probed_round(
                     d,
                     [&] {
                       d.start(model);
                       body();
                     },
                     steps);
               },
               {}});
  tpbench::run_rounds(v, rounds);
  const double plain = v[0].med(&Round::step_us), probed = v[1].med(&Round::step_us);
  const std::size_t entries = dump_entries(fs::path(d.directory()) / "dump.json");
  std::printf("  %d steps per round, median of %d rounds; %zu dump.json entries per step\n", steps, rounds, entries);
  std::printf("  %-30s %10.2f ms\n", "un-probed", plain / 1e3);
  std::printf(
      "  %-30s %10.2f ms  %6.3fx un-probed (goal <= %.2fx), %+.2f ms per step; in stop()+step() %.2f ms, "
      "final wait %.2f ms\n",
      v[1].name.c_str(), probed / 1e3, probed / plain, goal, (probed - plain) / 1e3, v[1].med(&Round::inside_us) / 1e3,
      v[1].med(&Round::drain_us) / 1e3);
  tptest::remove_tree(dir);
}

void transformer(const fs::path& root, int steps, int rounds) {
  constexpr std::int64_t kVocab = 1000;
  tpbench::TinyTransformer model(kVocab, 64, 4, 2);
  const torch::Tensor tokens = torch::randint(0, kVocab, {8, 32}), targets = torch::randint(0, kVocab, {8 * 32});
  auto body = [&] {
    model->zero_grad();
    torch::nn::functional::cross_entropy(model->forward(tokens).view({-1, kVocab}), targets).backward();
  };
  model_ratio(root / "transformer", model, body, steps, rounds, 1.5);
}

void mlp(const fs::path& root, std::int64_t batch, int steps, int rounds) {
  tpbench::Mlp1024 model;
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(1e-3));
  const torch::Tensor x = torch::randn({batch, 1024});
  auto body = [&] {
    sgd.zero_grad();
    model->forward(x).mean().backward();
    sgd.step();
  };
  model_ratio(root / "mlp", model, body, steps, rounds, 1.05);
}

// ---- 6. memory ---------------------------------------------------------------------------------
void memory(const fs::path& root, std::int64_t n) {
  const at::Tensor a = torch::randn({16}), b = torch::randn({16});
  const fs::path dir = root / "memory";
  tpbench::release_free_heap();  // pages freed by earlier sections would hide this one's growth
  {
    L1Dir d(options(dir));
    d.start();  // a first small step, so that one-off allocations are not counted
    adds(a, b, 100);
    d.stop();
    d.step();
    tpbench::wait_written(d);
    d.start();
    const long long heap0 = tpbench::malloc_in_use(), rss0 = tpbench::proc_status_bytes("VmRSS");
    adds(a, b, n);
    const long long heap1 = tpbench::malloc_in_use(), rss1 = tpbench::proc_status_bytes("VmRSS");
    const fs::path where = d.directory();
    const bool peak_reset = tpbench::reset_peak_rss();
    d.stop();
    d.step();
    tpbench::wait_written(d);
    const long long hwm = tpbench::proc_status_bytes("VmHWM");
    const double json_per_entry = file_mb(where / "dump.json") * 1e6 / n;
    std::printf("  %lld adds in one open L1 step; dump.json holds %.0f bytes per entry\n", static_cast<long long>(n),
                json_per_entry);
    if (heap0 >= 0) {
      const double per = static_cast<double>(heap1 - heap0) / n;
      std::printf("  open step: %.0f malloc'd bytes per entry = %.2fx its dump.json text = %.2fx the goal (256)\n", per,
                  per / json_per_entry, per / 256.0);
    } else {
      std::printf("  open step: mallinfo2() not available, malloc'd bytes not measured\n");
    }
    std::printf("  open step: RSS +%.1f MB (%.0f bytes per entry)\n", (rss1 - rss0) / 1e6,
                static_cast<double>(rss1 - rss0) / n);
    if (peak_reset && hwm >= 0) {
      const double above = (hwm - rss1) / 1e6;
      std::printf("  writing: peak RSS %.1f MB above the open step = %.2fx the goal (64 MB)\n", above, above / 64.0);
    } else {
      std::printf("  writing: /proc/self/clear_refs not writable, peak RSS during the write not measured\n");
    }
  }
  tptest::remove_tree(dir);
}

}  // namespace

TORCHPROBE_BENCHMARK(step_write) {
  const bool quick = tpbench::quick_mode();
  std::vector<int> sections;
  for (int i = 1; i < argc; ++i) sections.push_back(std::atoi(argv[i]));
  auto want = [&](int k) {
    return sections.empty() || std::find(sections.begin(), sections.end(), k) != sections.end();
  };
  torch::manual_seed(1234);
  const fs::path root = fs::temp_directory_path() / ("torchprobe_step_write_bench_" + std::to_string(::getpid()));
  tptest::remove_tree(root);
  std::printf("TorchProbe step writing (issue 14); %s; ratios to baselines of this run\n",
              tpbench::writer_kind<L1Dir>());
  // The models' un-probed steps are matmuls: how fast this libtorch's BLAS is says how far their ratios carry.
  const torch::Tensor m = torch::randn({256, 1024}), w = torch::randn({1024, 1024});
  const double mm_us = tpbench::plain_round([&] { g_keep = torch::matmul(m, w).numel(); }, quick ? 1 : 3).step_us;
  std::printf("BLAS: matmul 256x1024 @ 1024x1024 at %.1f GFLOP/s, %d intra-op threads\n",
              2.0 * 256 * 1024 * 1024 / (mm_us * 1e3), at::get_num_threads());

  if (want(1))
    std::printf(
        "\n1. Tiny op end-to-end: at::add of two 16-element float tensors, Debugger<Statistics>, time until "
        "the files are complete\n");
  if (!want(1)) {
  } else if (quick) {
    tiny_op(root, 200, 2, 1, false);
  } else {
    tiny_op(root, 100, 100, 5, false);
    tiny_op(root, 1000, 10, 5, false);
    tiny_op(root, 10000, 2, 5, false);
    tiny_op(root, 1000, 10, 5, true);
  }

  if (want(2)) {
    std::printf(
        "\n2. Writer throughput: one L1 DirectorySink step of tiny adds, stop()+step() until the files are "
        "complete\n");
    throughput(root, quick ? 5000 : 100000, quick ? 1 : 3);
    text_throughput(quick ? 5000 : 100000, quick ? 1 : 3);
  }
  if (want(3)) {
    std::printf("\n3. Fixed cost of a step with one entry\n");
    fixed_cost(root, quick ? 20 : 200);
  }

  if (want(4))
    std::printf(
        "\n4. Small transformer (embedding 64, 4 heads, seq 32, 2 layers, batch 8, vocab 1000), "
        "forward + cross_entropy backward\n");
  if (want(4)) transformer(root, quick ? 1 : 10, quick ? 1 : 5);

  if (want(5))
    std::printf("\n5. Training-loop MLP: 4 x (Linear(1024) + GELU), batch %d, forward + backward + SGD step\n",
                quick ? 16 : 256);
  if (want(5)) mlp(root, quick ? 16 : 256, quick ? 1 : 2, quick ? 1 : 5);

  if (want(6)) std::printf("\n6. Memory of an open step and of writing it (L1 statistics, DirectorySink)\n");
  if (want(6)) memory(root, quick ? 5000 : 100000);

  tptest::remove_tree(root);
  return 0;
}

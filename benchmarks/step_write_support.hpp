#pragma once
// Helpers of step_write_benchmark.cpp: waiting until a step's files are complete (with or without
// a background writer), timing rounds of several variants in turn, the two models, memory readers.
#include <torch/torch.h>

#include "bench_support.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <dirent.h>
#include <pthread.h>
#include <unistd.h>

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
#include <malloc.h>
#define TPBENCH_HAVE_MALLINFO2 1
#endif

namespace tpbench {

using Clock = std::chrono::steady_clock;
inline double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// A debugger that hands steps to a writer thread has wait_written(): it blocks until every handed-over
// step is on disk. Without it, stop()/step() wrote the step before returning, so there is nothing to wait for.
template <class D, class = void>
struct has_wait_written : std::false_type {};
template <class D>
struct has_wait_written<D, std::void_t<decltype(std::declval<D&>().wait_written())>> : std::true_type {};
namespace trait_check {
struct Writes {
  void wait_written() {}
};
static_assert(has_wait_written<Writes>::value && !has_wait_written<int>::value, "wait_written() detection");
}  // namespace trait_check
template <class D>
void wait_written(D& debugger) {
  if constexpr (has_wait_written<D>::value) debugger.wait_written();
}
template <class D>
const char* writer_kind() {
  return has_wait_written<D>::value ? "background writer (wait_written() at the end)"
                                    : "synchronous writes (no wait_written())";
}

// CPU time used so far by this process's threads, in microseconds, by role: "training" (the main
// thread), each of the probe's threads by its name ("tp-journal", "tp-step-writer", ...), "other"
// (libtorch's pools and the rest). From /proc/self/task/*/schedstat (nanoseconds) where the kernel
// keeps it, else the clock ticks of /proc/self/task/*/stat. Threads named "tp-bench-load" (the
// benchmark's own load) are left out. A thread that ended since is not counted.
using ThreadCpu = std::map<std::string, double>;
inline ThreadCpu thread_cpu_us() {
  ThreadCpu out;
  const std::string pid = std::to_string(::getpid());
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return out;
  static const long ticks = ::sysconf(_SC_CLK_TCK);
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string task = std::string("/proc/self/task/") + e->d_name;
    std::string comm;
    std::getline(std::ifstream(task + "/comm"), comm);
    if (comm == "tp-bench-load") continue;
    const std::string role = e->d_name == pid ? "training" : comm.rfind("tp-", 0) == 0 ? comm : "other";
    double us = -1;
    std::ifstream sched(task + "/schedstat");
    unsigned long long ns = 0;
    if (sched >> ns) us = static_cast<double>(ns) / 1e3;
    if (us < 0) {  // fields 14 and 15 of stat: utime, stime
      std::string stat;
      std::getline(std::ifstream(task + "/stat"), stat);
      const std::size_t close = stat.rfind(')');
      if (close == std::string::npos) continue;
      const char* p = stat.c_str() + close + 2;
      char* end = nullptr;
      unsigned long long field[15] = {};
      for (int i = 3; i <= 15; ++i, p = end) field[i - 1] = std::strtoull(p, &end, 10);
      us = static_cast<double>(field[13] + field[14]) * 1e6 / static_cast<double>(ticks);
    }
    out[role] += us;
  }
  ::closedir(dir);
  return out;
}
// b - a, role by role; roles that appeared since count from zero.
inline ThreadCpu cpu_since(const ThreadCpu& a, const ThreadCpu& b) {
  ThreadCpu d;
  for (const auto& [role, us] : b) {
    const auto it = a.find(role);
    d[role] = us - (it == a.end() ? 0.0 : it->second);
  }
  return d;
}
inline double total_of(const ThreadCpu& c) {
  double t = 0;
  for (const auto& [role, us] : c) t += us;
  return t;
}

// Threads that only burn CPU while they live: "loaded" figures are measured beside them (two
// spinning threads on the 2-core development machine stand in for a build running beside).
class BusyThreads {
 public:
  explicit BusyThreads(int n) {
    for (int i = 0; i < n; ++i)
      threads_.emplace_back([this] {
        pthread_setname_np(pthread_self(), "tp-bench-load");
        volatile std::uint64_t x = 0;
        while (!stop_.load(std::memory_order_relaxed)) x = x + 1;
      });
  }
  ~BusyThreads() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// One timed round: microseconds per step, and of that per step the time inside stop()+step() and
// the wait at the end of the round until the files are complete; the CPU time every thread used
// in the round (until the files are complete), per step, by role (thread_cpu_us()).
struct Round {
  double step_us = 0, inside_us = 0, drain_us = 0;
  ThreadCpu cpu_us;
  double cpu(const std::string& role) const {
    const auto it = cpu_us.find(role);
    return it == cpu_us.end() ? 0.0 : it->second;
  }
  double cpu_total() const { return total_of(cpu_us); }
};
inline ThreadCpu per_step(ThreadCpu c, int steps) {
  for (auto& [role, us] : c) us /= steps;
  return c;
}
template <class Body>
Round plain_round(const Body& body, int steps) {
  const ThreadCpu c0 = thread_cpu_us();
  const auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) body();
  Round r{us_since(t0) / steps, 0, 0, {}};
  r.cpu_us = per_step(cpu_since(c0, thread_cpu_us()), steps);
  return r;
}
// body() starts the debugger and does the step's work; stop() and step() are timed apart.
template <class D, class Body>
Round probed_round(D& debugger, const Body& body, int steps) {
  Round r;
  const ThreadCpu c0 = thread_cpu_us();
  const auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    body();
    const auto t1 = Clock::now();
    debugger.stop();
    debugger.step();
    r.inside_us += us_since(t1);
  }
  const auto t2 = Clock::now();
  wait_written(debugger);
  r.drain_us = us_since(t2);
  r.step_us = us_since(t0) / steps;
  r.cpu_us = per_step(cpu_since(c0, thread_cpu_us()), steps);
  r.inside_us /= steps;
  r.drain_us /= steps;
  return r;
}

// Variants timed in turn, round after round, so that a drift of the busy machine hits all alike;
// the first round of each warms up and is dropped.
struct Variant {
  std::string name;
  std::function<Round()> run;
  std::vector<Round> rounds;
  double med(double Round::*field) const {
    std::vector<double> v;
    for (const Round& r : rounds) v.push_back(r.*field);
    return median(v);
  }
  // The median over the rounds of f(round), and the smallest and largest.
  template <class F>
  double med_of(F f, double* lo = nullptr, double* hi = nullptr) const {
    std::vector<double> v;
    for (const Round& r : rounds) v.push_back(f(r));
    std::sort(v.begin(), v.end());
    if (lo) *lo = v.front();
    if (hi) *hi = v.back();
    return median(v);
  }
};
inline void run_rounds(std::vector<Variant>& variants, int rounds) {
  for (auto& v : variants) v.run();
  for (int r = 0; r < rounds; ++r)
    for (auto& v : variants) v.rounds.push_back(v.run());
}

// A small transformer: embedding 64, 2 pre-norm layers of 4-head self-attention and a GELU MLP,
// a vocabulary head. Attention is written out (Linear q/k/v/out + softmax) to read alike on all versions.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t dim, int64_t heads) : heads(heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    q = register_module("q", torch::nn::Linear(dim, dim));
    k = register_module("k", torch::nn::Linear(dim, dim));
    v = register_module("v", torch::nn::Linear(dim, dim));
    out = register_module("out", torch::nn::Linear(dim, dim));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    fc1 = register_module("fc1", torch::nn::Linear(dim, 4 * dim));
    fc2 = register_module("fc2", torch::nn::Linear(4 * dim, dim));
  }
  torch::Tensor forward(torch::Tensor x) {
    const int64_t b = x.size(0), s = x.size(1), d = x.size(2), hd = d / heads;
    const torch::Tensor h = ln1(x);
    auto split = [&](const torch::Tensor& t) { return t.view({b, s, heads, hd}).transpose(1, 2); };
    const torch::Tensor att =
        torch::softmax(torch::matmul(split(q(h)), split(k(h)).transpose(-2, -1)) / std::sqrt(hd), -1);
    x = x + out(torch::matmul(att, split(v(h))).transpose(1, 2).reshape({b, s, d}));
    return x + fc2(torch::gelu(fc1(ln2(x))));
  }
  int64_t heads;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, out{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

struct TinyTransformerImpl : torch::nn::Module {
  TinyTransformerImpl(int64_t vocab, int64_t dim, int64_t heads, int layers) {
    embed = register_module("embed", torch::nn::Embedding(vocab, dim));
    for (int i = 0; i < layers; ++i) blocks.push_back(register_module("layer" + std::to_string(i), Block(dim, heads)));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    head = register_module("head", torch::nn::Linear(dim, vocab));
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    torch::Tensor x = embed(tokens);
    for (auto& b : blocks) x = b(x);
    return head(norm(x));
  }
  torch::nn::Embedding embed{nullptr};
  std::vector<Block> blocks;
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(TinyTransformer);

// The training-loop MLP: 4 x (Linear(1024, 1024) + GELU).
struct Mlp1024Impl : torch::nn::Module {
  Mlp1024Impl() {
    for (int i = 0; i < 4; ++i)
      layers.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(1024, 1024)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = torch::gelu(l(x));
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};
TORCH_MODULE(Mlp1024);

// Bytes malloc'd and in use (small chunks + mmapped blocks); -1 where glibc's mallinfo2 is missing.
inline long long malloc_in_use() {
#ifdef TPBENCH_HAVE_MALLINFO2
  const struct mallinfo2 m = mallinfo2();
  return static_cast<long long>(m.uordblks + m.hblkhd);
#else
  return -1;
#endif
}

// Gives the heap's free pages back to the system, so that RSS grows again with what is allocated next.
inline void release_free_heap() {
#ifdef TPBENCH_HAVE_MALLINFO2
  malloc_trim(0);
#endif
}

// A "Vm...:" line of /proc/self/status, in bytes; -1 if absent.
inline long long proc_status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(key) + ":";
  while (std::getline(in, line))
    if (line.compare(0, prefix.size(), prefix) == 0) return std::stoll(line.substr(prefix.size())) * 1024;
  return -1;
}

// Resets VmHWM to the current RSS; false where /proc/self/clear_refs cannot be written.
inline bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace tpbench

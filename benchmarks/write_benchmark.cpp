// Tensor task: how fast the .pt files of one model step (about 1 GB of tensors) reach the disk,
// compared with a plain sequential write of the same number of bytes to the same directory, in the
// same run; and how long the training thread is held up.
//
//   cmake -S . -B build-bench -DTORCHPROBE_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release
//   cmake --build build-bench --target torchprobe_benchmarks
//   build-bench/benchmarks/torchprobe_benchmarks write [DIR]      # DIR: where to write (default /tmp)
//
// Disk use stays near 1 GB: each phase deletes what it wrote before the next begins.
// TORCHPROBE_BENCH_QUICK=1: two layers on a 64 x 2048 activation (about 3 MB), one round, one cap.
//
// Two baselines, because "the same disk" means two things on a machine with a page cache:
//   to the page cache  open + write(8 MiB chunks of a buffer the size of the step's tensors) + close
//                      of one file, no fsync (like the tensor files): the copy into the cache
//   to the disk        the same with fsync before close: the disk's sequential write speed
// Numbers reported, per round:
//   cache ratio        writer throughput (bytes / the wall time during which the writer threads had
//                      a file in progress) / the page-cache baseline
//   disk ratio         bytes / (writer busy time + a syncfs() after stop(), so that every file is
//                      on the disk) / the disk baseline. The target (>= 0.7) is read against this
//                      one: it compares the dump with what the disk can take.
//   end to end         bytes / (dumped step, including stop()'s wait for the files, - plain step)
//   stall              what the training thread loses: the extra time of its forward pass (capture,
//                      statistics, snapshots, waits at the memory cap) and stop()'s wait for the files
// Each round measures both baselines, the dump, and the page-cache baseline again; the figure is
// the median of three rounds, as the speeds vary between rounds.
#include <torch/torch.h>
#include <torchprobe/torchprobe.hpp>

#include "registry.hpp"
#include "bench_support.hpp"
#include "../tests/remove_tree.hpp"  // not std::filesystem::remove_all: see there

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace tp = torchprobe;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A step whose tensors are large and whose arithmetic is cheap, so that the dump's cost is what
// shows: layers of x * gamma + beta, then gelu, on a 4096 x 2048 float activation (32 MiB). Per
// layer mul, add and gelu each save their 32 MiB input and 32 MiB output (and the 8 KiB
// gamma/beta): 192 MiB; five layers make about 1 GB.
struct StackImpl : torch::nn::Module {
  explicit StackImpl(int n) {
    for (int i = 0; i < n; ++i) {
      gammas.push_back(register_parameter("gamma" + std::to_string(i), torch::rand({2048}) + 0.5, false));
      betas.push_back(register_parameter("beta" + std::to_string(i), torch::randn({2048}), false));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (std::size_t i = 0; i < gammas.size(); ++i) x = torch::gelu(x * gammas[i] + betas[i]);
    return x;
  }
  std::vector<torch::Tensor> gammas, betas;
};
TORCH_MODULE(Stack);

// Each measured phase starts with no dirty pages left by the one before (not timed).
void settle() { ::sync(); }

// Seconds to write `bytes` to a new file `path` (and fsync it, when `durable`), in 8 MiB write()s
// from one buffer of `bytes`: like the tensor files, the bytes come from memory the size of the
// step's tensors, not from a small buffer that stays in the CPU's cache.
double plain_write_seconds(const std::string& path, std::size_t bytes, bool durable) {
  settle();
  static std::vector<char> source;
  if (source.size() != bytes) {
    source.assign(bytes, 0);
    unsigned x = 12345;
    for (std::size_t k = 0; k < bytes; k += 64) source[k] = static_cast<char>((x = x * 1103515245u + 12345u) >> 16);
  }
  constexpr std::size_t kChunk = std::size_t{8} << 20;
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
  for (std::size_t done = 0; done < bytes;) {
    const ssize_t w = ::write(fd, source.data() + done, std::min(bytes - done, kChunk));
    if (w <= 0) {
      std::perror("write");
      std::exit(1);
    }
    done += static_cast<std::size_t>(w);
  }
  if (durable) ::fsync(fd);
  ::close(fd);
  const double s = seconds_since(t0);
  std::filesystem::remove(path);
  return s;
}

// Seconds until everything written below `dir` is on the disk.
double sync_seconds(const std::string& dir) {
  const auto t0 = Clock::now();
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::syncfs(fd);
    ::close(fd);
  }
  return seconds_since(t0);
}

struct DumpRun {
  double forward = 0, stop = 0, sync = 0;
  tp::io::TensorWriter::Stats writer;
};

DumpRun dumped_step(Stack& model, const torch::Tensor& x, const std::string& dir, std::int64_t max_pending_mb) {
  DumpRun run;
  settle();
  {
    tp::Debugger<tp::Level::L1, tp::Task::Tensor> dbg(
        tp::Options().dump_path(dir).max_pending_mb(max_pending_mb).extra_info(false));
    dbg.start();
    auto t0 = Clock::now();
    model->forward(x);
    run.forward = seconds_since(t0);
    t0 = Clock::now();
    dbg.stop();  // waits until every file is written, then writes dump.json
    run.stop = seconds_since(t0);
    run.writer = dbg.task().saver().writer()->stats();
  }
  run.sync = sync_seconds(dir);
  tptest::remove_tree(dir);
  return run;
}

}  // namespace

TORCHPROBE_BENCHMARK(write) {
  const bool quick = tpbench::quick_mode();
  const std::string base = argc > 1 ? argv[1] : std::filesystem::temp_directory_path().string();
  const std::string dir = base + "/torchprobe_write_benchmark_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  Stack model(quick ? 2 : 5);
  const torch::Tensor x = torch::randn({quick ? 64 : 4096, 2048});

  // The step alone (best of 3, after a warm-up).
  model->forward(x);
  double plain_step = 1e9;
  for (int i = 0; i < (quick ? 1 : 3); ++i) {
    const auto t0 = Clock::now();
    model->forward(x);
    plain_step = std::min(plain_step, seconds_since(t0));
  }

  std::printf("TorchProbe tensor-task write benchmark: %s, %d intra-op threads, writer threads %u, direct I/O %s\n",
              dir.c_str(), at::get_num_threads(), tp::io::TensorWriter::kDefaultThreads,
              tp::io::direct_io_supported(dir) ? "accepted" : "refused (page cache)");
  std::printf("model step without TorchProbe: %.3f s\n\n", plain_step);
  std::printf("%-6s %6s | %-27s | %-27s | %7s %8s | %7s %7s %7s\n", "cap MB", "GB", "to the page cache: GB/s",
              "to the disk: GB/s", "e2e", "", "fwd+", "waits", "stop");
  std::printf("%-6s %6s | %8s %8s %9s | %8s %8s %9s | %7s %8s | %7s %7s %7s\n", "", "", "plain", "writer", "ratio",
              "plain", "dump", "ratio", "GB/s", "ratio", "s", "s", "s");
  // Each round brackets one dumped step with the baselines (their speed moves a lot from one
  // moment to the next on a VM); the median of the rounds' ratios is the figure.
  const int rounds = quick ? 1 : 3;
  const std::vector<std::int64_t> caps = quick ? std::vector<std::int64_t>{256} : std::vector<std::int64_t>{1024, 256};
  for (std::int64_t cap : caps) {
    const DumpRun probe = dumped_step(model, x, dir + "/probe", cap);  // learns the byte count; also a warm-up
    const std::size_t bytes = probe.writer.bytes;
    std::vector<double> cache_ratios, disk_ratios, e2e_ratios;
    for (int round = 0; round < rounds; ++round) {
      const double cached_before = plain_write_seconds(dir + "/plain.bin", bytes, false);
      const double durable = plain_write_seconds(dir + "/plain.bin", bytes, true);
      const DumpRun run = dumped_step(model, x, dir + "/dump", cap);
      const double cached_after = plain_write_seconds(dir + "/plain.bin", bytes, false);
      const double cached = (cached_before + cached_after) / 2;
      const double gb = static_cast<double>(run.writer.bytes) / 1e9;
      const double writer_s = run.writer.busy_seconds, dump_disk_s = run.writer.busy_seconds + run.sync;
      const double e2e = run.forward + run.stop - plain_step;
      cache_ratios.push_back(cached / writer_s);
      disk_ratios.push_back(durable / dump_disk_s);
      e2e_ratios.push_back(cached / e2e);
      std::printf("%-6lld %6.3f | %8.2f %8.2f %9.2f | %8.2f %8.2f %9.2f | %7.2f %8.2f | %7.3f %7.3f %7.3f\n",
                  static_cast<long long>(cap), gb, gb / cached, gb / writer_s, cached / writer_s, gb / durable,
                  gb / dump_disk_s, durable / dump_disk_s, gb / e2e, cached / e2e, run.forward - plain_step,
                  run.writer.wait_seconds, run.stop);
      std::printf(
          "%-6s files %llu, failures %llu, %.0f%% of the bytes direct from the snapshots, peak snapshot memory %.0f "
          "MiB, "
          "plain writes %.3f/%.3f s (cache), %.3f s (disk), sync after stop %.3f s\n",
          "", static_cast<unsigned long long>(run.writer.files), static_cast<unsigned long long>(run.writer.failures),
          100.0 * static_cast<double>(run.writer.direct_bytes) /
              static_cast<double>(std::max<std::uint64_t>(run.writer.bytes, 1)),
          static_cast<double>(run.writer.peak_held_bytes) / (1 << 20), cached_before, cached_after, durable, run.sync);
    }
    auto range = [](const std::vector<double>& v) {
      return std::make_pair(*std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
    };
    std::printf(
        "%-6s median of %d rounds: disk ratio %.2f (%.2f-%.2f), cache ratio %.2f (%.2f-%.2f), e2e ratio %.2f\n\n", "",
        rounds, tpbench::median(disk_ratios), range(disk_ratios).first, range(disk_ratios).second,
        tpbench::median(cache_ratios), range(cache_ratios).first, range(cache_ratios).second,
        tpbench::median(e2e_ratios));
  }
  std::printf(
      "\nfwd+ s: extra time of the forward pass with the dump (capture, statistics, snapshots, waits at the cap);\n"
      "waits s: part of it spent waiting for the writer at the memory cap; stop s: stop()'s wait for the last "
      "files.\n");
  tptest::remove_tree(dir);
  return 0;
}

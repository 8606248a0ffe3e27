// How long write_python_json takes for a large dump.json (100k API entries of three tensors each,
// a long L1 step), against nlohmann::json's own dump() of the same document in the same run: the
// ratio is the price of Python's float repr and separators. No libtorch needed.
//
//   cmake -S . -B build-bench -DTORCHPROBE_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release
//   cmake --build build-bench --target torchprobe_json_benchmark && build-bench/benchmarks/torchprobe_json_benchmark
#include <nlohmann/json.hpp>

#include "quick_mode.hpp"
#include "torchprobe/io/python_json.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>

using nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

namespace {

ordered_json make_dump(int entries) {
  ordered_json data = ordered_json::object();
  auto& obj = data.get_ref<ordered_json::object_t&>();
  for (int i = 0; i < entries; ++i) {
    ordered_json t = ordered_json::object({{"type", "torch.Tensor"},
                                           {"dtype", "torch.float32"},
                                           {"shape", ordered_json::array({2, 8})},
                                           {"Max", 1.8408576250076294 * i},
                                           {"Min", -2.1833977699279785 / (i + 1)},
                                           {"Mean", -0.08326996862888336},
                                           {"Norm", 3.9888315200805664},
                                           {"requires_grad", true}});
    // Unique keys: append without ordered_map's linear key search.
    static_cast<ordered_json::object_t::Container&>(obj).emplace_back(
        "Aten.add." + std::to_string(i) + ".forward", ordered_json::object({{"input_args", ordered_json::array({t, t})},
                                                                            {"input_kwargs", ordered_json::object()},
                                                                            {"output", ordered_json::array({t})}}));
  }
  return data;
}

template <class F>
double best_seconds(int rounds, F&& f) {
  double best = 1e300;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main() {
  const bool quick = tpbench::quick_mode();
  const int entries = quick ? 2000 : 100000;
  const int rounds = quick ? 1 : 5;
  const ordered_json data = make_dump(entries);
  std::size_t ours_bytes = 0, theirs_bytes = 0;
  const double ours = best_seconds(rounds, [&] {
    std::ostringstream os;
    torchprobe::io::write_python_json(os, data);
    ours_bytes = os.str().size();
  });
  const double theirs = best_seconds(rounds, [&] { theirs_bytes = data.dump(1).size(); });
  std::printf("dump.json of %d entries, best of %d rounds\n", entries, rounds);
  std::printf("  write_python_json (msprobe's format)  %8.3f s  %7.1f MB  %7.1f MB/s\n", ours, ours_bytes / 1e6,
              ours_bytes / 1e6 / ours);
  std::printf("  nlohmann dump(1), the baseline        %8.3f s  %7.1f MB  %7.1f MB/s\n", theirs, theirs_bytes / 1e6,
              theirs_bytes / 1e6 / theirs);
  std::printf("  ratio write_python_json / dump(1)     %8.2fx\n", ours / theirs);
  return 0;
}

// torchprobe_fuzz: every fuzz target in one executable.
//  - Built with clang's -fsanitize=fuzzer (TORCHPROBE_LIBFUZZER): libFuzzer's own main; the target
//    is chosen by TORCHPROBE_FUZZ_TARGET (libFuzzer owns the command line).
//      TORCHPROBE_FUZZ_TARGET=journal torchprobe_fuzz -dict=tests/fuzz/msprobe.dict corpus/journal
//  - Built without it (any compiler, the test suite): replays the corpus of every target, or of
//    those named, then inputs of 1 MB made here (deep nesting, many values, noise), and fails when
//    a corpus folder is missing or empty or a 1 MB input takes more than 1 s (10 s under sanitizers or -O0: a hang).
//      torchprobe_fuzz_replay tests/fuzz/corpus [TARGET ...]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <utility>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_target.hpp"

namespace torchprobe::fuzz {

namespace fs = std::filesystem;

const fs::path& scratch() {
  static const fs::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    fs::path d = fs::path(tmp && *tmp ? tmp : "/tmp") / ("torchprobe-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

void write_bytes(const fs::path& file, std::string_view bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void clear_scratch() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(scratch(), ec)) fs::remove_all(e.path(), ec);
}

namespace {

std::vector<Target> all_targets() {
  std::vector<Target> all = text_targets();
  for (const Target& t : torch_targets()) all.push_back(t);
  return all;
}

const Target* find(const std::string& name) {
  static const std::vector<Target> all = all_targets();
  for (const Target& t : all)
    if (name == t.name) return &t;
  return nullptr;
}

void list(std::FILE* out) {
  for (const Target& t : all_targets()) std::fprintf(out, "  %-14s %s\n", t.name, t.reads);
}

struct RemoveScratch {
  ~RemoveScratch() {
    std::error_code ec;
    fs::remove_all(scratch(), ec);
  }
};

}  // namespace
}  // namespace torchprobe::fuzz

namespace tf = torchprobe::fuzz;
namespace fs = std::filesystem;

#if defined(TORCHPROBE_LIBFUZZER)

static const tf::Target* chosen = nullptr;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* name = std::getenv("TORCHPROBE_FUZZ_TARGET");
  chosen = name ? tf::find(name) : nullptr;
  if (!chosen) {
    std::fprintf(stderr, "set TORCHPROBE_FUZZ_TARGET to one of:\n");
    tf::list(stderr);
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  chosen->run(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

#else

// The bound for a hang: 1 s on a 1 MB input, for an optimised build. Sanitizers and -O0
// slow a reader several times over, so those builds get ten times the room.
#if defined(__SANITIZE_ADDRESS__) || !defined(__OPTIMIZE__)
constexpr double kHang = 10.0;  // seconds
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
constexpr double kHang = 10.0;
#else
constexpr double kHang = 1.0;
#endif
#else
constexpr double kHang = 1.0;
#endif

std::vector<std::pair<std::string, std::string> > big_inputs(const std::string& largest) {
  constexpr std::size_t kSize = std::size_t(1) << 20;
  std::vector<std::pair<std::string, std::string> > out;
  out.emplace_back("1 MB of '['", std::string(kSize, '['));
  std::string members = "{\"data\": {";
  for (std::size_t i = 0; members.size() < kSize; ++i) members += "\"k" + std::to_string(i) + "\": [1, \"x\"], ";
  out.emplace_back("an object of 1 MB of small members", members + "\"end\": 0}}");
  std::string repeated;
  while (!largest.empty() && repeated.size() < kSize) repeated += largest;
  out.emplace_back("the largest input repeated to 1 MB", repeated);
  std::string noise(kSize, '\0');
  std::uint64_t x = 88172645463325252ull;  // xorshift: the same bytes on every run
  for (char& c : noise) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x & 0xFF);
  }
  out.emplace_back("1 MB of noise", noise);
  return out;
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help")) {
    std::fprintf(stderr, "usage: %s CORPUS_ROOT [TARGET ...]\n  replays CORPUS_ROOT/TARGET/* through each target:\n",
                 argv[0]);
    tf::list(stderr);
    return 2;
  }
  const tf::RemoveScratch cleanup;
  const fs::path root = argv[1];
  std::vector<std::string> names(argv + 2, argv + argc);
  if (names.empty())
    for (const tf::Target& t : tf::all_targets()) names.push_back(t.name);
  int failed = 0;
  for (const std::string& name : names) {
    const tf::Target* t = tf::find(name);
    if (!t) {
      std::fprintf(stderr, "no target '%s'; the targets:\n", name.c_str());
      tf::list(stderr);
      return 2;
    }
    std::vector<fs::path> inputs;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root / name, ec))
      if (e.is_regular_file()) inputs.push_back(e.path());
    std::sort(inputs.begin(), inputs.end());
    if (inputs.empty()) {
      std::fprintf(stderr, "FAILED: %s: no inputs in %s\n", name.c_str(), (root / name).c_str());
      ++failed;
      continue;
    }
    double slowest = 0;
    std::string slowest_name;
    const auto t0 = std::chrono::steady_clock::now();
    for (const fs::path& p : inputs) {
      std::ifstream in(p, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const auto a = std::chrono::steady_clock::now();
      t->run(bytes);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
      if (s > slowest) slowest = s, slowest_name = p.filename().string();
    }
    // Inputs of 1 MB made here, not stored: deep nesting, many small values, the largest input
    // repeated, and noise. Each must end within kHang.
    const std::string largest = [&] {
      std::string best;
      for (const fs::path& p : inputs)
        if (fs::file_size(p, ec) > best.size()) {
          std::ifstream in(p, std::ios::binary);
          best.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        }
      return best;
    }();
    for (const auto& [what, bytes] : big_inputs(largest)) {
      const auto a = std::chrono::steady_clock::now();
      t->run(bytes);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
      if (s > slowest) slowest = s, slowest_name = what;
      if (s > kHang) {
        std::fprintf(stderr, "FAILED: %s: %s (1 MB) took %.1f s\n", name.c_str(), what.c_str(), s);
        ++failed;
      }
    }
    const double all = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-14s %5zu inputs replayed in %.2f s (slowest %.3f s: %s)\n", name.c_str(), inputs.size(), all,
                slowest, slowest_name.c_str());
  }
  return failed ? 1 : 0;
}

#endif

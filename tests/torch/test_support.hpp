#pragma once
// Helpers shared by the libtorch tests: temporary directories and running python3 as an
// independent reader of what TorchProbe wrote.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <unistd.h>

#include <doctest/doctest.h>
#include "../skip.hpp"
#include "../remove_tree.hpp"
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <torch/version.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

namespace tptest {

// Runs `python3 -c code` (the python3 that has torch), returns its stdout; exit status in *rc.
inline std::string run_python(const std::string& code, int* rc = nullptr) {
  const std::filesystem::path script =
      std::filesystem::temp_directory_path() /
      ("tp_py_" + std::to_string(::getpid()) + "_" + std::to_string(std::rand()) + ".py");
  { std::ofstream(script) << code; }
  const std::string cmd = std::string(TORCHPROBE_PYTHON) + " " + script.string() + " 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int status = ::pclose(p);
    if (rc) *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  } else if (rc) {
    *rc = -1;
  }
  std::filesystem::remove(script);
  return out;
}

// A fresh directory under /tmp, removed when the object goes.
// The kernels a committed Python reference was made with, for a test that must reproduce it to the
// bit on any CI machine: one intra-op thread (ATen splits a reduction's work by thread count, and
// libtorch's default count is the machine's physical cores: 2 on one 2-vCPU machine, 1 on another),
// and on libtorch 2.x no oneDNN (Debian 13's oneDNN 3.7 gives wrong, run-to-run different
// convolution gradients on some AVX-512 machines: a residual CNN's input gradient norm 0.70 or 1.49
// where ATen's own kernels and torch 1.13 give 1.63). The references were made the same way
// (tests/data/msprobe_twins/make_twins.py). Restores both settings when it goes.
class ReferenceKernels {
 public:
  ReferenceKernels() : threads_(at::get_num_threads()), onednn_(at::globalContext().userEnabledMkldnn()) {
    at::set_num_threads(1);
#if TORCH_VERSION_MAJOR >= 2
    at::globalContext().setUserEnabledMkldnn(false);
#endif
  }
  ~ReferenceKernels() {
    at::set_num_threads(threads_);
    at::globalContext().setUserEnabledMkldnn(onednn_);
  }
  ReferenceKernels(const ReferenceKernels&) = delete;
  ReferenceKernels& operator=(const ReferenceKernels&) = delete;

 private:
  int threads_;
  bool onednn_;
};

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "torchprobe_test_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { remove_tree(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

inline nlohmann::ordered_json read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::ordered_json::parse(ss.str(), nullptr, true, /*ignore_comments=*/false);
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A JSON file that may hold Infinity/NaN tokens (as Python's json writes them), read by Python and
// handed back with those values as the strings "Infinity", "-Infinity", "NaN".
inline nlohmann::ordered_json read_python_json(const std::string& path) {
  int rc = 0;
  const std::string out = run_python(
      "import json, math\n"
      "def fix(v):\n"
      "    if isinstance(v, float) and not math.isfinite(v):\n"
      "        return 'NaN' if math.isnan(v) else ('Infinity' if v > 0 else '-Infinity')\n"
      "    if isinstance(v, list): return [fix(e) for e in v]\n"
      "    if isinstance(v, dict): return {k: fix(e) for k, e in v.items()}\n"
      "    return v\n"
      "print(json.dumps(fix(json.load(open('" +
          path + "')))))\n",
      &rc);
  REQUIRE_MESSAGE(rc == 0, out);
  return nlohmann::ordered_json::parse(out);
}

// The statistics of a dump.json tensor item equal those of `t` computed by ATen in float64.
inline void check_item_is(const nlohmann::ordered_json& item_, const at::Tensor& t) {
  nlohmann::ordered_json item = item_;  // non-const: a missing key reads as null
  CAPTURE(item.dump());
  REQUIRE(item.is_object());
  CHECK(item["shape"] == nlohmann::ordered_json(t.sizes().vec()));
  const at::Tensor d = t.detach().to(at::kDouble);
  CHECK(item["Max"].get<double>() == d.max().item<double>());
  CHECK(item["Min"].get<double>() == d.min().item<double>());
  CHECK(item["Mean"].get<double>() == doctest::Approx(d.mean().item<double>()).epsilon(1e-9));
  CHECK(item["Norm"].get<double>() == doctest::Approx(d.norm().item<double>()).epsilon(1e-9));
}

// Runs f with std::cerr captured (what io::tell_user says).
template <class F>
std::string stderr_of(F&& f) {
  std::ostringstream captured;
  std::streambuf* old = std::cerr.rdbuf(captured.rdbuf());
  try {
    f();
  } catch (...) {
    std::cerr.rdbuf(old);
    throw;
  }
  std::cerr.rdbuf(old);
  return captured.str();
}

// The model of msprobe's reference dumps: Net{fc = Linear(8, 4)}, forward relu(fc(x)).
struct NetImpl : torch::nn::Module {
  NetImpl() : fc(register_module("fc", torch::nn::Linear(8, 4))) {}
  // Not inlined, so stack.json can be checked for the user's own frame.
  __attribute__((noinline)) torch::Tensor forward(const torch::Tensor& x) { return torch::relu(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

// A tensor item of ours against msprobe's for the same tensor: same dtype, shape and
// requires_grad; Max/Min within `extrema_rel` (0: exactly), Mean/Norm within 1e-6 relative.
inline void check_same_statistics(const nlohmann::ordered_json& ours_, const nlohmann::ordered_json& theirs_,
                                  double extrema_rel) {
  nlohmann::ordered_json ours = ours_, theirs = theirs_;  // non-const: a missing key reads as null
  CAPTURE(ours.dump());
  CAPTURE(theirs.dump());
  CHECK(ours["dtype"] == theirs["dtype"]);
  CHECK(ours["shape"] == theirs["shape"]);
  CHECK(ours["requires_grad"] == theirs["requires_grad"]);
  const std::pair<const char*, double> tolerances[] = {
      {"Max", extrema_rel}, {"Min", extrema_rel}, {"Mean", 1e-6}, {"Norm", 1e-6}};
  for (const auto& [key, rel] : tolerances) {
    const double a = ours[key].get<double>(), b = theirs[key].get<double>();
    CHECK(std::abs(a - b) <= rel * std::max(1e-30, std::abs(b)));
  }
}

}  // namespace tptest

// The compare-twins corpus's runs (compare_twins_test.cpp, blame_test.cpp): a twin built with
// torch::nn, its weights and inputs copied by name from T/twin.pt, and make_twins.py's step.
#pragma once
#include <torch/torch.h>
#include <torch/version.h>
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "twin_models.hpp"

namespace twins {

namespace fs = std::filesystem;

// The Python side of libtorch 2.x is msprobe's dumps made with Debian 13's torch 2.6 (the same
// weights and inputs, this torch's kernels), never 1.13's (make_twins.py --set torch2.6).
#if TORCH_VERSION_MAJOR >= 2
inline const fs::path kTwins = fs::path(TORCHPROBE_TESTS_DIR) / "data" / "msprobe_twins" / "torch2.6";
#else
inline const fs::path kTwins = fs::path(TORCHPROBE_TESTS_DIR) / "data" / "msprobe_twins";
#endif

// twin.pt: a flat list [name, tensor, ...] (libtorch's unpickler reads lists; see make_twins.py).
inline std::map<std::string, torch::Tensor> read_twin_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const c10::IValue list = torch::pickle_load(bytes);
  std::map<std::string, torch::Tensor> items;
  const auto& l = list.toListRef();
  for (std::size_t i = 0; i + 1 < l.size(); i += 2) items[l[i].toStringRef()] = l[i + 1].toTensor();
  return items;
}

struct TwinRun {
  std::shared_ptr<twins::TwinImpl> model;
  std::vector<torch::Tensor> inputs;
  std::map<std::string, torch::Tensor> saved;
};

inline TwinRun load(const std::string& name) {
  TwinRun r;
  r.saved = read_twin_file(kTwins / name / "twin.pt");
  r.model = twins::build(name);
  torch::NoGradGuard no_grad;
  for (auto& p : r.model->named_parameters()) {
    REQUIRE_MESSAGE(r.saved.count("state." + p.key()), "twin.pt has no state." << p.key());
    p.value().copy_(r.saved["state." + p.key()]);
  }
  for (auto& b : r.model->named_buffers()) {
    REQUIRE_MESSAGE(r.saved.count("state." + b.key()), "twin.pt has no state." << b.key());
    b.value().copy_(r.saved["state." + b.key()]);
  }
  for (int i = 0; r.saved.count("input." + std::to_string(i)); ++i) {
    torch::Tensor x = r.saved["input." + std::to_string(i)].clone();
    if (x.is_floating_point() && twins::input_needs_grad(name, i)) x.requires_grad_(true);
    r.inputs.push_back(x);
  }
  return r;
}

// The step of make_twins.py: seed 7, out = model(*inputs), loss = out.pow(2).sum(), backward (the
// caller holds a tptest::ReferenceKernels: the kernels make_twins.py ran with).
inline std::pair<torch::Tensor, torch::Tensor> step(TwinRun& r);

// The one rank directory of step 0 of a dump (proc{pid} without c10d).
inline std::filesystem::path only_rank(const std::filesystem::path& dump_root) {
  for (const auto& e : std::filesystem::directory_iterator(dump_root / "step0")) return e.path();
  FAIL("no dump under " << dump_root);
  return {};
}

inline std::pair<torch::Tensor, torch::Tensor> step(TwinRun& r) {
  torch::manual_seed(7);
  torch::Tensor out = r.model->forward(r.inputs);
  torch::Tensor loss = out.pow(2).sum();
  loss.backward();
  return {out, loss};
}

}  // namespace twins

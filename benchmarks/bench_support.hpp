#pragma once
// What several benchmarks share: the two models they time, a timed block of steps, and the median
// of repeated figures.
#include <torch/torch.h>

#include "quick_mode.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace tpbench {

// The quick-start model of the README: Linear(8, 4) + relu.
struct QuickStartImpl : torch::nn::Module {
  QuickStartImpl() : fc(register_module("fc", torch::nn::Linear(8, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(QuickStart);

// A model with real work per op: 4 x (Linear(512, 512) + gelu), then LayerNorm.
struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    for (int i = 0; i < 4; ++i)
      layers.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(512, 512)));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({512})));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = torch::gelu(l(x));
    return norm(x);
  }
  std::vector<torch::nn::Linear> layers;
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(Mlp);

// Microseconds per step of `steps` runs of one_step.
inline double block_us(const std::function<void()>& one_step, int steps) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) one_step();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / steps;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Alternated {
  double plain_us, probed_us, ratio;  // medians over the rounds; ratio = probed / plain of each round
};

// `warmups` steps of each, then `rounds` rounds of (plain block, probed block) of `steps` steps: the
// two are timed alternately in the same run, so that a change of machine load touches both.
inline Alternated alternate(const std::function<void()>& plain, const std::function<void()>& probed, int steps,
                            int rounds, int warmups = 1) {
  for (int i = 0; i < warmups; ++i) {
    plain();
    probed();
  }
  std::vector<double> p, q, r;
  for (int k = 0; k < rounds; ++k) {
    p.push_back(block_us(plain, steps));
    q.push_back(block_us(probed, steps));
    r.push_back(q.back() / p.back());
  }
  return {median(p), median(q), median(r)};
}

}  // namespace tpbench

#pragma once
// The ATen operators that draw random numbers, by name without "aten::" and overload: one list for
// seed_all's is_enhanced re-seeding and random_save (seed.hpp) and for the free benchmark, which
// must not perturb a call whose result is random anyway (task/free_benchmark.hpp). The dropout and
// rrelu families are here because their training-mode calls draw a mask or a slope; an op with a
// Generator argument is random too, which the free benchmark also reads off its schema.
#include <string_view>

namespace torchprobe {

inline bool is_random_op_name(std::string_view name) {
  static constexpr std::string_view kOps[] = {"rand",
                                              "rand_like",
                                              "randn",
                                              "randn_like",
                                              "randint",
                                              "randint_like",
                                              "randperm",
                                              "bernoulli",
                                              "bernoulli_",
                                              "multinomial",
                                              "normal",
                                              "normal_",
                                              "uniform_",
                                              "random_",
                                              "exponential_",
                                              "geometric_",
                                              "cauchy_",
                                              "log_normal_",
                                              "poisson",
                                              "binomial",
                                              "_standard_gamma",
                                              "_sample_dirichlet",
                                              "dropout",
                                              "dropout_",
                                              "feature_dropout",
                                              "feature_dropout_",
                                              "alpha_dropout",
                                              "alpha_dropout_",
                                              "feature_alpha_dropout",
                                              "feature_alpha_dropout_",
                                              "native_dropout",
                                              "_fused_dropout",
                                              "rrelu",
                                              "rrelu_",
                                              "rrelu_with_noise",
                                              "rrelu_with_noise_"};
  for (const std::string_view op : kOps)
    if (op == name) return true;
  return false;
}

}  // namespace torchprobe

#pragma once
// seed_all: msprobe's seed_all(seed=1234, mode=False, rm_dropout=False, is_enhanced=False) for a
// libtorch program. Call it once, before the model is built and before the Debugger starts.
//
// - seed: libtorch's CPU generator and every CUDA device's generator (at::manual_seed; CUDA only
//   where the build and the machine have it), and std::srand. The environment variable
//   PYTHONHASHSEED is set to the seed, for Python processes this program starts (msprobe sets it
//   for its own interpreter; C++ has no hash randomisation).
// - mode: at::globalContext().setDeterministicAlgorithms(mode) (torch.use_deterministic_algorithms),
//   cuDNN deterministic on and benchmark off on every call, whatever mode says (msprobe sets them
//   whenever a GPU is there; here they are set always, readable on a CPU machine too: that differs
//   from msprobe only where it changes nothing); with mode, CUBLAS_WORKSPACE_CONFIG
//   is set to ":4096:8" unless the user set it (cuBLAS is deterministic only with it, and libtorch's
//   deterministic mode raises on CUDA matmuls without it). msprobe's NPU variables
//   (HCCL_DETERMINISTIC, LCCL_DETERMINISTIC, CLOSE_MATMUL_K_SHIFT, ATB_LLM_LCOC_ENABLE) mean nothing
//   to libtorch and are not set; msprobe's "torch.backends.cudnn.enable = False" is a misspelt
//   attribute that turns nothing off, so cuDNN stays enabled here too.
// - rm_dropout: for the whole process from this call on, aten::dropout, feature_dropout,
//   alpha_dropout, feature_alpha_dropout and their in-place forms return their input, as with
//   p = 0 (the same values and aliasing as the eval-mode call). They are overridden in the
//   dispatcher for CPU and CUDA tensors (make_dropout_override), so torch::nn::Dropout/Dropout2d/
//   Dropout3d/AlphaDropout/FeatureAlphaDropout and torch::dropout are all covered, in
//   InferenceMode too, whenever their modules were built. Direct at::native_dropout calls (CUDA's
//   fused kernel, which aten::dropout no longer reaches) keep their randomness.
// - is_enhanced: every outermost random ATen call (random_ops below) first re-seeds the
//   generators with `seed`, so identical random calls return identical values in one process and
//   across processes (msprobe's guide: two torch.randn(2,2) have the same mean). It costs a
//   RecordFunction callback on every ATen call (about 0.2 us, libtorch-notes §1).
//
// Each call sets the whole state it describes: seed_all(s) without rm_dropout / is_enhanced
// removes an override a previous call installed, and mode=false turns deterministic mode off.
// A config with "seed" or "is_deterministic" makes a Debugger call seed_all(seed or 1234,
// is_deterministic) when it is constructed (msprobe's PrecisionDebugger does the same).
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/Context.h>
#include <ATen/record_function.h>
#include <torch/library.h>

namespace torchprobe {

namespace details {

// ATen operators (names without "aten::" and overload) that draw random numbers; shared with
// random_save. The dropout family is here because its training-mode calls draw a mask.
inline bool is_random_op(std::string_view name) {
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
  constexpr std::string_view kPrefix = "aten::";
  if (name.substr(0, kPrefix.size()) != kPrefix) return false;
  name.remove_prefix(kPrefix.size());
  for (std::string_view op : kOps)
    if (op == name) return true;
  return false;
}

// Random-op nesting of this thread: randn runs normal_, dropout runs bernoulli_; only the
// outermost one is the user's call.
inline int& random_depth() {
  thread_local int depth = 0;
  return depth;
}

// The process-wide overrides seed_all installs. Never destroyed: a registration must not be
// removed while static destructors of libtorch run.
struct SeedState {
  std::mutex mu;
  std::vector<std::unique_ptr<torch::Library>> dropout_override;
  std::atomic<std::uint64_t> enhanced_seed{0};
  bool enhanced = false;
  at::CallbackHandle enhanced_handle = 0;

  static SeedState& instance() {
    static SeedState* state = new SeedState();
    return *state;
  }
};

// One library per dispatch key: the Autograd keys of CPU and CUDA (a kernel registered there
// directly wins over the ops' CompositeImplicitAutograd kernels; the Autograd alias key would not),
// and the backend keys, which calls under c10::InferenceMode (no autograd key) reach.
inline std::vector<std::unique_ptr<torch::Library>> make_dropout_override() {
  std::vector<std::unique_ptr<torch::Library>> libs;
  for (c10::DispatchKey key :
       {c10::DispatchKey::AutogradCPU, c10::DispatchKey::AutogradCUDA, c10::DispatchKey::CPU, c10::DispatchKey::CUDA}) {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
    // dropout(p = 0) and dropout(train = false) both return `input` itself (ATen's _dropout_impl).
    for (const char* op : {"dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"})
      lib->impl(op, [](const at::Tensor& input, double, bool) { return input; });
    for (const char* op : {"dropout_", "feature_dropout_", "alpha_dropout_", "feature_alpha_dropout_"})
      lib->impl(op, [](at::Tensor& self, double, bool) -> at::Tensor& { return self; });
    libs.push_back(std::move(lib));
  }
  return libs;
}

inline std::unique_ptr<at::ObserverContext> reseed_before_random_op(const at::RecordFunction& fn) {
  if (!is_random_op(fn.name())) return nullptr;
  if (random_depth()++ == 0) at::manual_seed(SeedState::instance().enhanced_seed.load());
  return nullptr;
}

inline void leave_random_op(const at::RecordFunction& fn, at::ObserverContext*) {
  if (is_random_op(fn.name()) && random_depth() > 0) --random_depth();
}

inline void set_env(const char* name, const std::string& value, bool overwrite) {
  ::setenv(name, value.c_str(), overwrite ? 1 : 0);
}

}  // namespace details

// Range and meaning of each argument: see the top of this header. Throws std::invalid_argument for
// a seed outside [0, 2^32 - 1] (msprobe's range).
inline void seed_all(std::int64_t seed = 1234, bool mode = false, bool rm_dropout = false, bool is_enhanced = false) {
  if (seed < 0 || seed > 4294967295LL)
    throw std::invalid_argument("torchprobe::seed_all: seed " + std::to_string(seed) +
                                " is outside [0, 4294967295] (msprobe's range)");
  const auto s = static_cast<std::uint64_t>(seed);
  at::manual_seed(s);  // the CPU generator, and every CUDA device's when CUDA is available
  std::srand(static_cast<unsigned>(s));
  details::set_env("PYTHONHASHSEED", std::to_string(s), true);

  at::globalContext().setDeterministicAlgorithms(mode, /*warn_only=*/false);
  // Whatever `mode` says, as msprobe's seed_all does on a GPU (cudnn.deterministic = True,
  // cudnn.benchmark = False); the flags exist, and are set, on a CPU-only build too.
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
  if (mode) details::set_env("CUBLAS_WORKSPACE_CONFIG", ":4096:8", false);

  details::SeedState& state = details::SeedState::instance();
  std::lock_guard<std::mutex> lock(state.mu);
  if (rm_dropout && state.dropout_override.empty())
    state.dropout_override = details::make_dropout_override();
  else if (!rm_dropout)
    state.dropout_override.clear();

  state.enhanced_seed.store(s);
  if (is_enhanced && !state.enhanced) {
    state.enhanced_handle =
        at::addGlobalCallback(at::RecordFunctionCallback(details::reseed_before_random_op, details::leave_random_op)
                                  .scopes({at::RecordScope::FUNCTION}));
    state.enhanced = true;
  } else if (!is_enhanced && state.enhanced) {
    at::removeCallback(state.enhanced_handle);
    state.enhanced = false;
  }
}

// Whether seed_all's dropout override / re-seeding are installed now.
inline bool dropout_removed() {
  details::SeedState& state = details::SeedState::instance();
  std::lock_guard<std::mutex> lock(state.mu);
  return !state.dropout_override.empty();
}

}  // namespace torchprobe

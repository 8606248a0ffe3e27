// seed_all (seed.hpp), the config keys seed / is_deterministic, and random_save (random_save.hpp).
// Reference values: msprobe's guide prints torch.mean(torch.randn(2,2)) after seed_all(1234) as
// -0.0866 then 0.2038 (python3 with torch.manual_seed(1234) gives -0.08656439185142517 and
// 0.20384544134140015), and -0.0866 twice with is_enhanced.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "child_process.hpp"
#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;

namespace {

// Child "seed_all": seeds with TORCHPROBE_TEST_SEED, builds a model (random init), draws its input
// and dumps one forward and backward into TORCHPROBE_TEST_DIR.
int seeded_dump(std::int64_t seed, const std::string& dir) {
  tp::seed_all(seed);
  torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::ReLU(), torch::nn::Linear(3, 2));
  const at::Tensor x = torch::randn({5, 4});
  tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(dir));
  dbg.start();
  model->forward(x).sum().backward();
  dbg.stop();
  dbg.wait_written();
  return 0;
}

struct SeedChild {
  SeedChild() {
    const char* mode = std::getenv("TORCHPROBE_TEST_CHILD");
    if (!mode || std::string(mode) != "seed_all") return;
    int rc = 2;
    try {
      rc = seeded_dump(std::atoll(std::getenv("TORCHPROBE_TEST_SEED")), std::getenv("TORCHPROBE_TEST_DIR"));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child failed: %s\n", e.what());
      rc = 4;
    }
    std::fflush(nullptr);
    std::_Exit(rc);
  }
} seed_child;

// The "data" of the one dump.json below `dir`, as python3's json reads it.
nlohmann::json dumped_data(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename() == "dump.json")
      return nlohmann::json::parse(tptest::run_python("import json\nprint(json.dumps(json.load(open('" +
                                                      e.path().string() + "'))['data'], sort_keys=True))"));
  return nullptr;
}

nlohmann::json dump_of_child(std::int64_t seed, const tptest::TempDir& tmp, const std::string& name) {
  const pid_t pid = tptest::spawn_child(
      "seed_all", {"TORCHPROBE_TEST_SEED=" + std::to_string(seed), "TORCHPROBE_TEST_DIR=" + (tmp / name)});
  const int status = tptest::wait_child(pid);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  return dumped_data(tmp / name);
}

double mean_of_randn() { return torch::randn({2, 2}).mean().item<double>(); }

// Restores the process-wide defaults the tests change (no overrides, no deterministic mode).
struct SeedDefaults {
  ~SeedDefaults() { tp::seed_all(); }
};

}  // namespace

TEST_CASE("two processes seeded alike by seed_all dump identical statistics, and another seed dumps others") {
  tptest::TempDir tmp;
  const nlohmann::json a = dump_of_child(7, tmp, "a");
  const nlohmann::json b = dump_of_child(7, tmp, "b");
  const nlohmann::json c = dump_of_child(8, tmp, "c");
  REQUIRE(a.is_object());
  CHECK(a.size() >= 6);  // t, addmm, relu, ... forward and backward
  CHECK(a == b);
  CHECK(a != c);
}

TEST_CASE("seed_all seeds libtorch's generator as torch.manual_seed does: msprobe's guide values") {
  SeedDefaults restore;
  tp::seed_all(1234);
  CHECK(mean_of_randn() == doctest::Approx(-0.08656439185142517).epsilon(1e-7));
  CHECK(mean_of_randn() == doctest::Approx(0.20384544134140015).epsilon(1e-7));
  CHECK(std::string(std::getenv("PYTHONHASHSEED")) == "1234");
  tp::seed_all(1234);
  const int first = std::rand();
  tp::seed_all(1234);
  CHECK(std::rand() == first);  // std::srand too
}

TEST_CASE("is_enhanced re-seeds before every random call: two randn(2,2) have the guide's mean -0.0866") {
  SeedDefaults restore;
  tp::seed_all(1234, true, false, true);
  CHECK(mean_of_randn() == doctest::Approx(-0.08656439185142517).epsilon(1e-7));
  CHECK(mean_of_randn() == doctest::Approx(-0.08656439185142517).epsilon(1e-7));
  // A nested random op (randn runs normal_) is not re-seeded a second time: randperm still permutes.
  const at::Tensor p = torch::randperm(50);
  CHECK(std::get<0>(p.sort()).equal(torch::arange(50)));
  tp::seed_all(1234, true, false, false);  // switched off again
  CHECK(mean_of_randn() != doctest::Approx(mean_of_randn()));
}

TEST_CASE("seed_all's seed outside [0, 2^32-1] is rejected by name") {
  CHECK_THROWS_WITH_AS(tp::seed_all(-1), "torchprobe::seed_all: seed -1 is outside [0, 4294967295] (msprobe's range)",
                       std::invalid_argument);
  CHECK_THROWS_AS(tp::seed_all(4294967296LL), std::invalid_argument);
}

TEST_CASE("mode turns on libtorch's deterministic algorithms: a non-deterministic kernel raises, as libtorch does" *
          TP_NEEDS("cuda")) {
  SeedDefaults restore;
  // No CPU kernel of libtorch 1.13 alerts (checked with python3: index_add_, put_(accumulate),
  // histc, bincount, scatter_reduce, pooling backwards all run), so the CPU check calls the alert
  // every non-deterministic kernel calls; with CUDA, a real one (histc) must raise.
  tp::seed_all(1234, true);
  CHECK(at::globalContext().deterministicAlgorithms());
  CHECK(at::globalContext().deterministicCuDNN());
  CHECK_FALSE(at::globalContext().benchmarkCuDNN());
  CHECK(std::getenv("CUBLAS_WORKSPACE_CONFIG") != nullptr);
  CHECK_THROWS_AS(at::globalContext().alertNotDeterministic("torchprobe_test"), c10::Error);
  if (torch::cuda::is_available()) {
    CHECK_THROWS_AS(torch::histc(torch::rand({8}, torch::kCUDA)), c10::Error);
  }
  tp::seed_all(1234, false);
  CHECK_FALSE(at::globalContext().deterministicAlgorithms());
  CHECK(at::globalContext().deterministicCuDNN());  // cuDNN's flags: set whatever mode says, as msprobe
  CHECK_FALSE(at::globalContext().benchmarkCuDNN());
  CHECK_NOTHROW(at::globalContext().alertNotDeterministic("torchprobe_test"));
  if (!torch::cuda::is_available()) TP_SKIP("no CUDA device: a CUDA kernel raising under mode is not checked here");
}

TEST_CASE("every seed_all sets cuDNN deterministic on and benchmark off, with mode false too (msprobe on a GPU)") {
  SeedDefaults restore;
  at::globalContext().setDeterministicCuDNN(false);
  at::globalContext().setBenchmarkCuDNN(true);
  tp::seed_all(7);
  CHECK(at::globalContext().deterministicCuDNN());
  CHECK_FALSE(at::globalContext().benchmarkCuDNN());
  CHECK_FALSE(at::globalContext().deterministicAlgorithms());  // that one follows mode only
}

TEST_CASE("rm_dropout makes a training Dropout(0.5) model's output and gradients equal its eval ones") {
  SeedDefaults restore;
  torch::nn::Sequential model(torch::nn::Linear(6, 8), torch::nn::Dropout(0.5), torch::nn::Linear(8, 3),
                              torch::nn::Dropout2d(0.5), torch::nn::AlphaDropout(0.5));
  const at::Tensor x = torch::randn({4, 6});
  model->eval();
  const at::Tensor eval_out = model->forward(x);
  model->train();
  CHECK_FALSE(model->forward(x).equal(eval_out));  // dropout does drop without rm_dropout

  tp::seed_all(1234, false, true);
  CHECK(tp::dropout_removed());
  const at::Tensor train_out = model->forward(x);
  CHECK(train_out.equal(eval_out));
  train_out.sum().backward();
  const at::Tensor grad = model[0]->as<torch::nn::Linear>()->weight.grad().clone();
  model->zero_grad();
  model->eval();
  model->forward(x).sum().backward();
  CHECK(grad.equal(model[0]->as<torch::nn::Linear>()->weight.grad()));
  // The in-place and functional forms too.
  at::Tensor y = x.clone();
  torch::nn::functional::dropout(y, torch::nn::functional::DropoutFuncOptions().p(0.9).inplace(true));
  CHECK(y.equal(x));
  CHECK(torch::feature_alpha_dropout(x, 0.9, true).equal(x));
  {
    c10::InferenceMode inference;  // no autograd key: the CPU kernel is the one that runs
    CHECK(torch::dropout(x, 0.9, true).equal(x));
  }

  tp::seed_all(1234, false, false);  // the override goes with a call without rm_dropout
  CHECK_FALSE(tp::dropout_removed());
  model->train();
  CHECK_FALSE(model->forward(x).equal(eval_out));
}

TEST_CASE("seed_all leaves msprobe's NPU variables unset: they mean nothing to libtorch") {
  SeedDefaults restore;
  const char* npu_only[] = {"HCCL_DETERMINISTIC", "LCCL_DETERMINISTIC", "CLOSE_MATMUL_K_SHIFT", "ATB_LLM_LCOC_ENABLE"};
  for (const char* name : npu_only) ::unsetenv(name);
  tp::seed_all(1234, /*mode=*/true, /*rm_dropout=*/false, /*is_enhanced=*/true);
  for (const char* name : npu_only) CHECK_MESSAGE(std::getenv(name) == nullptr, name);
}

TEST_CASE("config keys seed and is_deterministic make the Debugger call seed_all; bad values are named errors") {
  SeedDefaults restore;
  tptest::TempDir tmp;
  {
    tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(
        tp::Options().dump_path(tmp / "d").seed(1234).is_deterministic(true));
    CHECK(at::globalContext().deterministicAlgorithms());
    CHECK(mean_of_randn() == doctest::Approx(-0.08656439185142517).epsilon(1e-7));
  }
  tp::seed_all(99, false);
  {  // is_deterministic without seed: the seed is msprobe's default, 1234 (README, configuration)
    tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp / "g").is_deterministic(true));
    CHECK(at::globalContext().deterministicAlgorithms());
    CHECK(mean_of_randn() == doctest::Approx(-0.08656439185142517).epsilon(1e-7));
  }
  tp::seed_all(1, false);
  const at::Tensor first = torch::randn({3});
  tp::seed_all(1, false);
  {
    tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(tmp / "e"));  // neither key
    CHECK_FALSE(dbg.config().seed.has_value());
    CHECK(torch::randn({3}).equal(first));  // the Debugger left the generator alone
  }
  auto rejection = [&](nlohmann::json value, const char* key) {
    try {
      tp::Options().dump_path(tmp / "f").set(key, value).resolve();
    } catch (const tp::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(rejection(-1, "seed") ==
        "config key \"seed\": -1 is invalid: it is outside [0, 4294967295] (allowed: an integer from 0 to 4294967295)");
  CHECK(rejection(4294967296LL, "seed").find("is outside [0, 4294967295]") != std::string::npos);
  CHECK(rejection("1234", "seed").find("it should be an integer") != std::string::npos);
  CHECK(rejection(1, "is_deterministic") ==
        "config key \"is_deterministic\": 1 is invalid: it should be a boolean (allowed: true or false)");
  CHECK(tp::Options().dump_path(tmp / "f").seed(4294967295LL).resolve().seed == 4294967295u);
  CHECK(rejection("high", "precision") == "accepted");
  CHECK(rejection("medium", "precision").find("config key \"precision\"") != std::string::npos);
}

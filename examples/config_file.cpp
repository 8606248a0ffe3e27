// Config-file driven: msprobe's config.json chooses the task, level, steps and filters at run time,
// and torchprobe::PrecisionDebugger picks the matching Debugger. The shipped config.json dumps
// steps 0 and 2 only, keeping the entries whose names contain "addmm" or "relu".
// Usage: config_file [config.json] [dump_path]
//   config.json defaults to the copy next to this executable; dump_path, when given, overrides
//   the file's "dump_path" (options given in code win over the file).
#include <torch/torch.h>
#include <torchprobe/torchprobe.hpp>

#include <filesystem>
#include <iostream>

namespace tp = torchprobe;

struct NetImpl : torch::nn::Module {
  NetImpl() : fc(register_module("fc", torch::nn::Linear(8, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  const std::string config_path =
      argc > 1 ? argv[1] : (std::filesystem::path(argv[0]).parent_path() / "config.json").string();
  tp::Options overrides;
  if (argc > 2) overrides.dump_path(argv[2]);

  try {
    tp::PrecisionDebugger dbg(config_path, overrides);
    std::cout << "config " << config_path << ": dumping to " << dbg.config().dump_path << "\n";
    torch::manual_seed(1234);
    Net model;
    for (int step = 0; step < 3; ++step) {
      dbg.start(model);  // does nothing in a step the config does not list
      auto loss = model->forward(torch::randn({2, 8})).sum();
      loss.backward();
      dbg.stop();
      dbg.step();
    }
  } catch (const tp::ConfigError& e) {
    // Every invalid key or value is reported with the key, the bad value and what is allowed.
    std::cerr << "invalid configuration: " << e.what() << "\n";
    return 1;
  }
  std::cout << "done\n";
  return 0;
}

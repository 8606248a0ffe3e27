// Quick start: the model of msprobe's reference dumps (Linear(8, 4) then relu, seed 1234), dumped
// at level L1 with statistics for two steps. Usage: quick_start [dump_path]   (default ./dump)
#include <torch/torch.h>
#include <torchprobe/torchprobe.hpp>

#include <iostream>

namespace tp = torchprobe;

struct NetImpl : torch::nn::Module {
  NetImpl() : fc(register_module("fc", torch::nn::Linear(8, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  const std::string dump_path = argc > 1 ? argv[1] : "./dump";
  torch::manual_seed(1234);
  Net model;

  tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(dump_path));
  for (int step = 0; step < 2; ++step) {
    auto x = torch::randn({2, 8}, torch::requires_grad());
    {
      tp::ScopedDump scope(dbg, model);  // start(model) ... stop()
      auto loss = model->forward(x).sum();
      loss.backward();
    }
    std::cout << "step " << step << ": " << dbg.directory() << "/dump.json\n";
    dbg.step();  // next step{N}/ folder
  }
  std::cout << "TorchProbe wrote its dump to " << dump_path << "\n";
  return 0;
}

// Uses TorchProbe only through a CMake target (torchprobe::torchprobe, or torchprobe::compiled): a
// Linear + relu step dumped at level L1. Usage: consumer DUMP_PATH
#include <torch/torch.h>
#include <torchprobe/torchprobe.hpp>

#include <iostream>

namespace tp = torchprobe;

// A distinctive name: check_dump.py looks for it in stack.json, which names it only when the
// target's -rdynamic reached this executable's link line.
struct ConsumerNetImpl : torch::nn::Module {
  ConsumerNetImpl() : fc(register_module("fc", torch::nn::Linear(8, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(ConsumerNet);

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: consumer DUMP_PATH\n";
    return 2;
  }
  torch::manual_seed(0);
  ConsumerNet net;
  tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(argv[1]));
  {
    tp::ScopedDump scope(dbg, net);
    net->forward(torch::randn({2, 8})).sum().backward();
  }
  dbg.step();
  std::cout << "TorchProbe " << TORCHPROBE_VERSION_STRING << " dumped to " << argv[1] << "\n";
  return 0;
}

// Module entries (levels L0 and mix). Parameter-owning leaf modules such as Linear are found
// automatically; a module of your own says so with one ModuleGuard line, and probe_children covers
// the parameter-free children (ReLU) of a Sequential. Level::Mix records modules and ATen calls
// together and writes construct.json, which maps each entry to its enclosing module.
// Usage: module_levels [dump_path]   (default ./dump_modules)
#include <torch/torch.h>
#include <torchprobe/torchprobe.hpp>

#include <iostream>

namespace tp = torchprobe;

struct BlockImpl : torch::nn::Module {
  BlockImpl() : proj(register_module("proj", torch::nn::Linear(8, 8))) {}
  torch::Tensor forward(torch::Tensor x) {
    tp::ModuleGuard guard(this, x);  // Module.block.Block.forward.{n}, and its backward
    return torch::relu(proj(x)) + x;
  }
  torch::nn::Linear proj;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl()
      : block(register_module("block", Block())),
        head(register_module("head", tp::probe_children(torch::nn::Sequential(
                                         torch::nn::Linear(8, 4), torch::nn::ReLU(), torch::nn::Linear(4, 1))))) {}
  torch::Tensor forward(torch::Tensor x) { return head->forward(block(x)); }
  Block block;
  torch::nn::Sequential head;
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  const std::string dump_path = argc > 1 ? argv[1] : "./dump_modules";
  torch::manual_seed(1234);
  Net model;

  // Level::L0 would keep only the Module.* entries; Level::L1 only the Aten.* ones.
  tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(dump_path));
  const auto x = torch::randn({4, 8});
  {
    tp::ScopedDump scope(dbg, model);
    model->forward(x).sum().backward();
  }
  std::cout << "module and API entries, with construct.json: " << dbg.directory() << "\n";
  dbg.step();
  return 0;
}

// Training loop: a small MLP learns y = sum(x) with SGD for a few steps. Each step's forward and
// backward run inside a ScopedDump, and dbg.step() closes the step, so the dump holds one
// step{N}/ folder per training step. Usage: training_loop [dump_path]   (default ./dump_training)
#include <torch/torch.h>
#include <torchprobe/torchprobe.hpp>

#include <iostream>

namespace tp = torchprobe;

int main(int argc, char** argv) {
  const std::string dump_path = argc > 1 ? argv[1] : "./dump_training";
  const int steps = 3;
  torch::manual_seed(0);

  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 1));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05));
  const auto x = torch::randn({32, 8});
  const auto y = x.sum(1, /*keepdim=*/true);

  tp::Debugger<tp::Level::L1, tp::Task::Statistics> dbg(tp::Options().dump_path(dump_path));
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    torch::Tensor loss;
    {
      // Captures the model's forward and backward ATen calls. Move optimizer.step() into this
      // scope to dump the parameter update as well.
      tp::ScopedDump scope(dbg, model);
      loss = torch::mse_loss(model->forward(x), y);
      loss.backward();
    }
    optimizer.step();
    std::cout << "step " << step << ": loss " << loss.item<float>() << "  (dump: " << dbg.directory() << ")\n";
    dbg.step();  // writes step{N}/ and starts numbering the next one
  }
  std::cout << "TorchProbe wrote " << steps << " steps to " << dump_path << "\n";
  return 0;
}

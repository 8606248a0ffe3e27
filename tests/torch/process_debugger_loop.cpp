// The other file of msprobe_usage_test.cpp's process-debugger case: a training loop that knows
// no debugger object, only torchprobe::start(model), stop() and step(), as msprobe's guide calls
// PrecisionDebugger.start() in a file other than the one that made it. A translation unit of its
// own (tests/CMakeLists.txt keeps it out of the test batches).
#include <torch/torch.h>

#include <torchprobe/torchprobe.hpp>

#include "test_support.hpp"

extern "C" void tp_process_loop_train(tptest::Net& net, int steps) {
  torch::manual_seed(3);
  for (int s = 0; s < steps; ++s) {
    const auto x = torch::randn({2, 8});
    torchprobe::start(net);
    auto loss = net->forward(x).sum();
    loss.backward();
    torchprobe::stop();
    torchprobe::step();
  }
}

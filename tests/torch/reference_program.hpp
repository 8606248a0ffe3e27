#pragma once
// msprobe's reference program (../shared/reference-dumps: Net{fc = Linear(8, 4)}, seed 1234, two
// steps of relu(fc(x)).sum().backward() with x = randn(2, 8)), run under TorchProbe. The tests that
// set TorchProbe's dumps beside msprobe's run it the same way.
#include <torch/torch.h>

#include <torchprobe/torchprobe.hpp>

#include <string>

#include "test_support.hpp"

namespace tptest {

template <torchprobe::Level L>
void run_reference_program(const std::string& dump_path, const char* summary_mode) {
  namespace tp = torchprobe;
  tp::Debugger<L, tp::Task::Statistics> dbg(tp::Options().dump_path(dump_path).summary_mode(summary_mode));
  torch::manual_seed(1234);
  Net net;
  for (int s = 0; s < 2; ++s) {
    const auto x = torch::randn({2, 8}, torch::requires_grad());
    {
      tp::ScopedDump scope(dbg, net);
      net->forward(x).sum().backward();
    }
    dbg.step();
  }
}

}  // namespace tptest

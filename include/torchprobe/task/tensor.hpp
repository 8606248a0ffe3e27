#pragma once
// Task::Tensor: the statistics of every tensor, and the tensor itself in
// dump_tensor_data/{entry}.{file_key}.pt ("data_name" in its dump.json item), a file Python's
// torch.load reads back as an equal tensor. The files are written off the training thread
// (io/tensor_writer.hpp); data_mode, scope and list choose the entries as for statistics.
#include "torchprobe/task/statistics.hpp"

namespace torchprobe {

class TensorTask : public StatisticsTask {
 public:
  static constexpr Task kind = Task::Tensor;

  explicit TensorTask(const Config& config) : StatisticsTask(config, /*save_every_tensor=*/true) {}
};

}  // namespace torchprobe

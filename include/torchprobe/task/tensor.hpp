#pragma once
// Task::Tensor: the statistics of every tensor, and the tensor itself in
// dump_tensor_data/{entry}.{file_key}.pt ("data_name" in its dump.json item), a file Python's
// torch.load reads back as an equal tensor. The files are written off the training thread
// (io/tensor_writer.hpp); data_mode, scope and list choose the entries as for statistics. With
// bench_path (msprobe's live check), only the entries the check finds differing are saved.
#include <array>
#include <string_view>

#include "torchprobe/task/statistics.hpp"

namespace torchprobe {

class TensorTask : public StatisticsTask {
 public:
  static constexpr std::string_view name = task_name(Task::Tensor);
  static constexpr LevelSet levels{Level::L0, Level::L1, Level::Mix, Level::L2, Level::Debug};
  static constexpr std::array<std::string_view, 3> config_keys{"summary_mode", "bench_path", "diff_nums"};
  static bool saves_tensors(const Config&) { return true; }

  TensorTask(const Config& config, TensorSaver saver)
      : StatisticsTask(config, std::move(saver), /*save_every_tensor=*/true) {}
};

}  // namespace torchprobe

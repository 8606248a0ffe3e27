#pragma once
// A task that exists only in the tests, to show what adding a task takes: this header and one
// entry in a task list (task_registry_test.cpp). It takes the place of the built-in "structure"
// task (task/structure.hpp) in its own list: each tensor is described by its type, dtype and shape.
#include <array>
#include <string_view>

#include <torchprobe/torchprobe.hpp>

namespace tptest {

class ToyStructureTask {
 public:
  static constexpr torchprobe::Task kind = torchprobe::Task::Structure;
  static constexpr torchprobe::LevelSet levels{torchprobe::Level::Mix};  // msprobe runs structure at mix
  static constexpr std::array<std::string_view, 0> config_keys{};
  static bool saves_tensors(const torchprobe::Config&) { return false; }

  explicit ToyStructureTask(const torchprobe::Config&) {}

  nlohmann::ordered_json describe(const at::Tensor& t, const torchprobe::capture::Site&, torchprobe::Record&,
                                  bool /*gradient*/ = false) const {
    return torchprobe::tensor_header(t);
  }
  bool keep(torchprobe::Record&) const { return true; }
};

}  // namespace tptest

#pragma once
// A task that exists only in the tests, to show what adding a task takes: this header and one
// entry in a task list (task_registry_test.cpp), no change to the library. Its name is its own
// ("toy_shapes"), so a config.json names it as any task: each tensor is described by its type,
// dtype and shape.
#include <array>
#include <string_view>

#include <torchprobe/torchprobe.hpp>

namespace tptest {

class ToyShapesTask {
 public:
  static constexpr std::string_view name = "toy_shapes";
  static constexpr torchprobe::LevelSet levels{torchprobe::Level::Mix};
  static constexpr std::array<std::string_view, 0> config_keys{};
  static bool saves_tensors(const torchprobe::Config&) { return false; }

  explicit ToyShapesTask(const torchprobe::Config&) {}

  nlohmann::ordered_json describe(const at::Tensor& t, const torchprobe::Site&, torchprobe::Record&,
                                  bool /*gradient*/ = false) const {
    return torchprobe::tensor_header(t);
  }
  bool keep(torchprobe::Record&) const { return true; }
};

}  // namespace tptest

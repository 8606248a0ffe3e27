// Built only by ctest's `task_contract` test, which expects the build to FAIL: each task below
// breaks task/task_traits.hpp's contract in one way, the sink breaks sink/sink_traits.hpp's, and
// the compiler must name what is missing (check_contract.cmake lists the messages it looks for). A
// task or sink that compiled here would be one the library cannot tell is broken until deep inside.
#include <array>
#include <string>
#include <string_view>

#include <torchprobe/torchprobe.hpp>

namespace tp = torchprobe;

namespace {

// Everything a task needs but keep().
struct WithoutKeep {
  static constexpr std::string_view name = "without_keep";
  static constexpr tp::LevelSet levels{tp::Level::L1};
  static constexpr std::array<std::string_view, 0> config_keys{};
  static bool saves_tensors(const tp::Config&) { return false; }
  explicit WithoutKeep(const tp::Config&) {}
  nlohmann::ordered_json describe(const at::Tensor&, const tp::Site&, tp::Record&, bool = false) const {
    return nullptr;
  }
};

// A describe() that takes no Site: the capture could not call it.
struct DescribeWithoutSite {
  static constexpr std::string_view name = "describe_without_site";
  static constexpr tp::LevelSet levels{tp::Level::L1};
  static constexpr std::array<std::string_view, 0> config_keys{};
  static bool saves_tensors(const tp::Config&) { return false; }
  explicit DescribeWithoutSite(const tp::Config&) {}
  nlohmann::ordered_json describe(const at::Tensor&) const { return nullptr; }
  bool keep(tp::Record&) const { return true; }
};

// ended() without end_reason(): the user would never hear why the dump stopped.
struct EndsWithoutReason {
  static constexpr std::string_view name = "ends_without_reason";
  static constexpr tp::LevelSet levels{tp::Level::L1};
  static constexpr std::array<std::string_view, 0> config_keys{};
  static bool saves_tensors(const tp::Config&) { return false; }
  explicit EndsWithoutReason(const tp::Config&) {}
  nlohmann::ordered_json describe(const at::Tensor&, const tp::Site&, tp::Record&, bool = false) const {
    return nullptr;
  }
  bool keep(tp::Record&) const { return true; }
  bool ended() const { return false; }
};

// A sink of the form before the sink contract (sink/sink_traits.hpp): open() took a second
// argument; the library now makes dump_tensor_data/ itself.
struct SinkWithOldOpen {
  void open(const std::string&, bool) {}
  void write_step(const tp::StepDump&) {}
};

}  // namespace

// A Debugger of each, made (the Debugger's face holds its implementation behind a pointer: the
// contract is checked where the implementation is made), and one in a task list (PrecisionDebugger's
// way in).
void make_each() {
  tp::BasicDebugger<tp::Level::L1, WithoutKeep> without_keep;
  tp::BasicDebugger<tp::Level::L1, DescribeWithoutSite> describe_without_site;
  tp::BasicDebugger<tp::Level::L1, tp::StatisticsTask, SinkWithOldOpen> old_sink;
  // A built-in task at a level it does not run at: structure is L0 or mix (README, Structure).
  tp::Debugger<tp::Level::L1, tp::Task::Structure> structure_at_l1;
}
static_assert(sizeof(tp::TaskList<tp::StatisticsTask, EndsWithoutReason>) > 0);

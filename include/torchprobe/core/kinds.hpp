#pragma once
// The two words a Debugger is named by: its capture level and its task (msprobe's "level" and
// "task"), with the spellings config.json and dump.json use. Each list is spelled here once.
#include <initializer_list>
#include <string_view>

namespace torchprobe {

// Which calls are captured. Debug is msprobe's level "debug": nothing is captured automatically,
// only what save() is given (debug.json).
enum class Level { L0, L1, Mix, L2, Debug };

// msprobe's tasks, by name (what is written for each captured tensor). A task class carries its
// own name (task/task_traits.hpp), so a task of your own needs no value here.
// GradProbe is no Debugger task: GradMonitor (task/grad_probe/monitor.hpp) runs it.
// RunUt configures the `torchprobe run_ut` command (config/run_ut.hpp), not a dump.
enum class Task { Statistics, Tensor, OverflowCheck, FreeBenchmark, Structure, GradProbe, RunUt };

inline constexpr Level kLevels[] = {Level::L0, Level::L1, Level::Mix, Level::L2, Level::Debug};
inline constexpr Task kMsprobeTasks[] = {Task::Statistics, Task::Tensor,    Task::OverflowCheck, Task::FreeBenchmark,
                                         Task::Structure,  Task::GradProbe, Task::RunUt};

// A set of levels: those a task supports.
class LevelSet {
 public:
  constexpr LevelSet(std::initializer_list<Level> levels) {
    for (Level l : levels) bits_ |= bit(l);
  }
  constexpr bool contains(Level l) const { return (bits_ & bit(l)) != 0; }
  friend constexpr bool operator==(LevelSet a, LevelSet b) { return a.bits_ == b.bits_; }

 private:
  static constexpr unsigned bit(Level l) { return 1u << static_cast<unsigned>(l); }
  unsigned bits_ = 0;
};

constexpr std::string_view level_name(Level l) {
  switch (l) {
    case Level::L0: return "L0";
    case Level::L1: return "L1";
    case Level::Mix: return "mix";
    case Level::L2: return "L2";
    case Level::Debug: return "debug";
  }
  return "?";
}

constexpr std::string_view task_name(Task t) {
  switch (t) {
    case Task::Statistics: return "statistics";
    case Task::Tensor: return "tensor";
    case Task::OverflowCheck: return "overflow_check";
    case Task::FreeBenchmark: return "free_benchmark";
    case Task::Structure: return "structure";
    case Task::GradProbe: return "grad_probe";
    case Task::RunUt: return "run_ut";
  }
  return "?";
}

// A task as config.json and dump.json name it: one of msprobe's (Task converts to it, so
// `config.task == Task::Tensor` reads as it says) or a task class's own `name`. It views a name
// with static storage: a literal, or a task class's constant.
class TaskName {
 public:
  constexpr TaskName(Task t) : name_(task_name(t)) {}  // NOLINT: implicit on purpose
  constexpr explicit TaskName(std::string_view static_name) : name_(static_name) {}
  constexpr std::string_view str() const { return name_; }
  friend constexpr bool operator==(TaskName a, TaskName b) { return a.name_ == b.name_; }
  friend constexpr bool operator!=(TaskName a, TaskName b) { return !(a == b); }

 private:
  std::string_view name_;
};

// The msprobe task of this name, if it is one.
constexpr const Task* find_msprobe_task(std::string_view name) {
  for (const Task& t : kMsprobeTasks)
    if (task_name(t) == name) return &t;
  return nullptr;
}

}  // namespace torchprobe

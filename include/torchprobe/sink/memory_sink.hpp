#pragma once
// Keeps each flushed step in memory as JSON documents: for tests, and for trainers that want to
// inspect statistics themselves instead of reading files.
#include <map>
#include <mutex>
#include <string>

#include "torchprobe/sink/step_dump.hpp"

namespace torchprobe {

class MemorySink {
 public:
  struct Files {
    nlohmann::ordered_json dump, stack, construct;
    nlohmann::ordered_json debug;                              // save()'s debug.json, null when nothing was saved
    std::map<std::string, nlohmann::ordered_json> task_files;  // overflow_summary.json, ...
    std::map<std::string, std::string> task_text_files;        // free_benchmark.csv
  };

  void open(const std::string& directory, bool tensor_files) {
    if (tensor_files) create_tensor_directory(directory);
  }

  void write_step(const StepDump& d) {
    std::lock_guard<std::mutex> lock(mutex_);
    Files& f = steps_[d.step];
    f.dump = d.dump_json();
    f.stack = d.extra_info ? d.stack_json() : nlohmann::ordered_json();
    f.construct = d.construct_json();
    f.task_files.clear();
    for (const auto& tf : d.task_files) f.task_files[tf.first] = tf.second;
    f.task_text_files.clear();
    for (const auto& tf : d.task_text_files) f.task_text_files[tf.first] = tf.second;
  }

  void write_debug(const StepDump& d) {
    std::lock_guard<std::mutex> lock(mutex_);
    steps_[d.step].debug = d.dump_json();
  }

  // The last flush of each step, keyed by step number.
  std::map<std::int64_t, Files> steps() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return steps_;
  }
  const Files& step(std::int64_t n) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return steps_.at(n);
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::int64_t, Files> steps_;
};

// Records nothing: for measuring the cost of capture alone.
class NullSink {
 public:
  void open(const std::string& directory, bool tensor_files) {
    if (tensor_files) create_tensor_directory(directory);
  }
  void write_step(const StepDump&) {}
  void write_debug(const StepDump&) {}
};

}  // namespace torchprobe

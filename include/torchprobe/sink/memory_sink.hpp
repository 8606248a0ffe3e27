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
    nlohmann::ordered_json debug;              // save()'s debug.json, null when nothing was saved
    std::map<std::string, std::string> files;  // the task's own: overflow_summary.json, free_benchmark.csv

    // One of the task's JSON files, parsed (at() throws std::out_of_range for a file not there).
    nlohmann::ordered_json json_file(const std::string& name) const {
      return nlohmann::ordered_json::parse(files.at(name));
    }
  };

  void open(const std::string&) {}

  void write_step(const StepDump& d) {
    std::lock_guard<std::mutex> lock(mutex_);
    Files& f = steps_[d.step];
    f.dump = d.dump_json();
    f.stack = d.extra_info ? d.stack_json() : nlohmann::ordered_json();
    f.construct = d.construct_json();
    f.files.clear();
    for (const StepFile& tf : d.files) f.files[tf.name] = tf.text;
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

}  // namespace torchprobe

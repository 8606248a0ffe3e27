#pragma once
// What a sink receives when a step is flushed: the step's records, already in dump order and
// with every statistic resolved, plus the facts of the step needed for the file headers.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "record.hpp"

namespace torchprobe {

struct StepDump {
  std::string task;                  // "statistics"
  std::string level;                 // "L1"
  std::string directory;             // {dump_path}/step{N}/{rank dir}
  std::int64_t step = 0;
  nlohmann::ordered_json dump_data_dir = nullptr;  // set when tensors are saved
  bool extra_info = true;            // write stack.json and construct.json
  const std::vector<Record>* records = nullptr;
  nlohmann::ordered_json construct = nlohmann::ordered_json::object();

  // {"task", "level", "framework", "dump_data_dir", "data"} in msprobe's key order.
  nlohmann::ordered_json dump_json() const {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    j["task"] = task;
    j["level"] = level;
    j["framework"] = "pytorch";
    j["dump_data_dir"] = dump_data_dir;
    nlohmann::ordered_json data = nlohmann::ordered_json::object();
    if (records)
      for (const Record& r : *records) data[r.name] = r.body;
    j["data"] = std::move(data);
    return j;
  }

  nlohmann::ordered_json stack_json() const {
    std::vector<std::pair<std::string, io::CallStack>> forward;
    if (records)
      for (const Record& r : *records)
        if (r.stack) forward.emplace_back(r.name, *r.stack);
    return io::build_stack_json(forward);
  }
};

}  // namespace torchprobe

#pragma once
// The members of dump.json and debug.json before "data", in msprobe's order. The JSON tree
// (StepDump::dump_json), the streamed text (sink/step_text.hpp), the journal's first line and
// recovery's rebuilt files all write them from here, so that none of them can drift.
#include <array>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace torchprobe::io {

struct DumpHeader {
  // The keys in order; "data" follows them.
  static constexpr std::array<std::string_view, 4> kKeys{"task", "level", "framework", "dump_data_dir"};
  static constexpr std::string_view kFramework = "pytorch";  // msprobe's PyTorch dump

  std::string task;                                // "statistics"
  std::string level;                               // "L1", "debug"
  nlohmann::ordered_json dump_data_dir = nullptr;  // the tensor directory, when tensors are saved

  // Calls f(key, value) for each member, in order.
  template <class F>
  void each(F&& f) const {
    f(kKeys[0], nlohmann::ordered_json(task));
    f(kKeys[1], nlohmann::ordered_json(level));
    f(kKeys[2], nlohmann::ordered_json(std::string(kFramework)));
    f(kKeys[3], dump_data_dir);
  }
  // Puts the members into `object`, after what it holds.
  void put_into(nlohmann::ordered_json& object) const {
    each([&](std::string_view key, nlohmann::ordered_json value) { object[std::string(key)] = std::move(value); });
  }
};

}  // namespace torchprobe::io

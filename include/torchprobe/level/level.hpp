#pragma once
// Capture level: which kinds of calls a Debugger records (msprobe's "level").
#include <string_view>

namespace torchprobe {

// Debug is msprobe's level "debug": nothing is captured automatically, only what save() is given
// (debug.json).
enum class Level { L0, L1, Mix, L2, Debug };

// Compile-time facts about a level, used by Debugger to pick the capture mechanisms.
template <Level L>
struct LevelTraits {
  static constexpr bool captures_apis = (L == Level::L1 || L == Level::Mix || L == Level::L2);
  static constexpr bool captures_modules = (L == Level::L0 || L == Level::Mix);
  static constexpr bool nested_apis = (L == Level::L2);
  static constexpr bool save_only = (L == Level::Debug);
};

// The spelling msprobe uses in config.json and in dump.json's "level" field.
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

}  // namespace torchprobe

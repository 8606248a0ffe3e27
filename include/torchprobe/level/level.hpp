#pragma once
// The level policy: which capture mechanisms a Debugger of a level switches on.
#include "torchprobe/core/kinds.hpp"

namespace torchprobe {

template <Level L>
struct LevelTraits {
  static constexpr bool captures_apis = (L == Level::L1 || L == Level::Mix || L == Level::L2);
  static constexpr bool captures_modules = (L == Level::L0 || L == Level::Mix);
  static constexpr bool nested_apis = (L == Level::L2);
  static constexpr bool save_only = (L == Level::Debug);
};

}  // namespace torchprobe

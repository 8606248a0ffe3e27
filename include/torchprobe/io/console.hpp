#pragma once
// What the user must hear at once, on standard error, one line each: TorchProbe never stops
// training, so this (and dump_error_info.log) is how a problem is seen.
#include <iostream>
#include <string>

namespace torchprobe::io {

inline void tell_user(const std::string& message) { std::cerr << "torchprobe: " << message << "\n"; }

}  // namespace torchprobe::io

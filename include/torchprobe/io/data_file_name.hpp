#pragma once
// A file name that a dump holds (an entry's "data_name", the .pt file of its tensor) before it is
// joined to the directory it must lie in. dump.json is read from other machines and other people:
// a name with a directory part ("../../etc/x", "/abs/x", "sub/x") would make compare or run_ut
// read a file outside the dump, so it is refused, not resolved.
#include <optional>
#include <string>
#include <string_view>

namespace torchprobe::io {

// Why `name` is not a plain file name, or nullopt. msprobe and TorchProbe write names such as
// "Functional.linear.0.forward.input.0.pt": no separator, never "." or "..".
inline std::optional<std::string> data_file_name_problem(std::string_view name) {
  if (name.empty()) return std::string("an empty file name");
  if (name == "." || name == "..") return "\"" + std::string(name) + "\" names a directory, not a file";
  if (name.find('/') != std::string_view::npos || name.find('\\') != std::string_view::npos)
    return std::string("a file name may not hold a directory part ('/' or '\\')");
  if (name.find('\0') != std::string_view::npos) return std::string("a file name may not hold a NUL character");
  return std::nullopt;
}

}  // namespace torchprobe::io

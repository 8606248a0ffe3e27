#pragma once
// Where a value sits inside its entry: a Site is what a task's describe() is told about each
// tensor, so it belongs to the task contract (task/task_traits.hpp) and lives below it.
#include <string>

namespace torchprobe {

// A JSON pointer reference token: '~' and '/' must be escaped inside keys.
inline std::string pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

// Its JSON pointer inside the entry (for deferred statistics) and its msprobe file key
// ("input.0", "input.1.0", "kwargs.bias", "output.0") for saved tensors.
struct Site {
  std::string pointer;
  std::string file_key;
  Site child(const std::string& token) const { return {pointer + "/" + pointer_token(token), file_key + "." + token}; }
};

}  // namespace torchprobe

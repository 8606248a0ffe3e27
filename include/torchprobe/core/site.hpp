#pragma once
// Where a value sits inside its entry: a Site is what a task's describe() is told about each
// tensor, so it belongs to the task contract (task/task_traits.hpp) and lives below it.
#include <cstddef>
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
// Made by the named constructors below, one per place an entry holds tensors, so that the pointer
// and the file key cannot disagree.
struct Site {
  std::string pointer;
  std::string file_key;
  Site child(const std::string& token) const { return {pointer + "/" + pointer_token(token), file_key + "." + token}; }

  // A positional argument: input_args[i], "input.i".
  static Site input(std::size_t i) { return in("input_args", "input", std::to_string(i)); }
  // A keyword argument: input_kwargs[name], "kwargs.name".
  static Site kwarg(const std::string& name) { return {"/input_kwargs/" + pointer_token(name), "kwargs." + name}; }
  // An output: output[i], "output.i".
  static Site output(std::size_t i) { return in("output", "output", std::to_string(i)); }
  // A module's own parameter in its forward entry: parameters[name], "parameters.name".
  static Site parameter(const std::string& name) {
    return {"/parameters/" + pointer_token(name), "parameters." + name};
  }
  // A parameter's gradient in a parameters_grad entry: name[0], "name".
  static Site parameter_grad(const std::string& name) { return {"/" + pointer_token(name) + "/0", name}; }
  // A gradient of a backward entry: {key}[i], "{key}.i" (key: "input" or "output").
  static Site gradient(const char* key, std::size_t i) { return in(key, key, std::to_string(i)); }

 private:
  static Site in(const char* member, const char* file_prefix, const std::string& index) {
    return {std::string("/") + member + "/" + index, std::string(file_prefix) + "." + index};
  }
};

}  // namespace torchprobe

#pragma once
// What the probe knows about an operator (capture/op_registry.hpp looks it up once per overload).
// A task that re-runs calls is handed it (check_call, task/task_traits.hpp), so it lives below
// both the tasks and the capture.
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace torchprobe {

// How an argument's IValue must be read: ScalarType/Layout/MemoryFormat travel boxed as plain
// ints, so only the schema says that an int is really a dtype.
enum class ArgKind { Generic, ScalarType, Layout, MemoryFormat };

struct ArgInfo {
  std::string name;
  bool kwarg_only = false;
  ArgKind kind = ArgKind::Generic;
  bool written = false;  // the op writes into it (in-place self, out=)
};

struct OpInfo {
  std::string qualified;   // "aten::add"
  std::string api;         // "add": the ATen name without namespace and overload
  std::string key;         // "Aten.add.", "Mylib.scale.": the per-API counter key and name prefix
  std::size_t key_id = 0;  // the same key as a small number, shared by all overloads of the API
  bool user_api = false;   // an aten:: op not on the infrastructure list, or a custom operator
  bool schema_known = false;
  std::vector<ArgInfo> args;
  std::size_t returns = 0;                    // how many values the schema returns
  std::optional<c10::OperatorHandle> handle;  // to call the op again (free_benchmark)
};

}  // namespace torchprobe

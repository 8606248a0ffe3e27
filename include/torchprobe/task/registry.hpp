#pragma once
// The tasks this TorchProbe implements (task/builtin.hpp lists them), with their definitions: the
// BuiltinTasks complete, for PrecisionDebugger to dispatch on.
#include <tuple>

#include "torchprobe/task/builtin.hpp"
#include "torchprobe/task/free_benchmark.hpp"
#include "torchprobe/task/overflow_check.hpp"
#include "torchprobe/task/statistics.hpp"
#include "torchprobe/task/structure.hpp"
#include "torchprobe/task/task_list.hpp"
#include "torchprobe/task/tensor.hpp"

namespace torchprobe {

namespace details {
template <class Entries>
struct names_match;
template <class... Entries>
struct names_match<std::tuple<Entries...>> {
  static constexpr bool value = ((Entries::type::name == task_name(Entries::id)) && ...);
};
}  // namespace details
static_assert(details::names_match<BuiltinTaskEntries>::value,
              "torchprobe: each task of task/builtin.hpp is listed under its own name");

}  // namespace torchprobe

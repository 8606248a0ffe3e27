#pragma once
// Collectives that libtorch routes through the dispatcher: on 2.x every c10d::ProcessGroup method
// (pg->allreduce(...) is the operator c10d::allreduce_), on 1.13 the functions of c10d::ops. The
// observer sees them as records named "c10d::..."; this header says which msprobe API each one is
// (capture/pending_collectives.hpp keeps those whose work is still running). Reading the boxed arguments (a
// ProcessGroup, a ReduceOp, a Work) needs libtorch's c10d headers: distributed.hpp installs that
// reader (capture/c10d_reader.hpp), so a program that never includes it sees no change.
#include <ATen/record_function.h>

#include <atomic>
#include <cstring>
#include <string_view>

#include "torchprobe/capture/collective.hpp"

namespace torchprobe::capture {

// One c10d operator: the msprobe name of the call and what its arguments after the process group
// mean. Every operator takes its tensors before the process group.
struct DispatchedCollective {
  std::string_view op;         // "c10d::allreduce_"
  const char* api;             // "all_reduce"
  const char* peer = nullptr;  // the first int after the group: "src" or "dst" (root_rank, peer)
  int tag_int = -1;            // which int after the group is the tag (send, recv)
  bool tensors = true;         // false: the tensors are the backend's own (2.x barrier's)
  bool keep_lists = false;     // a list of one tensor stays a list (all_to_all's lists)
  bool input_first = false;    // Python's API names the input before the output (gather)
};

// The operators and their Python names (torch.distributed, as msprobe wraps them; barrier too).
inline const DispatchedCollective* dispatched_collective(const char* name) {
  static const DispatchedCollective table[] = {
      {"c10d::allreduce_", "all_reduce"},
      {"c10d::broadcast_", "broadcast", "src"},
      {"c10d::allgather_", "all_gather"},
      {"c10d::_allgather_base_", "all_gather_into_tensor"},
      {"c10d::reduce_scatter_", "reduce_scatter"},
      {"c10d::_reduce_scatter_base_", "reduce_scatter_tensor"},
      {"c10d::reduce_", "reduce", "dst"},
      {"c10d::gather_", "gather", "dst", -1, true, false, true},
      {"c10d::scatter_", "scatter", "src"},
      {"c10d::alltoall_", "all_to_all", nullptr, -1, true, true},
      {"c10d::alltoall_base_", "all_to_all_single"},
      {"c10d::send", "send", "dst", 1},
      {"c10d::recv_", "recv", "src", 1},
      {"c10d::recv_any_source_", "recv", nullptr, 0},
      {"c10d::barrier", "barrier", nullptr, -1, false},
  };
  if (std::strncmp(name, "c10d::", 6) != 0) return nullptr;
  for (const DispatchedCollective& d : table)
    if (d.op == name) return &d;
  return nullptr;
}

// Reads a dispatched call: its arguments at the start (tensors, group, op, src/dst, tag) and,
// at the end, the Work it returned (Collective::completed polls it).
struct DispatchedReader {
  bool (*describe)(const at::RecordFunction& fn, const DispatchedCollective& kind, Collective& c);
  void (*attach_work)(const at::RecordFunction& fn, Collective& c);
};

inline std::atomic<const DispatchedReader*>& dispatched_reader() {
  static std::atomic<const DispatchedReader*> reader{nullptr};
  return reader;
}

// True on a thread while a torchprobe::dist wrapper runs its call: the wrapper records it, and on
// libtorch 2.x the process group's dispatcher operator must not record it a second time.
inline bool& wrapper_running() {
  thread_local bool running = false;
  return running;
}

}  // namespace torchprobe::capture

#pragma once
// Reads a collective that went through the dispatcher (capture/dispatched_collectives.hpp) from
// its boxed arguments: the tensors before the process group, the group, a ReduceOp, the ints
// after the group (root rank or peer, tag), and the Work it returned. The operators' argument
// names differ between libtorch versions (1.13's are "_0", "_1", ...), their order does not, so
// the reader goes by position relative to the process group. Needs libtorch's c10d headers, so
// only distributed.hpp includes it; it installs the reader for the observer.
#include <ATen/record_function.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "torchprobe/capture/collective.hpp"
#include "torchprobe/capture/dispatched_collectives.hpp"

namespace torchprobe::capture {

namespace c10d_reader {

// The object a TorchBind value holds, when its class is `suffix` ("c10d.ProcessGroup"): such an
// object has one slot, a capsule with the C++ object.
template <class T>
c10::intrusive_ptr<T> custom_object(const c10::IValue& v, std::string_view suffix) {
  if (!v.isObject()) return {};
  const std::string type = v.type()->str();
  if (type.size() < suffix.size() || type.compare(type.size() - suffix.size(), suffix.size(), suffix) != 0) return {};
  const auto& object = v.toObjectRef();
  if (object.slots().size() != 1 || !object.getSlot(0).isCapsule()) return {};
  return c10::static_intrusive_pointer_cast<T>(object.getSlot(0).toCapsule());
}

// str() of a torch.distributed.ReduceOp in Python, "RedOpType.SUM": the spelling msprobe writes
// (its own unit test of _analyze_reduce_op expects exactly this for dist.ReduceOp.SUM).
inline nlohmann::ordered_json reduce_op_json(const c10d::ReduceOp& op) {
  static const char* const names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
  const auto k = static_cast<std::size_t>(op.op_);
  const std::string name = k < sizeof names / sizeof names[0] ? names[k] : std::to_string(k);
  return {{"type", "torch.distributed.ReduceOp"}, {"value", "RedOpType." + name}};
}

// msprobe's group item for a process group object (C++'s, or a backend such as ProcessGroupGloo).
inline nlohmann::ordered_json group_json(const void* group, int size) {
  return process_group_json(GroupRanks::of(group, size));
}

// The Python API passes one tensor where the operator takes a list of one (all_reduce(tensor)),
// and one list where it takes a list of lists (all_gather(tensor_list, tensor)).
inline c10::IValue as_python_passes(const c10::IValue& v, bool keep_lists) {
  if (keep_lists || !v.isList()) return v;
  const auto items = v.toListRef();
  return items.size() == 1 ? items[0] : v;
}

inline bool describe(const at::RecordFunction& fn, const DispatchedCollective& kind, Collective& c) {
  const auto inputs = fn.inputs();
  std::size_t g = 0;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  for (; g < inputs.size() && !group; ++g) group = custom_object<c10d::ProcessGroup>(inputs[g], "c10d.ProcessGroup");
  if (!group) return false;
  --g;
  c.api = kind.api;
  if (kind.tensors)
    for (std::size_t k = 0; k < g; ++k) c.args.push_back(as_python_passes(inputs[k], kind.keep_lists));
  if (kind.input_first && c.args.size() == 2) std::swap(c.args[0], c.args[1]);
  std::optional<nlohmann::ordered_json> op;
  std::optional<std::int64_t> peer, tag;
  std::optional<bool> async_op;
  int ints = 0;
  for (std::size_t k = g + 1; k < inputs.size(); ++k) {
    const c10::IValue& v = inputs[k];
    if (auto r = custom_object<c10d::ReduceOp>(v, "c10d.ReduceOp")) {
      op = reduce_op_json(*r);
    } else if (v.isInt()) {
      if (ints == 0 && kind.peer) peer = v.toInt();
      if (ints == kind.tag_int) tag = v.toInt();
      ++ints;
    } else if (v.isBool()) {
      async_op = v.toBool();  // 2.x: broadcast_, scatter_, the *_base_ operators
    }
  }
  // In the order of Python's signatures: all_reduce(tensor, op, group), send(tensor, dst, group, tag).
  if (peer) c.kwarg(kind.peer, int_json(*peer));
  if (op) c.kwarg("op", std::move(*op));
  c.kwarg("group", group_json(group.get(), group->getSize()));
  if (tag) c.kwarg("tag", int_json(*tag));
  if (async_op) c.kwarg("async_op", bool_json(*async_op));
  return true;
}

inline void attach_work(const at::RecordFunction& fn, Collective& c) {
  for (const c10::IValue& v : fn.outputs())
    if (auto work = custom_object<c10d::Work>(v, "c10d.Work")) {
      c.completed = [work] { return work->isCompleted(); };
      return;
    }
}

inline bool install() {
  static const DispatchedReader reader{&describe, &attach_work};
  dispatched_reader().store(&reader, std::memory_order_release);
  return true;
}

}  // namespace c10d_reader

// Installed in every program that includes distributed.hpp, before main() runs.
inline const bool c10d_reader_installed = c10d_reader::install();

}  // namespace torchprobe::capture

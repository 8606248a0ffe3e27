#pragma once
// Collectives through the dispatcher, as the distributed test calls them on either libtorch: on 2.x
// the methods of a c10d::ProcessGroup (which wraps a Gloo backend), on 1.13 the functions of
// c10d::ops over the Gloo group itself. A header of its own because its includes depend on the
// version, and the unity build hoists a source's #include lines out of their #if.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR < 2
#include <torch/csrc/distributed/c10d/Ops.hpp>
#endif

#include <vector>

namespace tptest::dispatch {

using Group = c10::intrusive_ptr<c10d::ProcessGroup>;
using Tensors = std::vector<at::Tensor>;
using TensorLists = std::vector<std::vector<at::Tensor>>;

// The one difference between the versions: a method of the group, or a function of c10d::ops.
#if TORCH_VERSION_MAJOR >= 2
#define TPTEST_C10D(op, pg, ...) (pg)->op(__VA_ARGS__)
inline Group dispatching(const c10::intrusive_ptr<c10d::Store>& store,
                         const c10::intrusive_ptr<c10d::ProcessGroupGloo>& gloo) {
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, gloo->getRank(), gloo->getSize());
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  return pg;
}
inline auto d_barrier(const Group& pg) { return pg->barrier(); }
#else
#define TPTEST_C10D(op, pg, ...) c10d::ops::op(pg, __VA_ARGS__)
inline Group dispatching(const c10::intrusive_ptr<c10d::Store>&,
                         const c10::intrusive_ptr<c10d::ProcessGroupGloo>& gloo) {
  return gloo;
}
inline auto d_barrier(const Group& pg) { return c10d::ops::barrier(pg); }
#endif

template <class Options>
Options rooted_at(int rank) {
  Options o;
  o.rootRank = rank;
  return o;
}

inline auto d_allreduce(const Group& pg, Tensors t) { return TPTEST_C10D(allreduce, pg, t); }
inline auto d_broadcast(const Group& pg, Tensors t, int src) {
  return TPTEST_C10D(broadcast, pg, t, rooted_at<c10d::BroadcastOptions>(src));
}
inline auto d_allgather(const Group& pg, TensorLists out, Tensors in) { return TPTEST_C10D(allgather, pg, out, in); }
inline auto d_send(const Group& pg, Tensors t, int dst, int tag) { return TPTEST_C10D(send, pg, t, dst, tag); }
inline auto d_recv(const Group& pg, Tensors t, int src, int tag) { return TPTEST_C10D(recv, pg, t, src, tag); }
inline auto d_reduce(const Group& pg, Tensors t, int dst) {
  return TPTEST_C10D(reduce, pg, t, rooted_at<c10d::ReduceOptions>(dst));
}
inline auto d_gather(const Group& pg, TensorLists out, Tensors in, int dst) {
  return TPTEST_C10D(gather, pg, out, in, rooted_at<c10d::GatherOptions>(dst));
}
inline auto d_scatter(const Group& pg, Tensors out, TensorLists in, int src) {
  return TPTEST_C10D(scatter, pg, out, in, rooted_at<c10d::ScatterOptions>(src));
}

#undef TPTEST_C10D

}  // namespace tptest::dispatch

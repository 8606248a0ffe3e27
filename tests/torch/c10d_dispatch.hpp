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

#if TORCH_VERSION_MAJOR >= 2
using Group = c10::intrusive_ptr<c10d::ProcessGroup>;
inline Group dispatching(const c10::intrusive_ptr<c10d::Store>& store,
                         const c10::intrusive_ptr<c10d::ProcessGroupGloo>& gloo) {
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, gloo->getRank(), gloo->getSize());
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  return pg;
}
inline auto d_allreduce(const Group& pg, std::vector<at::Tensor> t) { return pg->allreduce(t); }
inline auto d_broadcast(const Group& pg, std::vector<at::Tensor> t, int src) {
  c10d::BroadcastOptions o;
  o.rootRank = src;
  return pg->broadcast(t, o);
}
inline auto d_allgather(const Group& pg, std::vector<std::vector<at::Tensor>> out, std::vector<at::Tensor> in) {
  return pg->allgather(out, in);
}
inline auto d_send(const Group& pg, std::vector<at::Tensor> t, int dst, int tag) { return pg->send(t, dst, tag); }
inline auto d_recv(const Group& pg, std::vector<at::Tensor> t, int src, int tag) { return pg->recv(t, src, tag); }
inline auto d_barrier(const Group& pg) { return pg->barrier(); }
inline auto d_reduce(const Group& pg, std::vector<at::Tensor> t, int dst) {
  c10d::ReduceOptions o;
  o.rootRank = dst;
  return pg->reduce(t, o);
}
inline auto d_gather(const Group& pg, std::vector<std::vector<at::Tensor>> out, std::vector<at::Tensor> in, int dst) {
  c10d::GatherOptions o;
  o.rootRank = dst;
  return pg->gather(out, in, o);
}
inline auto d_scatter(const Group& pg, std::vector<at::Tensor> out, std::vector<std::vector<at::Tensor>> in, int src) {
  c10d::ScatterOptions o;
  o.rootRank = src;
  return pg->scatter(out, in, o);
}
#else
using Group = c10::intrusive_ptr<c10d::ProcessGroup>;
inline Group dispatching(const c10::intrusive_ptr<c10d::Store>&,
                         const c10::intrusive_ptr<c10d::ProcessGroupGloo>& gloo) {
  return gloo;
}
inline auto d_allreduce(const Group& pg, std::vector<at::Tensor> t) { return c10d::ops::allreduce(pg, t); }
inline auto d_broadcast(const Group& pg, std::vector<at::Tensor> t, int src) {
  c10d::BroadcastOptions o;
  o.rootRank = src;
  return c10d::ops::broadcast(pg, t, o);
}
inline auto d_allgather(const Group& pg, std::vector<std::vector<at::Tensor>> out, std::vector<at::Tensor> in) {
  return c10d::ops::allgather(pg, out, in);
}
inline auto d_send(const Group& pg, std::vector<at::Tensor> t, int dst, int tag) {
  return c10d::ops::send(pg, t, dst, tag);
}
inline auto d_recv(const Group& pg, std::vector<at::Tensor> t, int src, int tag) {
  return c10d::ops::recv(pg, t, src, tag);
}
inline auto d_barrier(const Group& pg) { return c10d::ops::barrier(pg); }
inline auto d_reduce(const Group& pg, std::vector<at::Tensor> t, int dst) {
  c10d::ReduceOptions o;
  o.rootRank = dst;
  return c10d::ops::reduce(pg, t, o);
}
inline auto d_gather(const Group& pg, std::vector<std::vector<at::Tensor>> out, std::vector<at::Tensor> in, int dst) {
  c10d::GatherOptions o;
  o.rootRank = dst;
  return c10d::ops::gather(pg, out, in, o);
}
inline auto d_scatter(const Group& pg, std::vector<at::Tensor> out, std::vector<std::vector<at::Tensor>> in, int src) {
  c10d::ScatterOptions o;
  o.rootRank = src;
  return c10d::ops::scatter(pg, out, in, o);
}
#endif

}  // namespace tptest::dispatch

#pragma once
// Collectives in the dump, as msprobe names them: "Distributed.all_reduce.{n}.forward" with the
// tensors before the collective (input_args), its keyword arguments (op, group, src/dst, tag,
// async_op) and, as msprobe's output, the same arguments after it, then the keyword values.
//
//   #include <torchprobe/distributed.hpp>
//   namespace dist = torchprobe::dist;
//   dist::all_reduce(pg, grad);                       // waits, as torch.distributed.all_reduce
//   auto work = dist::all_reduce(pg, grad, c10d::ReduceOp::SUM, /*async_op=*/true);
//   ...                                               // overlap: the probe does not wait
//   work.wait();                                      // the entry's output is read now
//
// Two ways in, one entry per call:
//  - Calls that go through the dispatcher are recorded as they are, once this header is included
//    anywhere in the program: on libtorch 2.x every method of a c10d::ProcessGroup
//    (pg->allreduce(tensors)->wait()), on 1.13 the functions of c10d::ops. Their output is read
//    when a later call finds the work completed, or at stop() (no output if it is still running).
//  - A backend's methods called directly (ProcessGroupGloo on 1.13, a Backend on 2.x) are virtual
//    calls that RecordFunction does not see: the wrappers below record them. With no debugger
//    started a wrapper is the call itself plus one atomic load.
// The probe adds no collective and no synchronisation: a wrapper's output is read when the
// caller's own wait() returns (or, for a Work dropped without wait(), if its work had completed
// by then; else the entry has no output). `pg` is any c10::intrusive_ptr to a process group or
// backend (anything with allreduce, broadcast, allgather, reduce_scatter, send, recv, barrier as
// c10d's). The group is recorded as msprobe's {"type": "torch.ProcessGroup", "group_ranks": [...],
// "group_id": crc32}: a subgroup's global ranks are those given to set_group_ranks(), else
// 0 .. size-1. The ops that Gloo's own threads run inside a collective are not recorded.
// Needs libtorch built with distributed support (USE_DISTRIBUTED; Debian's is); not included by
// torchprobe.hpp.
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "torchprobe/capture/api_observer.hpp"
#include "torchprobe/capture/c10d_reader.hpp"
#include "torchprobe/capture/collective.hpp"
#include "torchprobe/io/files.hpp"
#include "torchprobe/io/rank_digest.hpp"

namespace torchprobe::dist {

// What a collective returns: the backend's work, and the entry that its wait() completes.
class Work {
 public:
  Work() = default;
  Work(c10::intrusive_ptr<c10d::Work> work, capture::Collective c, std::shared_ptr<capture::ApiHandler> handler,
       std::unique_ptr<capture::CallContext> ctx)
      : work_(std::move(work)), c_(std::move(c)), handler_(std::move(handler)), ctx_(std::move(ctx)) {}
  Work(Work&&) noexcept = default;
  Work& operator=(Work&& other) noexcept {
    if (this != &other) {
      finish(/*waited=*/false);
      work_ = std::move(other.work_);
      c_ = std::move(other.c_);
      handler_ = std::move(other.handler_);
      ctx_ = std::move(other.ctx_);
    }
    return *this;
  }
  ~Work() { finish(/*waited=*/false); }

  // The backend's wait(); then the entry's output is recorded.
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {  // 0: no timeout
    const bool ok = work_ ? work_->wait(timeout) : true;
    finish(/*waited=*/true);
    return ok;
  }
  const c10::intrusive_ptr<c10d::Work>& work() const { return work_; }

 private:
  void finish(bool waited) noexcept {
    if (!ctx_) return;
    try {
      c_.ended = waited || (work_ && work_->isCompleted());
      handler_->on_collective_end(c_, *ctx_);
    } catch (...) {  // the probe never fails the training step
    }
    ctx_.reset();
    handler_.reset();
  }

  c10::intrusive_ptr<c10d::Work> work_;
  capture::Collective c_;
  std::shared_ptr<capture::ApiHandler> handler_;
  std::unique_ptr<capture::CallContext> ctx_;
};

namespace details {

template <class PG>
nlohmann::ordered_json group_of(const c10::intrusive_ptr<PG>& pg) {
  return capture::c10d_reader::group_json(pg.get(), pg->getSize());
}

using capture::c10d_reader::reduce_op_json;

// Marks the wrapper's call on this thread, so that libtorch 2.x's dispatcher operator under it is
// not recorded a second time.
struct WrapperCall {
  bool outer = !capture::wrapper_running();
  WrapperCall() { capture::wrapper_running() = true; }
  ~WrapperCall() {
    if (outer) capture::wrapper_running() = false;
  }
};

inline c10::IValue tensor_list(const std::vector<at::Tensor>& tensors) { return c10::List<at::Tensor>(tensors); }

// Records the start (when a debugger runs), runs `call` (which returns the backend's work), and
// waits unless the caller asked for async_op.
template <class Describe, class Call>
Work run(Describe&& describe, Call&& call, bool async_op) {
  std::shared_ptr<capture::ApiHandler> handler = capture::ApiObserver::active();
  capture::Collective c;
  std::unique_ptr<capture::CallContext> ctx;
  if (handler) {
    try {
      describe(c);
      c.kwarg("async_op", capture::bool_json(async_op));
      ctx = handler->on_collective_start(c);
    } catch (...) {  // the probe never fails the training step
      ctx.reset();
    }
  }
  if (!ctx) handler.reset();
  c10::intrusive_ptr<c10d::Work> backend_work;
  {
    WrapperCall marked;
    backend_work = call();
  }
  Work work(std::move(backend_work), std::move(c), std::move(handler), std::move(ctx));
  if (!async_op) work.wait();
  return work;
}

}  // namespace details

// The global ranks of a subgroup's members, in its own rank order (what new_group(ranks) was given
// in Python): its collectives then record them as group_ranks. Register the object that the
// collectives are called on (the c10d::ProcessGroup on 2.x, or the backend). Throws
// std::invalid_argument when `ranks` does not have one rank per member of the group.
template <class PG>
void set_group_ranks(const c10::intrusive_ptr<PG>& pg, std::vector<std::int64_t> ranks) {
  if (ranks.size() != static_cast<std::size_t>(pg->getSize()))
    throw std::invalid_argument("torchprobe::dist::set_group_ranks: " + std::to_string(ranks.size()) +
                                " ranks given for a group of " + std::to_string(pg->getSize()) +
                                " members; give one global rank per member");
  capture::GroupRanks::set(pg.get(), std::move(ranks));
}

template <class PG>
Work all_reduce(const c10::intrusive_ptr<PG>& pg, const at::Tensor& tensor, c10d::ReduceOp op = c10d::ReduceOp::SUM,
                bool async_op = false) {
  return details::run(
      [&](capture::Collective& c) {
        c.api = "all_reduce";
        c.args = {tensor};
        c.kwarg("op", details::reduce_op_json(op));
        c.kwarg("group", details::group_of(pg));
      },
      [&] {
        std::vector<at::Tensor> tensors{tensor};
        c10d::AllreduceOptions opts;
        opts.reduceOp = op;
        return pg->allreduce(tensors, opts);
      },
      async_op);
}

template <class PG>
Work broadcast(const c10::intrusive_ptr<PG>& pg, const at::Tensor& tensor, std::int64_t src, bool async_op = false) {
  return details::run(
      [&](capture::Collective& c) {
        c.api = "broadcast";
        c.args = {tensor};
        c.kwarg("src", capture::int_json(src));
        c.kwarg("group", details::group_of(pg));
      },
      [&] {
        std::vector<at::Tensor> tensors{tensor};
        c10d::BroadcastOptions opts;
        opts.rootRank = src;
        return pg->broadcast(tensors, opts);
      },
      async_op);
}

// torch.distributed.all_gather(tensor_list, tensor): `outputs` receives every rank's `tensor`.
template <class PG>
Work all_gather(const c10::intrusive_ptr<PG>& pg, const std::vector<at::Tensor>& outputs, const at::Tensor& tensor,
                bool async_op = false) {
  return details::run(
      [&](capture::Collective& c) {
        c.api = "all_gather";
        c.args = {details::tensor_list(outputs), tensor};
        c.kwarg("group", details::group_of(pg));
      },
      [&] {
        std::vector<std::vector<at::Tensor>> out{outputs};
        std::vector<at::Tensor> in{tensor};
        return pg->allgather(out, in);
      },
      async_op);
}

// torch.distributed.reduce_scatter(output, input_list, op).
template <class PG>
Work reduce_scatter(const c10::intrusive_ptr<PG>& pg, const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                    c10d::ReduceOp op = c10d::ReduceOp::SUM, bool async_op = false) {
  return details::run(
      [&](capture::Collective& c) {
        c.api = "reduce_scatter";
        c.args = {output, details::tensor_list(inputs)};
        c.kwarg("op", details::reduce_op_json(op));
        c.kwarg("group", details::group_of(pg));
      },
      [&] {
        std::vector<at::Tensor> out{output};
        std::vector<std::vector<at::Tensor>> in{inputs};
        c10d::ReduceScatterOptions opts;
        opts.reduceOp = op;
        return pg->reduce_scatter(out, in, opts);
      },
      async_op);
}

// torch.distributed.send / isend (async_op) and recv / irecv.
template <class PG>
Work send(const c10::intrusive_ptr<PG>& pg, const at::Tensor& tensor, std::int64_t dst, std::int64_t tag = 0,
          bool async_op = false) {
  return details::run(
      [&](capture::Collective& c) {
        c.api = "send";
        c.args = {tensor};
        c.kwarg("dst", capture::int_json(dst));
        c.kwarg("group", details::group_of(pg));
        c.kwarg("tag", capture::int_json(tag));
      },
      [&] {
        std::vector<at::Tensor> tensors{tensor};
        return pg->send(tensors, static_cast<int>(dst), static_cast<int>(tag));
      },
      async_op);
}

template <class PG>
Work recv(const c10::intrusive_ptr<PG>& pg, const at::Tensor& tensor, std::int64_t src, std::int64_t tag = 0,
          bool async_op = false) {
  return details::run(
      [&](capture::Collective& c) {
        c.api = "recv";
        c.args = {tensor};
        c.kwarg("src", capture::int_json(src));
        c.kwarg("group", details::group_of(pg));
        c.kwarg("tag", capture::int_json(tag));
      },
      [&] {
        std::vector<at::Tensor> tensors{tensor};
        return pg->recv(tensors, static_cast<int>(src), static_cast<int>(tag));
      },
      async_op);
}

template <class PG>
Work barrier(const c10::intrusive_ptr<PG>& pg, bool async_op = false) {
  return details::run(
      [&](capture::Collective& c) {
        c.api = "barrier";
        c.kwarg("group", details::group_of(pg));
      },
      [&] { return pg->barrier(); }, async_op);
}

// Rank 0 of `group` gathers every member's ranks_digest.bin of a step (what `torchprobe ranks`
// reads of each rank: io/rank_digest.hpp), for a job whose ranks write to disks of their own. Call
// it on every member once the step is written (after step() and wait_written()), with `rank_dir`
// the member's directory of that step (Debugger::directory() before step()): rank 0 writes
// `out`/step{step}/rank{r}/ranks_digest.bin for each member r (its rank in `group`: give the world
// group), and returns how many; the others return 0. A member without a digest sends none. The
// group must take CPU tensors (Gloo; for NCCL, a Gloo group of the same ranks). Not recorded: call
// it while no capture runs.
template <class PG>
int gather_rank_digests(const c10::intrusive_ptr<PG>& group, const std::string& rank_dir, const std::string& out,
                        std::int64_t step) {
  std::string bytes;
  {
    std::ifstream in(rank_dir + "/" + io::kRankDigestFile, std::ios::binary);
    if (in) bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const int world = group->getSize();
  std::vector<at::Tensor> size{at::full({1}, static_cast<std::int64_t>(bytes.size()), at::kLong)};
  std::vector<std::vector<at::Tensor>> sizes(1);
  for (int r = 0; r < world; ++r) sizes[0].push_back(at::zeros({1}, at::kLong));
  group->allgather(sizes, size)->wait();
  std::int64_t most = 1;
  for (const at::Tensor& t : sizes[0]) most = std::max(most, t.item<std::int64_t>());
  std::vector<at::Tensor> mine{at::zeros({most}, at::kByte)};
  if (!bytes.empty()) std::memcpy(mine[0].data_ptr(), bytes.data(), bytes.size());
  std::vector<std::vector<at::Tensor>> all(1);
  for (int r = 0; r < world; ++r) all[0].push_back(at::zeros({most}, at::kByte));
  group->allgather(all, mine)->wait();
  if (group->getRank() != 0) return 0;
  int written = 0;
  for (int r = 0; r < world; ++r) {
    const std::int64_t n = sizes[0][static_cast<std::size_t>(r)].item<std::int64_t>();
    if (n <= 0) continue;
    const std::string dir = out + "/step" + std::to_string(step) + "/rank" + std::to_string(r);
    io::create_directories_for("create the digest directory", dir);
    io::write_file_atomic(dir + "/" + io::kRankDigestFile,
                          std::string_view(static_cast<const char*>(all[0][static_cast<std::size_t>(r)].data_ptr()),
                                           static_cast<std::size_t>(n)));
    ++written;
  }
  return written;
}

}  // namespace torchprobe::dist

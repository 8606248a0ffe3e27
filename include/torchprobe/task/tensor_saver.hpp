#pragma once
// TensorSaver: the part of a task that puts tensors into dump_tensor_data/. A task holds one and
// calls stage() from describe() for each tensor it wants saved; the file is written only if the
// task keeps the entry (docs/io.md describes the whole path).
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "torchprobe/core/site.hpp"
#include "torchprobe/config/types.hpp"
#include "torchprobe/core/names.hpp"
#include "torchprobe/core/probe_guard.hpp"
#include "torchprobe/core/record.hpp"
#include "torchprobe/io/files.hpp"
#include "torchprobe/io/tensor_writer.hpp"

namespace torchprobe {

// A contiguous CPU copy of `t` that owns its storage: what a .pt file must hold (a view would carry
// its whole base storage, a conjugate or negative view its unresolved bits). Large tensors are
// copied into the reservation's (reused) buffer.
inline at::Tensor snapshot_for_file(const at::Tensor& t, io::Reservation& memory) {
  ProbeGuard guard;
  at::Tensor d = t.detach().resolve_conj().resolve_neg();
  at::Tensor out = memory.take_buffer(d.sizes(), d.scalar_type());
  if (out.defined()) return out.copy_(d);
  if (!d.device().is_cpu())
    return d.to(at::kCPU, d.scalar_type(), /*non_blocking=*/false, /*copy=*/true, at::MemoryFormat::Contiguous);
  return d.clone(at::MemoryFormat::Contiguous);
}
// The same with the ordinary allocator (no reserved buffer).
inline at::Tensor snapshot_for_file(const at::Tensor& t) {
  io::Reservation none;
  return snapshot_for_file(t, none);
}

// async_dump: a CUDA tensor's copy to the host is queued on its stream, into pinned memory, and not
// waited for (no host synchronisation); wait() is called when the step is written. An event marks
// the end of the copy on the stream.
class StreamCopy final : public PendingCopy {
 public:
  explicit StreamCopy(const c10::Device& device) : event_(device.type()) {
    event_.record(c10::impl::getDeviceGuardImpl(device.type())->getStream(device));
  }
  void wait() override {
    while (!event_.query()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }

 private:
  c10::Event event_;
};

// The snapshot of `t` for a file written at the step's end (async_dump): CUDA tensors are copied
// without waiting (`copying` says when the copy is done), others as snapshot_for_file does. A device
// that cannot do it (no pinned memory, no events) gets the waiting copy.
inline at::Tensor snapshot_at_flush(const at::Tensor& t, io::Reservation& memory,
                                    std::shared_ptr<PendingCopy>& copying) {
  if (!t.is_cuda()) return snapshot_for_file(t, memory);
  ProbeGuard guard;
  const at::Tensor d = t.detach().resolve_conj().resolve_neg();
  try {
    at::Tensor host = at::empty(d.sizes(), d.options().device(at::kCPU).pinned_memory(true));
    host.copy_(d, /*non_blocking=*/true);
    copying = std::make_shared<StreamCopy>(d.device());
    return host;
  } catch (const std::exception&) {
    copying.reset();
    return snapshot_for_file(t, memory);
  }
}

// A task that saves tensors is handed one by the Recorder, which owns the writer behind it: the
// snapshots' memory budget (max_pending_mb) and the files' destination are one writer, whatever
// the task.
class TensorSaver {
 public:
  TensorSaver() = default;  // saves nothing
  // Saves through `writer` (its budget bounds the snapshots waiting for it).
  // `at_flush` (async_dump): the files are handed to the writer when the step is written, and
  // device tensors are copied to the host without waiting.
  TensorSaver(std::shared_ptr<io::TensorWriter> writer, bool at_flush)
      : writer_(std::move(writer)), at_flush_(at_flush) {}

  bool enabled() const { return writer_ != nullptr; }
  const std::shared_ptr<io::TensorWriter>& writer() const { return writer_; }

  // Snapshots `t` now for the file "{record.name}.{site.file_key}.pt" (msprobe's name; without the
  // key when it is empty, as for save()'s "y.0.debug.pt") and writes its name into item["data_name"],
  // after "requires_grad" and before "md5" as msprobe orders them. May wait for the writer when the
  // pending-memory cap is reached. Tensors without strided data (sparse, meta) get no file.
  void stage(const at::Tensor& t, const Site& site, Record& record, nlohmann::ordered_json& item) const {
    if (!writer_ || !t.defined() || t.layout() != c10::kStrided || t.is_meta() || !t.has_storage()) return;
    const std::size_t bytes = static_cast<std::size_t>(t.numel()) * t.element_size();
    io::Reservation memory = writer_->reserve(bytes);
    std::shared_ptr<PendingCopy> copying;
    at::Tensor copy = at_flush_ ? snapshot_at_flush(t, memory, copying) : snapshot_for_file(t, memory);
    std::string name = io::safe_component(tensor_file_name(record.name, site.file_key));
    nlohmann::ordered_json md5;
    const bool has_md5 = item.contains("md5");
    if (has_md5) {
      md5 = std::move(item["md5"]);
      item.erase("md5");
    }
    item["data_name"] = name;
    if (has_md5) item["md5"] = std::move(md5);
    record.saves.push_back(PendingSave{std::make_shared<io::Reservation>(std::move(memory)), std::move(name),
                                       std::move(copy), at_flush_, std::move(copying)});
  }

  // For a task that decides when the entry ends whether its tensors are saved (overflow_check, the
  // live check): keeps a reference to `t`, no copy, and returns the file's name ("" for no file).
  // The one copy made now is of the tensor an in-place op is about to overwrite (its first
  // argument), on its device, so with no host synchronisation either. snapshot_references() turns
  // the kept entry's references into the snapshots the writer expects.
  std::string stage_reference(const at::Tensor& t, const Site& site, Record& record) const {
    if (!writer_ || !t.defined() || t.layout() != c10::kStrided || t.is_meta() || !t.has_storage()) return {};
    std::string name = io::safe_component(tensor_file_name(record.name, site.file_key));
    PendingSave save{nullptr, name, t};
    save.pointer = site.pointer;
    if (site.pointer == "/input_args/0" && is_inplace_api_forward(record.name)) {
      ProbeGuard guard;
      if (t.device().is_cpu()) {
        save.memory =
            std::make_shared<io::Reservation>(writer_->reserve(static_cast<std::size_t>(t.numel()) * t.element_size()));
        save.data = snapshot_for_file(t);
      } else {
        save.data = t.detach().clone(at::MemoryFormat::Contiguous);
      }
    }
    record.saves.push_back(std::move(save));
    return name;
  }
  // A save that already holds memory from the writer's budget is a snapshot already.
  void snapshot_references(Record& r) const {
    for (PendingSave& s : r.saves) {
      if (s.memory || !s.data.defined()) continue;
      s.memory = std::make_shared<io::Reservation>(
          writer_->reserve(static_cast<std::size_t>(s.data.numel()) * s.data.element_size()));
      s.data = snapshot_for_file(s.data);
    }
  }

  // "Aten.add_.0.forward": an in-place op's forward entry.
  static bool is_inplace_api_forward(const std::string& name) {
    if (name.compare(0, 5, "Aten.") != 0) return false;
    const std::size_t end = name.find('.', 5);
    if (end == std::string::npos || end == 5) return false;
    return is_inplace_op(std::string_view(name).substr(5, end - 5)) && name.size() > 8 &&
           name.compare(name.size() - 8, 8, ".forward") == 0;
  }

 private:
  std::shared_ptr<io::TensorWriter> writer_;
  bool at_flush_ = false;
};

}  // namespace torchprobe

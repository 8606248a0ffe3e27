#pragma once
// One dump.json entry on its way from a capture callback to a sink. Vocabulary only: the writer
// and the memory budget its tensor files use, and the text writer, are declared, not included
// (io/tensor_writer.hpp, io/memory_budget.hpp, io/json_text.hpp).
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "torchprobe/core/call_stack.hpp"

namespace torchprobe {

namespace io {
class TensorWriter;
class Reservation;
class JsonText;
}  // namespace io

// A copy into a host snapshot that a device may still be running (async_dump): wait() returns once
// the snapshot holds the values.
class PendingCopy {
 public:
  virtual ~PendingCopy() = default;
  virtual void wait() = 0;
};

// One tensor file an entry names in "data_name", written only if the task keeps the entry
// (docs/io.md describes the path), by the Recorder's writer. Member order matters: `data` is freed before
// `memory` returns its bytes to the writer's budget.
struct PendingSave {
  std::shared_ptr<io::Reservation> memory;  // the budget `data` holds; null when it holds none
  std::string file_name;                    // "Aten.add.0.forward.input.0.pt", a safe path component
  at::Tensor data;                          // contiguous CPU snapshot taken when the tensor was described
  // async_dump: the file goes to the writer when the step is written (stop()/step()), once
  // `copying` (the device-to-host copy into `data`, null when there is none) is done.
  bool at_flush = false;
  std::shared_ptr<PendingCopy> copying{};
  // Where the tensor's item is in the body, for a task that names the file only once it keeps the
  // entry (the live check); "" when the item names it already.
  std::string pointer{};
};

// Statistics still on the device: `values` is the float64 [max, min, mean, norm] tensor, and
// `pointer` (a JSON pointer into Record::body) is the tensor item whose four keys it fills.
struct PendingStats {
  std::string pointer;
  at::Tensor values;
  at::ScalarType dtype;
  bool zero_dim;
};

struct TensorSummary;  // core/tensor_json.hpp

// What a reader of a compact body is shown of each of its items (DeferredBody::visit_items): the
// JSON pointer the item will have in the body, whether it is under "output", and the item -- a
// tensor's summary, or JSON. The live check judges entries this way, without making them JSON.
class DeferredItems {
 public:
  virtual void summary(const std::string& pointer, bool output, const TensorSummary& s) = 0;
  virtual void json(const std::string& pointer, bool output, const nlohmann::ordered_json& item) = 0;

 protected:
  ~DeferredItems() = default;
};

// Members of an entry's body that were captured in compact form and become JSON only when the
// entry is written (API calls under the statistics task: capture/captured_call.hpp).
class DeferredBody {
 public:
  virtual ~DeferredBody() = default;
  virtual void append_to(nlohmann::ordered_json& body) const = 0;
  // Each item, as DeferredItems says. This default makes the members JSON first.
  virtual void visit_items(DeferredItems& to) const {
    nlohmann::ordered_json body = nlohmann::ordered_json::object();
    append_to(body);
    for (const auto& kv : body.items()) to.json("/" + kv.key(), kv.key() == "output", kv.value());
  }
  // The same members written as text, the body object's own braces excepted: `depth` is the body
  // object's, `count` the number of members written before (and after: it is advanced).
  virtual void write_members(io::JsonText& out, int depth, std::size_t& count) const = 0;
};

// A checksum (summary_mode md5) still being computed by a worker: `pointer` is the tensor item
// whose "md5" it fills when the step is written.
struct PendingChecksum {
  std::string pointer;
  std::shared_future<std::string> value;
};

struct Record {
  std::string name;         // "Aten.addmm.0.forward"
  std::uint64_t order = 0;  // position in dump.json: entries appear in the order calls began
  // Null until something is put in it (operator[] makes it an object): most entries of a
  // statistics dump keep theirs in `deferred`, and an empty object would cost an allocation.
  nlohmann::ordered_json body;
  std::vector<PendingStats> pending;
  std::vector<PendingChecksum> pending_checksums;
  // Forward entries: where the user made the call (shared by the entries of one call site).
  std::shared_ptr<const CallStack> stack;
  // construct.json (levels L0 and mix): the enclosing module's entry, "" when at top level.
  std::optional<std::string> parent;
  // Listed in construct.json (and stack.json) only, with no dump.json item: a container module
  // known only through the modules it encloses, or any entry of the structure task.
  bool construct_only = false;
  // Tensor files this entry names in "data_name", snapshotted when described and written only
  // if the task keeps the entry (docs/io.md explains the path they take).
  std::vector<PendingSave> saves;
  // The rest of `body`, still in compact form (null when the body is all JSON already).
  std::shared_ptr<const DeferredBody> deferred;

  bool has_content() const { return deferred != nullptr || !body.empty(); }

  // The entry's body as dump.json shows it.
  nlohmann::ordered_json json_body() const { return json_of(body, deferred.get()); }
  // The same from a body and its compact part kept apart (the journal's lines).
  static nlohmann::ordered_json json_of(const nlohmann::ordered_json& body, const DeferredBody* deferred) {
    if (!deferred) return body;
    nlohmann::ordered_json j = body.is_null() ? nlohmann::ordered_json::object() : body;
    deferred->append_to(j);
    return j;
  }
  // Turns the compact part into JSON in place: for code that edits or reads `body` itself.
  void materialize() {
    if (!deferred) return;
    if (body.is_null()) body = nlohmann::ordered_json::object();
    deferred->append_to(body);
    deferred.reset();
  }
};

}  // namespace torchprobe

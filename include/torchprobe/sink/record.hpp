#pragma once
// One dump.json entry on its way from a capture callback to a sink.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "../io/stack_trace.hpp"
#include "../io/tensor_writer.hpp"

namespace torchprobe {

// Statistics still on the device: `values` is the float64 [max, min, mean, norm] tensor, and
// `pointer` (a JSON pointer into Record::body) is the tensor item whose four keys it fills.
struct PendingStats {
  std::string pointer;
  at::Tensor values;
  at::ScalarType dtype;
  bool zero_dim;
};

struct Record {
  std::string name;              // "Aten.addmm.0.forward"
  std::uint64_t order = 0;       // position in dump.json: entries appear in the order calls began
  nlohmann::ordered_json body = nlohmann::ordered_json::object();
  std::vector<PendingStats> pending;
  std::optional<io::CallStack> stack;   // forward entries: where the user made the call
  // construct.json (levels L0 and mix): the enclosing module's entry, "" when at top level.
  std::optional<std::string> parent;
  // Tensor files this entry names in "data_name", snapshotted when described and written only
  // if the task keeps the entry (io/tensor_writer.hpp explains the path they take).
  std::vector<io::PendingSave> saves;
};

}  // namespace torchprobe

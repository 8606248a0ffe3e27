#pragma once
// save(value, name): msprobe's single-point save (level "debug"; msprobe's PrecisionDebugger.save).
//
// Each call writes the entry "{name}.{count}.debug" of debug.json (count per name per step) with
// the value encoded as msprobe does: tensors as the task describes them (statistics; with the tensor
// task also the file "{name}.{count}.debug[.{index path}].pt"), bool/int/float/str as
// {"type", "value"}, lists and dicts as JSON lists and objects, anything else null. With
// save_backward, "{name}_grad.{count}.debug" follows it at once, holding the same structure with
// every leaf null; a hook on each tensor that requires grad fills its leaf when the gradient arrives
// (files "{name}_grad.{count}.debug[.{index path}].pt").
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "torchprobe/capture/value_encoder.hpp"
#include "torchprobe/core/names.hpp"
#include "torchprobe/core/probe_guard.hpp"
#include "torchprobe/details/recorder.hpp"
#include "torchprobe/core/save_value.hpp"

namespace torchprobe::capture {

// A leaf of a saved value: where it sits in the entry's JSON and in the file name.
struct SavedLeaf {
  std::string pointer;  // JSON pointer inside the entry ("" for the value itself)
  std::string key;      // index path for the file name ("" for the value itself, "a", "b.0", ...)

  SavedLeaf child(const std::string& token) const {
    return {pointer + "/" + pointer_token(token), key.empty() ? token : key + "." + token};
  }
  Site site() const { return {pointer, key}; }
};

// Turns a SaveValue into msprobe's JSON; tensors go to `describe(tensor, site)`, and each tensor
// that requires grad is listed in *needs_grad.
template <class Describe>
nlohmann::ordered_json encode_saved(const SaveValue& v, const SavedLeaf& at, Describe& describe,
                                    std::vector<std::pair<SavedLeaf, at::Tensor>>* needs_grad, int depth = 0) {
  if (depth > kMaxDepth) return nullptr;
  switch (v.kind()) {
    case SaveValue::Kind::None: return nullptr;
    case SaveValue::Kind::Tensor:
      if (needs_grad && v.tensor().requires_grad()) needs_grad->emplace_back(at, v.tensor());
      return describe(v.tensor(), at.site());
    case SaveValue::Kind::Bool: return capture::typed("bool", v.as_bool());
    case SaveValue::Kind::Int: return capture::typed("int", v.as_int());
    case SaveValue::Kind::Float: return capture::typed("float", v.as_float());
    case SaveValue::Kind::String: return capture::typed("str", v.as_string());
    case SaveValue::Kind::List: {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for (std::size_t k = 0; k < v.items().size(); ++k)
        out.push_back(encode_saved(v.items()[k], at.child(std::to_string(k)), describe, needs_grad, depth + 1));
      return out;
    }
    case SaveValue::Kind::Dict: {
      nlohmann::ordered_json out = nlohmann::ordered_json::object();
      for (std::size_t k = 0; k < v.items().size(); ++k)
        out[v.keys()[k]] = encode_saved(v.items()[k], at.child(v.keys()[k]), describe, needs_grad, depth + 1);
      return out;
    }
  }
  return nullptr;
}

// The same structure with every leaf null: the gradient entry's placeholder.
inline nlohmann::ordered_json all_null_like(const SaveValue& v, int depth = 0) {
  if (depth > kMaxDepth) return nullptr;
  if (v.kind() == SaveValue::Kind::List) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const SaveValue& e : v.items()) out.push_back(all_null_like(e, depth + 1));
    return out;
  }
  if (v.kind() == SaveValue::Kind::Dict) {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (std::size_t k = 0; k < v.items().size(); ++k) out[v.keys()[k]] = all_null_like(v.items()[k], depth + 1);
    return out;
  }
  return nullptr;
}

template <class TaskT>
class SaveCapture {
 public:
  using Core = torchprobe::details::Recorder<TaskT>;

  // Writes the entries of one save() call into the step's debug.json.
  void save(const std::shared_ptr<Core>& core, const SaveValue& value, const std::string& name, bool save_backward) {
    const std::int64_t count = next_count(name);
    Record r;
    r.name = save_entry_name(name, count);
    r.order = core->debug_entries().next_order();
    std::vector<std::pair<SavedLeaf, at::Tensor>> grads;
    {
      ProbeGuard guard;
      auto describe = [&](const at::Tensor& t, const Site& site) { return core->task().describe(t, site, r); };
      r.body = encode_saved(value, SavedLeaf{}, describe, save_backward ? &grads : nullptr);
    }
    core->commit_debug(std::move(r));
    if (!save_backward) return;

    auto entry = std::make_shared<GradEntry>();
    entry->core = core;
    entry->generation = core->generation();
    entry->name = save_entry_name(name + "_grad", count);
    entry->order = core->debug_entries().next_order();
    entry->body = all_null_like(value);
    {
      Record placeholder;
      placeholder.name = entry->name;
      placeholder.order = entry->order;
      placeholder.body = entry->body;
      core->commit_debug(std::move(placeholder));
    }
    for (auto& [leaf, tensor] : grads) {
      // Hooks stay on the tensor; after step() (or once the debugger is gone) they do nothing.
      tensor.register_hook([entry, leaf = leaf](const at::Tensor& grad) { entry->arrived(leaf, grad); });
    }
  }

  // step(): counts start again at 0.
  void reset() {
    std::lock_guard<std::mutex> lock(mu_);
    counts_.clear();
  }

 private:
  // One gradient entry, filled leaf by leaf as gradients arrive. Each arrival commits the whole
  // entry again under the same name and order, so debug.json (and the journal) always hold the
  // latest state.
  struct GradEntry {
    std::weak_ptr<Core> core;
    std::uint64_t generation = 0;
    std::string name;
    std::uint64_t order = 0;
    std::mutex mu;
    nlohmann::ordered_json body;
    std::vector<PendingStats> pending;       // device statistics of the leaves filled so far
    std::vector<PendingChecksum> checksums;  // and their checksums still being computed

    void arrived(const SavedLeaf& leaf, const at::Tensor& grad) {
      auto c = core.lock();
      if (!c || c->generation() != generation || !grad.defined()) return;
      try {
        std::lock_guard<std::mutex> lock(mu);
        ProbeGuard guard;
        Record r;
        r.name = name;
        r.order = order;
        nlohmann::ordered_json item = c->task().describe(grad, leaf.site(), r, /*gradient=*/true);
        if (leaf.pointer.empty())
          body = std::move(item);
        else
          body[nlohmann::ordered_json::json_pointer(leaf.pointer)] = std::move(item);
        pending.insert(pending.end(), r.pending.begin(), r.pending.end());
        r.pending = pending;
        checksums.insert(checksums.end(), r.pending_checksums.begin(), r.pending_checksums.end());
        r.pending_checksums = checksums;
        r.body = body;
        c->commit_debug(std::move(r));
      } catch (const std::exception& e) {
        c->errors().log("debug_data_collect_backward", name, e);
      }
    }
  };

  std::int64_t next_count(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_[name]++;
  }

  std::mutex mu_;
  std::unordered_map<std::string, std::int64_t> counts_;
};

}  // namespace torchprobe::capture

#pragma once
// The modules open on a thread while module tracking (module_tracking.hpp) follows its calls,
// and the construct.json parents they give the entries made meanwhile.
#include <ATen/core/ivalue.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "torchprobe/capture/backward_probe.hpp"
#include "torchprobe/capture/module_catalog.hpp"
#include "torchprobe/core/record.hpp"

namespace torchprobe::capture {

// What module tracking learns of a call at its start and needs again at its end.
struct ModuleCall {
  bool in_episode = false;  // the call belongs to the open episode
  bool param_only = false;  // all its tensor inputs are the episode's parameters (W.t() and the like)
};

namespace details {

// A container module of the model that no guard marks, known from the modules it encloses: one
// call of it is named in construct.json (forward when inferred, backward when the first backward
// entry inside it is recorded) and has no dump.json entry. module_tracking.hpp says how its calls
// are counted.
struct InferredContainer {
  const ModuleInfo* info = nullptr;
  std::string forward_name, backward_name;
  std::string parent_backward;                 // the enclosing module's backward entry, "" at top level
  std::shared_ptr<InferredContainer> parent;   // the enclosing container when it is inferred too
  std::unordered_set<const ModuleInfo*> seen;  // modules opened inside this call (training thread only)
  std::atomic<bool> backward_listed{false};
};
using InferredChain = std::vector<std::shared_ptr<InferredContainer>>;  // outermost first

// A module forward in progress: an episode of a parameter-owning leaf, or a guarded module.
struct OpenModule {
  const ModuleInfo* info = nullptr;
  Record record;
  std::int64_t index = 0;
  bool admitted = false;
  bool grad_enabled = false;
  std::uint64_t seq_begin = 0;
  std::string parent_backward;  // the enclosing module's backward entry, "" at top level
  std::vector<Edge> input_edges;
  std::unordered_set<const c10::TensorImpl*> inputs_seen, produced, derived;
  std::vector<c10::IValue> last_outputs;
  bool has_main = false;  // a call with a non-parameter input ran in it
  std::uint64_t calls_at_start = 0;
  std::shared_ptr<InferredContainer> inferred_parent;  // set when the parent is an inferred container
  InferredChain inferred;                              // a guard's: the inferred containers open inside it
};

// The modules open on one thread.
struct ThreadModules {
  std::optional<OpenModule> episode;
  std::vector<std::unique_ptr<OpenModule>> guards;  // innermost last
  std::unique_ptr<ModuleInfo> dump_only;            // ScopedModuleDump's module
  std::vector<c10::IValue> last_outputs;            // of the latest outermost call
  std::uint64_t calls = 0;
  std::vector<void*> script_tokens;       // open TorchScript module calls
  InferredChain inferred;                 // the inferred containers open outside any guard
  std::uint64_t inferred_generation = 0;  // the step they belong to
};

}  // namespace details

// The construct.json parents of an entry made by a call on this thread: the innermost open
// module (the episode, for a call in it), "" at top level, nullopt where no module is tracked
// (L1: construct.json stays {}). Computed only when asked: most calls never need them.
class EntryParents {
 public:
  EntryParents(const details::ThreadModules& tm, bool in_episode, bool modules_level)
      : tm_(tm), in_episode_(in_episode), tracked_(modules_level || tm.dump_only) {}

  std::optional<std::string> forward() const {
    if (!tracked_) return std::nullopt;
    if (in_episode_ && tm_.episode) return tm_.episode->record.name;
    if (!tm_.guards.empty()) return tm_.guards.back()->record.name;
    return std::string();
  }
  std::optional<std::string> backward() const {
    if (!tracked_) return std::nullopt;
    if (in_episode_ && tm_.episode) return tm_.episode->info->backward_name(tm_.episode->index);
    if (!tm_.guards.empty()) return tm_.guards.back()->info->backward_name(tm_.guards.back()->index);
    return std::string();
  }

 private:
  const details::ThreadModules& tm_;
  bool in_episode_;
  bool tracked_;
};

}  // namespace torchprobe::capture

#pragma once
// The containers of the model that no guard marks, named in construct.json as the parents of the
// modules inside them (docs/capture.md, "Containers no guard marks").
//
// A module opening on a thread gets as ancestors the containers between it and the innermost open
// guard (or the model given to start()). Without a hook in them, their calls are counted from what
// runs inside: a container's call goes on while the modules that open are inside it and each opens
// once; a module opening again, or a module outside it opening in between, starts its next call.
// That is msprobe's number whenever the container runs each of its modules once per call; a
// container that calls one module twice needs a ModuleGuard.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "torchprobe/capture/module_catalog.hpp"
#include "torchprobe/capture/module_state.hpp"
#include "torchprobe/core/record.hpp"

namespace torchprobe::capture::details {

// `m` opens (its name, parent and parent_backward are set): its parent becomes the innermost
// inferred container, when there is one, and each container that starts a call here gets its
// forward name in construct.json. `Core` is torchprobe::details::Recorder.
template <class Core>
void infer_containers(Core& core, ThreadModules& tm, const ModuleInfo& info, OpenModule& m) {
  OpenModule* guard = tm.guards.empty() ? nullptr : tm.guards.back().get();
  std::vector<const ModuleInfo*> above;  // innermost first
  for (const ModuleInfo* a = info.parent; a; a = a->parent) {
    if (guard && a == guard->info) break;
    above.push_back(a);
  }
  if (guard && !above.empty() && above.back()->parent != guard->info) return;  // not in the guard's tree
  std::reverse(above.begin(), above.end());
  InferredChain& chain = guard ? guard->inferred : tm.inferred;
  if (!guard && tm.inferred_generation != core.generation()) {  // counters start again each step
    chain.clear();
    tm.inferred_generation = core.generation();
  }
  std::size_t kept = 0;
  while (kept < chain.size() && kept < above.size() && chain[kept]->info == above[kept] &&
         !chain[kept]->seen.count(&info))
    ++kept;
  chain.resize(kept);
  for (auto& c : chain) c->seen.insert(&info);
  for (std::size_t k = kept; k < above.size(); ++k) {
    auto c = std::make_shared<InferredContainer>();
    c->info = above[k];
    const std::int64_t n = core.entries().next_index(c->info->counter_key());
    c->forward_name = c->info->forward_name(n);
    c->backward_name = c->info->backward_name(n);
    c->parent = k > 0 ? chain[k - 1] : nullptr;
    c->parent_backward = k > 0 ? chain[k - 1]->backward_name : m.parent_backward;
    c->seen.insert(&info);
    Record r;
    r.name = c->forward_name;
    r.parent = k > 0 ? chain[k - 1]->forward_name : m.record.parent.value_or(std::string());
    r.construct_only = true;
    core.commit_last(std::move(r));
    chain.push_back(std::move(c));
  }
  if (chain.empty()) return;
  m.record.parent = chain.back()->forward_name;
  m.parent_backward = chain.back()->backward_name;
  m.inferred_parent = chain.back();
}

// An inferred container's backward name joins construct.json before the first backward entry
// inside it is committed, after its own enclosing container's.
template <class Core>
void list_backward(Core& core, const std::shared_ptr<InferredContainer>& c) {
  if (!c || c->backward_listed.exchange(true)) return;
  list_backward(core, c->parent);
  Record r;
  r.name = c->backward_name;
  r.parent = c->parent_backward;
  r.construct_only = true;
  core.commit_last(std::move(r));
}

}  // namespace torchprobe::capture::details

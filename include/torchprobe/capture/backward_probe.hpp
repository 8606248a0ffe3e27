#pragma once
// Gradients of one forward region (an ATen call, or a module's forward): the gradients flowing
// into it (w.r.t. its outputs) and out of it (w.r.t. its tensor inputs).
//
// The autograd nodes a region created are those whose sequence numbers fall in
// [sequence at its start, sequence at its end). A pre-hook on the nodes that produced the
// region's outputs sees the gradients w.r.t. those outputs; a post-hook on the nodes whose next
// edges are the region's inputs' gradient edges sees the gradients w.r.t. those inputs. This works
// for composite ops (several nodes), in-place ops (the input's edge is taken before the op ran)
// and outputs that are reshaped later (the hook sits on the output's own node, not on a view's).
//
// Which edges carry an input's gradient depends on what the region is (InputUses): an ATen call's
// argument leaves through one edge (p * p has two arguments and two edges to the same place), a
// module's input through every edge of the region that leads to it (a residual block's input
// feeds conv1 and the skip), and its gradient is their sum, added in the order the engine runs
// the nodes, which is the order autograd's own InputBuffer adds them in, so bit-identical to it.
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "torchprobe/core/probe_guard.hpp"

namespace torchprobe::capture {

using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::variable_list;

// Where the gradient of a forward input will go; an invalid edge for inputs that need none.
inline Edge gradient_edge_of(const at::Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return Edge();
  return torch::autograd::impl::gradient_edge(t);
}

// Receives the gradients as they arrive (on autograd's threads) and the end of the region's
// backward. Calls for one probe never overlap.
class GradientReceiver {
 public:
  virtual ~GradientReceiver() = default;
  virtual void grad_output(std::size_t output_index, const at::Tensor& grad) = 0;  // w.r.t. forward output i
  virtual void grad_input(std::size_t input_index, const at::Tensor& grad) = 0;    // w.r.t. forward input k
  virtual void backward_done() = 0;
};

// How a region's inputs reach its nodes (see the top of this file).
enum class InputUses {
  one_edge_each,  // an ATen call: each argument owns the first unused edge to its place
  all_edges,      // a module: an input's gradient is the sum over every edge to it in the region
};

class BackwardProbe : public std::enable_shared_from_this<BackwardProbe> {
 public:
  // Hooks the region. Returns false (and hooks nothing) when no output takes part in autograd.
  static bool attach(const std::vector<at::Tensor>& outputs, const std::vector<Edge>& inputs, std::uint64_t seq_begin,
                     std::uint64_t seq_end, std::shared_ptr<GradientReceiver> receiver,
                     InputUses uses = InputUses::one_edge_each) {
    auto probe = std::shared_ptr<BackwardProbe>(new BackwardProbe(std::move(receiver)));
    return probe->hook(outputs, inputs, seq_begin, seq_end, uses);
  }

 private:
  explicit BackwardProbe(std::shared_ptr<GradientReceiver> r) : receiver_(std::move(r)) {}

  // An input fed by several edges: its gradient so far and how many of its edges have reported.
  struct InputSum {
    std::size_t expected = 0, arrived = 0;
    at::Tensor sum;
    bool delivered = false;
  };

  struct Slot {
    std::size_t node_index;  // which of the node's inputs/outputs
    std::size_t region_index;
  };

  class PreHook final : public torch::autograd::FunctionPreHook {
   public:
    PreHook(std::shared_ptr<BackwardProbe> p, std::vector<Slot> s) : probe_(std::move(p)), slots_(std::move(s)) {}
    variable_list operator()(const variable_list& grads) override {
      probe_->arrived_outputs(slots_, grads);
      return grads;  // read only: the gradients flow on unchanged
    }

   private:
    std::shared_ptr<BackwardProbe> probe_;
    std::vector<Slot> slots_;
  };

  class PostHook final : public torch::autograd::FunctionPostHook {
   public:
    PostHook(std::shared_ptr<BackwardProbe> p, std::vector<Slot> s) : probe_(std::move(p)), slots_(std::move(s)) {}
    variable_list operator()(const variable_list& grad_inputs, const variable_list& /*grad_outputs*/) override {
      probe_->arrived_inputs(slots_, grad_inputs);
      return grad_inputs;
    }

   private:
    std::shared_ptr<BackwardProbe> probe_;
    std::vector<Slot> slots_;
  };

  bool hook(const std::vector<at::Tensor>& outputs, const std::vector<Edge>& inputs, std::uint64_t seq_begin,
            std::uint64_t seq_end, InputUses uses) {
    // Roots: the nodes that produced the outputs, each with the outputs it carries.
    std::vector<std::pair<Node*, std::vector<Slot>>> roots;
    std::vector<std::shared_ptr<Node>> keep;
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      const at::Tensor& out = outputs[i];
      if (!out.defined() || !out.requires_grad()) continue;
      const std::shared_ptr<Node>& fn = out.grad_fn();
      if (!fn) continue;  // a leaf returned as is: no gradient flows through this region for it
      auto it = std::find_if(roots.begin(), roots.end(), [&](const auto& r) { return r.first == fn.get(); });
      if (it == roots.end()) {
        roots.emplace_back(fn.get(), std::vector<Slot>{});
        keep.push_back(fn);
        it = std::prev(roots.end());
      }
      it->second.push_back({static_cast<std::size_t>(out.output_nr()), i});
    }
    if (roots.empty()) return false;

    // The region's nodes: the roots and everything reachable from them inside the sequence range.
    std::vector<Node*> nodes;
    std::unordered_set<Node*> seen;
    for (auto& r : roots)
      if (seen.insert(r.first).second) nodes.push_back(r.first);
    for (std::size_t k = 0; k < nodes.size(); ++k)
      for (const Edge& e : nodes[k]->next_edges()) {
        Node* f = e.function.get();
        if (!f || seen.count(f)) continue;
        const std::uint64_t s = f->sequence_nr();
        if (s >= seq_begin && s < seq_end) {
          seen.insert(f);
          nodes.push_back(f);
        }
      }

    // Which next-edges of the region's nodes carry which input's gradient. For an ATen call each
    // argument takes the first unused edge equal to its gradient edge (an input passed twice, as in
    // p * p, uses two edges to the same place). For a module every such edge counts towards the
    // first input with that gradient edge (a tensor passed to a module twice gets it all once).
    // Slots of one node are in edge order, the order the engine adds its results in.
    std::vector<std::pair<Node*, std::vector<Slot>>> posts;
    std::vector<bool> claimed(inputs.size(), false);
    if (uses == InputUses::all_edges) sums_.assign(inputs.size(), InputSum{});
    for (Node* n : nodes) {
      const auto& edges = n->next_edges();
      std::vector<Slot> slots;
      for (std::size_t j = 0; j < edges.size(); ++j) {
        if (!edges[j].is_valid()) continue;
        for (std::size_t k = 0; k < inputs.size(); ++k) {
          if (!inputs[k].is_valid() || !(edges[j] == inputs[k])) continue;
          if (uses == InputUses::one_edge_each) {
            if (claimed[k]) continue;
            claimed[k] = true;
          } else {
            ++sums_[k].expected;
          }
          slots.push_back({j, k});
          break;
        }
      }
      if (!slots.empty()) posts.emplace_back(n, std::move(slots));
    }

    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_ = roots.size() + posts.size();
    }
    auto self = shared_from_this();
    for (auto& r : roots) r.first->add_pre_hook(std::make_unique<PreHook>(self, std::move(r.second)));
    for (auto& p : posts) p.first->add_post_hook(std::make_unique<PostHook>(self, std::move(p.second)));
    return true;
  }

  void arrived_outputs(const std::vector<Slot>& slots, const variable_list& grads) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    finish_with_pass_locked();
    ProbeGuard guard;
    for (const Slot& s : slots)
      if (s.node_index < grads.size()) receiver_->grad_output(s.region_index, grads[s.node_index]);
    step_locked();
  }

  void arrived_inputs(const std::vector<Slot>& slots, const variable_list& grads) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    finish_with_pass_locked();
    ProbeGuard guard;
    for (const Slot& s : slots) {
      const at::Tensor none;
      const at::Tensor& grad = s.node_index < grads.size() ? grads[s.node_index] : none;
      if (sums_.empty()) {
        receiver_->grad_input(s.region_index, grad);
        continue;
      }
      // An edge that carried no gradient (undefined: zero) adds nothing, as in autograd.
      InputSum& in = sums_[s.region_index];
      if (grad.defined()) in.sum = in.sum.defined() ? in.sum + grad : grad;
      if (++in.arrived == in.expected) deliver_locked(s.region_index);
    }
    step_locked();
  }

  void deliver_locked(std::size_t k) {
    InputSum& in = sums_[k];
    if (in.delivered) return;
    in.delivered = true;
    if (in.sum.defined()) receiver_->grad_input(k, in.sum);
    in.sum.reset();
  }

  // The region's backward is over when every hooked node has run once. A second backward
  // through a retained graph is not reported again.
  void step_locked() {
    if (--pending_ > 0) return;
    finish_locked();
  }

  // What has arrived of an input fed by several edges is reported even when some of its edges
  // never ran in this pass (a use the loss does not depend on): autograd's gradient is that sum too.
  void finish_locked() {
    for (std::size_t k = 0; k < sums_.size(); ++k) deliver_locked(k);
    receiver_->backward_done();
    finished_ = true;
  }

  // Some hooked nodes may never run in a pass: an output the loss does not use (an LSTM's last
  // hidden state), an input whose gradient nobody asked for (autograd::grad with chosen inputs).
  // So when the first gradient of the region arrives, the end of the backward pass is booked
  // as the latest moment the entry is complete, with whatever arrived.
  void finish_with_pass_locked() {
    if (end_of_pass_booked_) return;
    end_of_pass_booked_ = true;
    std::weak_ptr<BackwardProbe> self = shared_from_this();
    torch::autograd::Engine::get_default_engine().queue_callback([self] {
      if (auto probe = self.lock()) probe->end_of_pass();
    });
  }

  void end_of_pass() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    ProbeGuard guard;
    finish_locked();
  }

  std::shared_ptr<GradientReceiver> receiver_;
  std::mutex mutex_;
  std::size_t pending_ = 0;
  bool finished_ = false;
  bool end_of_pass_booked_ = false;
  std::vector<InputSum> sums_;  // InputUses::all_edges only
};

}  // namespace torchprobe::capture

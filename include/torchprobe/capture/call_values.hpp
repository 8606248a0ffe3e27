#pragma once
// The tensors among an ATen call's boxed values, as the API entries and the module tracking both
// need them.
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstddef>
#include <vector>

namespace torchprobe::capture::details {

// Calls visit(tensor) for every tensor among boxed values, lists and tuples, in order, until it
// returns false; returns false when stopped.
template <class Visit>
bool visit_tensors(const c10::IValue& v, Visit&& visit) {
  if (v.isTensor()) return visit(v.toTensor());
  if (v.isList()) {  // tensor lists included
    for (const c10::IValue& e : v.toListRef())
      if (!visit_tensors(e, visit)) return false;
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements())
      if (!visit_tensors(e, visit)) return false;
  }
  return true;
}

template <class Values>
std::vector<at::Tensor> tensors_of(const Values& values) {
  std::vector<at::Tensor> out;
  for (const c10::IValue& v : values)
    visit_tensors(v, [&](const at::Tensor& t) {
      out.push_back(t);
      return true;
    });
  return out;
}

// Does any of these tensors carry autograd history that a backward pass could run through?
inline bool any_in_graph(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors)
    if (t.defined() && t.requires_grad() && t.grad_fn()) return true;
  return false;
}

// Could a backward pass reach this call? Only through an input that requires grad: without one,
// no output gets a grad_fn, so there is nothing to hook (and nothing worth allocating for).
template <class Values>
bool any_requires_grad(const Values& values) {
  for (const c10::IValue& v : values)
    if (!visit_tensors(v, [](const at::Tensor& t) { return !(t.defined() && t.requires_grad()); })) return true;
  return false;
}

// A boxed call (the TorchScript interpreter's) hands RecordFunction its whole stack, the values
// of earlier instructions included, as inputs and as outputs: the call's own are the last ones.
template <class T>
c10::ArrayRef<T> own_values(c10::ArrayRef<T> values, bool schema_known, std::size_t count) {
  return schema_known && values.size() > count ? values.slice(values.size() - count) : values;
}

}  // namespace torchprobe::capture::details

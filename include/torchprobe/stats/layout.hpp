#pragma once
// A strided tensor's elements as runs of equally spaced elements, walked without copying the
// tensor. Statistics do not depend on element order, so their walk may reorder and merge
// dimensions freely (a transposed or channels-last tensor becomes one dense run); checksums
// hash the bytes in logical order, so theirs keeps the dimension order.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace torchprobe::stats::details {

struct StridedRuns {
  const char* base = nullptr;               // the element at index 0, the lowest address (strides are >= 0)
  std::int64_t element_size = 1;            // bytes
  std::int64_t run_length = 1;              // elements per run (the innermost dimension)
  std::int64_t run_stride = 1;              // elements between neighbours within a run
  std::vector<std::int64_t> outer_sizes;    // the other dimensions, outermost first
  std::vector<std::int64_t> outer_strides;  // in elements
  std::int64_t repeat = 1;                  // how many times each walked element occurs (statistics only)

  std::int64_t runs() const {
    std::int64_t r = 1;
    for (std::int64_t s : outer_sizes) r *= s;
    return r;
  }
  std::int64_t elements() const { return runs() * run_length; }
  bool dense() const { return outer_sizes.empty() && run_stride == 1; }
};

// Adjacent dimensions (outer first) merge when the outer one steps exactly over the inner one.
inline void merge_dimensions(std::vector<std::pair<std::int64_t, std::int64_t>>& dims) {
  std::vector<std::pair<std::int64_t, std::int64_t>> merged;
  for (const auto& d : dims) {
    if (!merged.empty() && merged.back().second == d.second * d.first) {
      merged.back() = {merged.back().first * d.first, d.second};
    } else {
      merged.push_back(d);
    }
  }
  dims.swap(merged);
}

inline StridedRuns runs_from(const at::Tensor& t, std::vector<std::pair<std::int64_t, std::int64_t>> dims) {
  StridedRuns r;
  r.base = static_cast<const char*>(t.data_ptr());
  r.element_size = static_cast<std::int64_t>(t.element_size());
  merge_dimensions(dims);
  if (!dims.empty()) {
    r.run_length = dims.back().first;
    r.run_stride = dims.back().second;
    for (std::size_t k = 0; k + 1 < dims.size(); ++k) {
      r.outer_sizes.push_back(dims[k].first);
      r.outer_strides.push_back(dims[k].second);
    }
  }
  return r;
}

// Every element of a contiguous or otherwise dense tensor, in memory order.
inline StridedRuns dense_runs(const at::Tensor& t) {
  StridedRuns r;
  r.base = static_cast<const char*>(t.data_ptr());
  r.element_size = static_cast<std::int64_t>(t.element_size());
  r.run_length = t.numel();
  return r;
}

// For statistics: dimensions of stride 0 (expanded) are walked once and counted `repeat` times,
// the rest are sorted by stride and merged, so the innermost run is as long as memory allows.
inline StridedRuns order_free_runs(const at::Tensor& t) {
  if (t.is_contiguous() || t.is_non_overlapping_and_dense()) return dense_runs(t);
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (size, stride)
  std::int64_t repeat = 1;
  for (std::int64_t k = 0; k < t.dim(); ++k) {
    const std::int64_t size = t.size(k), stride = t.stride(k);
    if (size == 1) continue;
    if (stride == 0) {
      repeat *= size;
      continue;
    }
    dims.emplace_back(size, stride);
  }
  std::stable_sort(dims.begin(), dims.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  StridedRuns r = runs_from(t, std::move(dims));
  r.repeat = repeat;
  return r;
}

// For checksums: the elements in row-major logical order, as Python's t.contiguous() has them.
inline StridedRuns logical_runs(const at::Tensor& t) {
  if (t.is_contiguous()) return dense_runs(t);
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;
  for (std::int64_t k = 0; k < t.dim(); ++k)
    if (t.size(k) != 1) dims.emplace_back(t.size(k), t.stride(k));
  return runs_from(t, std::move(dims));
}

// Calls visit(first, count) for the runs covering elements [begin, end) of the walk, in walk
// order; consecutive elements of a run are runs.run_stride elements apart. visit returns false
// to stop early.
template <class Visit>
void for_each_run(const StridedRuns& runs, std::int64_t begin, std::int64_t end, Visit&& visit) {
  if (begin >= end) return;
  const std::size_t outer = runs.outer_sizes.size();
  std::vector<std::int64_t> index(outer, 0);
  std::int64_t offset = 0;  // in elements, of the current run's first element
  std::int64_t row = begin / runs.run_length;
  std::int64_t col = begin % runs.run_length;
  for (std::size_t d = outer; d-- > 0;) {
    index[d] = row % runs.outer_sizes[d];
    row /= runs.outer_sizes[d];
    offset += index[d] * runs.outer_strides[d];
  }
  std::int64_t left = end - begin;
  while (left > 0) {
    const std::int64_t count = std::min(runs.run_length - col, left);
    if (!visit(runs.base + (offset + col * runs.run_stride) * runs.element_size, count)) return;
    left -= count;
    col = 0;
    for (std::size_t d = outer; d-- > 0;) {  // odometer: the last outer dimension moves fastest
      offset += runs.outer_strides[d];
      if (++index[d] < runs.outer_sizes[d]) break;
      offset -= runs.outer_strides[d] * runs.outer_sizes[d];
      index[d] = 0;
    }
  }
}

}  // namespace torchprobe::stats::details

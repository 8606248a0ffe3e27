#pragma once
// stack.json: the symbolized call sites of a step's forward entries, grouped by equal stacks.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "torchprobe/core/call_stack.hpp"
#include "torchprobe/io/symbolizer.hpp"

namespace torchprobe::io {

// stack.json: {"0": [[names...], [frames...]], "1": ...}. Names whose symbolized stacks are equal
// share one group (msprobe compares the final frame lists too, so calls from one source line through
// different internal paths still group); groups and names keep first-appearance order.
inline nlohmann::ordered_json build_stack_json(const std::vector<std::pair<std::string, CallStack>>& forward_entries) {
  // Symbolize each distinct raw stack once, all in one batch.
  std::unordered_map<CallStack, std::size_t, CallStackHash> raw_index;
  std::vector<const CallStack*> unique;
  std::vector<std::size_t> entry_raw;
  entry_raw.reserve(forward_entries.size());
  for (const auto& e : forward_entries) {
    auto [it, added] = raw_index.emplace(e.second, unique.size());
    if (added) unique.push_back(&e.second);
    entry_raw.push_back(it->second);
  }
  const auto frames = detail::Symbolizer::instance().symbolize_many(unique);

  std::map<std::vector<std::string>, std::size_t> group_of;              // symbolized frames -> group index
  std::vector<std::pair<std::vector<std::string>, std::size_t>> groups;  // names, frames index
  for (std::size_t i = 0; i < forward_entries.size(); ++i) {
    const std::size_t r = entry_raw[i];
    auto [it, added] = group_of.emplace(frames[r], groups.size());
    if (added) groups.push_back({{}, r});
    groups[it->second].first.push_back(forward_entries[i].first);
  }

  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  // ordered_map's own insert searches the keys linearly; these keys are unique by construction, so
  // append to the underlying vector directly and keep the build linear.
  auto& obj = out.get_ref<nlohmann::ordered_json::object_t&>();
  using Base = nlohmann::ordered_json::object_t::Container;
  for (std::size_t g = 0; g < groups.size(); ++g)
    static_cast<Base&>(obj).emplace_back(std::to_string(g),
                                         nlohmann::ordered_json::array({groups[g].first, frames[groups[g].second]}));
  return out;
}

}  // namespace torchprobe::io

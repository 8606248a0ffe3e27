#pragma once
// stack.json: the symbolized call sites of a step's forward entries, grouped by equal stacks.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "torchprobe/core/call_stack.hpp"
#include "torchprobe/io/json_text.hpp"
#include "torchprobe/io/symbolizer.hpp"

namespace torchprobe::io {

// Entries whose symbolized stacks are equal share one group (msprobe compares the final frame lists
// too, so calls from one source line through different internal paths still group); groups and
// names keep first-appearance order.
struct StackGroups {
  struct Group {
    std::vector<std::string_view> names;  // point into the entries given to group_stacks()
    std::size_t frames = 0;               // index into `frames`
  };
  std::vector<std::vector<std::string>> frames;  // one symbolized stack per distinct raw stack
  std::vector<Group> groups;
};

// {entry name, its raw stack}, in dump order; both must outlive the result.
using StackEntries = std::vector<std::pair<std::string_view, const CallStack*>>;

inline StackGroups group_stacks(const StackEntries& entries) {
  // Symbolize each distinct raw stack once, all in one batch. Entries of one call site share their
  // stack object (io::capture_shared_call_stack), so most are matched by address, without hashing
  // or copying the frames.
  std::unordered_map<const CallStack*, std::size_t> by_address;
  std::unordered_map<CallStack, std::size_t, CallStackHash> raw_index;
  std::vector<const CallStack*> unique;
  std::vector<std::size_t> entry_raw;
  entry_raw.reserve(entries.size());
  for (const auto& e : entries) {
    auto known = by_address.find(e.second);
    if (known == by_address.end()) {
      auto [it, added] = raw_index.emplace(*e.second, unique.size());
      if (added) unique.push_back(e.second);
      known = by_address.emplace(e.second, it->second).first;
    }
    entry_raw.push_back(known->second);
  }
  StackGroups out;
  out.frames = details::Symbolizer::instance().symbolize_many(unique);

  // Groups are numbered in order of first appearance; each distinct raw stack is looked up once.
  std::map<std::vector<std::string>, std::size_t> group_of;  // symbolized frames -> group index
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<std::size_t> group_of_raw(unique.size(), kNone);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::size_t r = entry_raw[i];
    if (group_of_raw[r] == kNone) {
      auto [it, added] = group_of.emplace(out.frames[r], out.groups.size());
      if (added) out.groups.push_back({{}, r});
      group_of_raw[r] = it->second;
    }
    out.groups[group_of_raw[r]].names.push_back(entries[i].first);
  }
  return out;
}

// stack.json's text: {"0": [[names...], [frames...]], "1": ...}.
inline void write_stack_json(JsonText& out, const StackGroups& s) {
  // One list of strings, the group's names or its frames, as the group's element `index`.
  auto strings = [&out](std::size_t index, const auto& list) {
    out.item(index, 1);
    out.open_array();
    for (std::size_t k = 0; k < list.size(); ++k) {
      out.item(k, 2);
      out.string(list[k]);
    }
    out.close_array(list.size(), 2);
  };
  out.open_object();
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    out.key(g, 0, std::to_string(g));
    out.open_array();
    strings(0, s.groups[g].names);
    strings(1, s.frames[s.groups[g].frames]);
    out.close_array(2, 1);
    out.maybe_drain();
  }
  out.close_object(s.groups.size(), 0);
}

// The same as a JSON tree.
inline nlohmann::ordered_json build_stack_json(const std::vector<std::pair<std::string, CallStack>>& forward_entries) {
  StackEntries entries;
  entries.reserve(forward_entries.size());
  for (const auto& e : forward_entries) entries.emplace_back(e.first, &e.second);
  const StackGroups s = group_stacks(entries);
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  // ordered_map's own insert searches the keys linearly; these keys are unique by construction, so
  // append to the underlying vector directly and keep the build linear.
  auto& obj = out.get_ref<nlohmann::ordered_json::object_t&>();
  using Base = nlohmann::ordered_json::object_t::Container;
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    nlohmann::ordered_json names = nlohmann::ordered_json::array();
    for (std::string_view n : s.groups[g].names) names.push_back(std::string(n));
    static_cast<Base&>(obj).emplace_back(std::to_string(g),
                                         nlohmann::ordered_json::array({names, s.frames[s.groups[g].frames]}));
  }
  return out;
}

}  // namespace torchprobe::io

#pragma once
// A collective call (all_reduce, broadcast, send, ...) as msprobe's "Distributed.{api}.{n}.forward"
// entry shows it: the positional arguments (tensors, ints) and the keyword arguments that are not
// tensors (op, group, src/dst, async_op) already encoded as msprobe encodes them. The output is
// msprobe's too: the arguments again, read after the collective ended, then the keyword values.
// The wrappers of distributed.hpp fill it; the running capture records it (ApiHandler).
#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace torchprobe::capture {

struct Collective {
  std::string api;                                                            // "all_reduce"
  std::vector<c10::IValue> args;                                              // as passed: tensors, lists, ints
  std::vector<std::pair<const std::string*, nlohmann::ordered_json>> kwargs;  // names from kwarg_name()
  bool ended = true;  // false: dropped before its work completed; the entry then has no output
  // A dispatched call (capture/dispatched_collectives.hpp): polls its work without waiting; null:
  // the call has completed when it returns.
  std::function<bool()> completed;

  // A keyword's name, kept for the life of the process (entries point at it until written).
  static const std::string* kwarg_name(const std::string& name) {
    static std::mutex mutex;
    static auto* names = new std::set<std::string>();  // never destroyed: entries may outlive statics
    std::lock_guard<std::mutex> lock(mutex);
    return &*names->insert(name).first;
  }
  void kwarg(const std::string& name, nlohmann::ordered_json value) {
    kwargs.emplace_back(kwarg_name(name), std::move(value));
  }
};

// msprobe's ProcessGroup item: {"type": "torch.ProcessGroup", "group_ranks": [...], "group_id":
// crc32 of str(ranks) as 8 hex digits}; str() of a Python list is "[0, 1, 2]".
inline nlohmann::ordered_json process_group_json(const std::vector<std::int64_t>& ranks) {
  std::string text = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  text += "]";
  const uLong crc =
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size()));
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08lx", static_cast<unsigned long>(crc & 0xffffffffUL));
  nlohmann::ordered_json j;
  j["type"] = "torch.ProcessGroup";
  j["group_ranks"] = ranks;
  j["group_id"] = hex;
  return j;
}

// The global ranks of a process group's members, as torch.distributed.get_process_group_ranks()
// gives them. A C++ process group knows only its own size and this process's rank in it, so a
// subgroup's members are what the user registered (torchprobe::dist::set_group_ranks); a group
// nobody registered is taken to be the whole world, ranks 0 .. size-1.
class GroupRanks {
 public:
  static void set(const void* group, std::vector<std::int64_t> ranks) {
    std::lock_guard<std::mutex> lock(mutex());
    (*groups())[group] = std::move(ranks);
  }
  static std::vector<std::int64_t> of(const void* group, int size) {
    {
      std::lock_guard<std::mutex> lock(mutex());
      auto it = groups()->find(group);
      if (it != groups()->end() && it->second.size() == static_cast<std::size_t>(size)) return it->second;
    }
    std::vector<std::int64_t> ranks;
    for (int r = 0; r < size; ++r) ranks.push_back(r);
    return ranks;
  }

 private:
  static std::map<const void*, std::vector<std::int64_t>>* groups() {
    static auto* g = new std::map<const void*, std::vector<std::int64_t>>();  // never destroyed, as kwarg names
    return g;
  }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
};

// A plain keyword value as msprobe encodes it: {"type": "int", "value": 3}.
inline nlohmann::ordered_json int_json(std::int64_t v) { return {{"type", "int"}, {"value", v}}; }
inline nlohmann::ordered_json bool_json(bool v) { return {{"type", "bool"}, {"value", v}}; }

}  // namespace torchprobe::capture

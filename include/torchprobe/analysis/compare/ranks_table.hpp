#pragma once
// The ranks of a step, read for `torchprobe ranks` (ranks.hpp) in bounded memory: each rank's
// dump.json is parsed by one of a few threads (one per core), boiled down to a compact table of its
// entries (per tensor item: site, shape and a 64-bit hash of its statistics, 16 bytes) and dropped
// before the next, so that at most one parsed document per thread is held, never all the ranks'.
// Names, sites and shapes are interned once for all ranks. The first non-finite value of each rank
// is found while its document is at hand (ranks_nonfinite.hpp).
#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "torchprobe/analysis/compare/dump_reader.hpp"
#include "torchprobe/analysis/compare/ranks_nodes.hpp"
#include "torchprobe/analysis/compare/ranks_nonfinite.hpp"

namespace torchprobe::compare::ranks::details {

template <class Nodes>
bool is_tensor_item(typename Nodes::Node v) {
  typename Nodes::Node x;
  return Nodes::is_object(v) && (Nodes::find(v, "Max", x) || Nodes::find(v, "md5", x)) && Nodes::find(v, "shape", x);
}

// The tensor items of an entry, as ("input_args.0", item) in dump order.
template <class Nodes>
void tensor_items(typename Nodes::Node v, const std::string& site,
                  std::vector<std::pair<std::string, typename Nodes::Node>>& out) {
  if (is_tensor_item<Nodes>(v)) {
    out.emplace_back(site, v);
  } else if (Nodes::is_array(v)) {
    std::size_t i = 0;
    Nodes::elements(v, [&](typename Nodes::Node e) { tensor_items<Nodes>(e, site + "." + std::to_string(i++), out); });
  } else if (Nodes::is_object(v)) {
    Nodes::members(v, [&](std::string_view k, typename Nodes::Node e) {
      tensor_items<Nodes>(e, site + "." + std::string(k), out);
    });
  }
}

inline bool is_parameters_grad(std::string_view entry) { return entry.find(".parameters_grad.") != std::string::npos; }

// The tensor items of one rank's entry that the view looks at: inputs, outputs and module
// parameters; a parameters_grad entry's gradients ({"weight": [grad], ...}: "weight.0").
template <class Nodes>
void entry_items(std::string_view entry, typename Nodes::Node e,
                 std::vector<std::pair<std::string, typename Nodes::Node>>& items) {
  if (!Nodes::is_object(e)) return;
  typename Nodes::Node part;
  for (const char* section : {"input_args", "input_kwargs", "output", "parameters"})
    if (Nodes::find(e, section, part)) tensor_items<Nodes>(part, section, items);
  if (is_parameters_grad(entry))
    Nodes::members(e,
                   [&](std::string_view k, typename Nodes::Node v) { tensor_items<Nodes>(v, std::string(k), items); });
}

// A hash of an item's statistics (dtype, shape, Max, Min, Mean, Norm, md5), spelled canonically:
// a NaN every rank holds is the same value, not a disagreement.
template <class Nodes>
std::uint64_t stats_hash(typename Nodes::Node item, std::string& key) {
  key.clear();
  typename Nodes::Node v;
  for (const char* k : {"dtype", "shape", "Max", "Min", "Mean", "Norm", "md5"}) {
    if (!Nodes::find(item, k, v)) continue;
    key += k;
    key += '=';
    canonical<Nodes>(v, key);
    key += ';';
  }
  return std::hash<std::string>()(key);
}

// Strings shared by every rank's table, each stored once.
class Interner {
 public:
  std::uint32_t id(std::string_view s) {
    const auto it = ids_.find(std::string(s));
    if (it != ids_.end()) return it->second;
    strings_.emplace_back(s);
    return ids_.emplace(strings_.back(), static_cast<std::uint32_t>(strings_.size() - 1)).first->second;
  }
  const std::string& text(std::uint32_t id) const { return strings_[id]; }
  std::size_t size() const { return strings_.size(); }

 private:
  std::unordered_map<std::string, std::uint32_t> ids_;
  std::vector<std::string> strings_;
};

struct ItemRow {
  std::uint32_t site, shape;
  std::uint64_t stats;
};

struct EntryRow {
  std::uint32_t name, first_item, items;  // its items: table.items[first_item, first_item + items)
};

// One rank's step, boiled down. Ids are the rank's own (`strings`) until read_ranks makes them the
// step's.
struct RankTable {
  long rank = -1;
  bool present = false;           // has a dump.json
  std::vector<EntryRow> entries;  // dump order
  std::vector<ItemRow> items;
  std::unordered_map<std::uint64_t, std::uint32_t> reduced_at;  // an all_reduce output's stats -> its entry index
  std::string missing;                                          // recovered incomplete: what it lacks
  std::optional<RankFirst> nonfinite;                           // its first non-finite tensor
  Interner strings;                                             // emptied once the ids are the step's
};

// The table of one rank from its "data" object.
template <class Nodes>
void fill_table(typename Nodes::Node data, RankTable& t) {
  std::vector<std::pair<std::string, typename Nodes::Node>> items;
  std::string key;
  RankFirst first;
  bool first_found = false;
  Nodes::members(data, [&](std::string_view name, typename Nodes::Node e) {
    if (!first_found) first_found = nonfinite_in_entry<Nodes>(name, e, first);
    const auto index = static_cast<std::uint32_t>(t.entries.size());
    items.clear();
    entry_items<Nodes>(name, e, items);
    t.entries.push_back(
        {t.strings.id(name), static_cast<std::uint32_t>(t.items.size()), static_cast<std::uint32_t>(items.size())});
    const bool reduction = name.rfind("Distributed.all_reduce.", 0) == 0;
    for (const auto& [site, item] : items) {
      const std::uint64_t h = stats_hash<Nodes>(item, key);
      typename Nodes::Node shape;
      key.clear();
      if (Nodes::find(item, "shape", shape)) canonical<Nodes>(shape, key);
      t.items.push_back({t.strings.id(site), t.strings.id(key.empty() ? "null" : key), h});
      if (reduction && site.rfind("output", 0) == 0) t.reduced_at.emplace(h, index);
    }
  });
  if (first_found) t.nonfinite = std::move(first);
}

// One rank's dump.json into its table: simdjson where it takes the file as it is, else compare's reader.
inline void read_table(const std::filesystem::path& file, RankTable& t) {
#if defined(TORCHPROBE_HAVE_SIMDJSON)
  {
    thread_local simdjson::dom::parser parser;
    simdjson::dom::element doc, data;
    if (parser.load(file.string()).get(doc) == simdjson::SUCCESS && SimdjsonNodes::is_object(doc) &&
        SimdjsonNodes::find(doc, "data", data) && SimdjsonNodes::is_object(data)) {
      fill_table<SimdjsonNodes>(data, t);
      // A repeated entry name (compare's reader gives it its meaning: first place, last value) or a
      // recovered step's note: read again below.
      bool plain = true;
      std::vector<bool> named(t.strings.size(), false);
      for (const EntryRow& e : t.entries) {
        plain = plain && !named[e.name];
        named[e.name] = true;
      }
      simdjson::dom::element recovery;
      if (plain && !SimdjsonNodes::find(doc, "torchprobe_recovery", recovery)) return;
      const long rank = t.rank;
      t = RankTable();
      t.rank = rank;
      t.present = true;
    }
  }
#endif
  const nlohmann::ordered_json doc = read_json_file(file);
  if (!doc.contains("data") || !doc["data"].is_object()) throw InputError(file.string() + ": no \"data\"");
  t.missing = recovery_missing(doc);
  fill_table<NlohmannNodes>(&doc["data"], t);
}

// Every rank directory of a step, read in parallel (one thread per core, at most one per rank); the
// ids of every table are then the step's, in `strings`.
inline std::vector<RankTable> read_ranks(const std::filesystem::path& step_dir, Interner& strings) {
  const auto dirs = compare::details::rank_dirs(step_dir);
  std::vector<RankTable> tables(dirs.size());
  std::atomic<std::size_t> next{0};
  std::exception_ptr failed;
  std::mutex mutex;  // failed, and `strings`
  const auto work = [&] {
    for (std::size_t i; (i = next++) < dirs.size();) {
      RankTable& t = tables[i];
      try {
        t.rank = dirs[i].first;
        const auto file = dirs[i].second / "dump.json";
        if (!std::filesystem::exists(file)) continue;
        t.present = true;
        read_table(file, t);
        // The rank's ids become the step's: one lock a rank.
        std::vector<std::uint32_t> to_step(t.strings.size());
        {
          std::lock_guard<std::mutex> lock(mutex);
          for (std::uint32_t k = 0; k < to_step.size(); ++k) to_step[k] = strings.id(t.strings.text(k));
        }
        for (EntryRow& e : t.entries) e.name = to_step[e.name];
        for (ItemRow& item : t.items) {
          item.site = to_step[item.site];
          item.shape = to_step[item.shape];
        }
        t.strings = Interner();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!failed) failed = std::current_exception();
        next = dirs.size();
      }
    }
  };
  const std::size_t n = std::min<std::size_t>(std::max(1u, std::thread::hardware_concurrency()), dirs.size());
  std::vector<std::thread> threads;
  for (std::size_t k = 1; k < n; ++k) threads.emplace_back(work);
  work();
  for (auto& th : threads) th.join();
  if (failed) std::rethrow_exception(failed);
  tables.erase(std::remove_if(tables.begin(), tables.end(), [](const RankTable& t) { return !t.present; }),
               tables.end());
  return tables;
}

}  // namespace torchprobe::compare::ranks::details

#pragma once
// The ranks of a step, read for `torchprobe ranks` (ranks.hpp) in bounded memory: each rank's
// dump.json is parsed by one of a few threads (one per core), boiled down to a compact table of its
// entries (per tensor item: site, shape and a 64-bit hash of its statistics, 16 bytes) and dropped
// before the next, so that at most one parsed document per thread is held, never all the ranks'.
// Names, sites and shapes are interned once for all ranks. The first non-finite value of each rank
// is found while its document is at hand (ranks_nonfinite.hpp). Where every rank of the step has
// the digest the probe wrote beside its dump.json (io/rank_digest.hpp), the tables are read from
// the digests instead: the same rows, for the entries a digest keeps, in a few bytes a tensor.
#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
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
#include "torchprobe/io/rank_digest.hpp"

namespace torchprobe::compare::ranks::details {

using io::rank_items::entry_items;
using io::rank_items::is_parameters_grad;
using io::rank_items::stats_hash;

using io::rank_items::Interner;

struct ItemRow {
  std::uint32_t site, shape;
  std::uint64_t stats;
};

struct EntryRow {
  std::uint32_t name, first_item, items;  // its items: [first_item, first_item + items)
  bool operator==(const EntryRow& o) const { return name == o.name && first_item == o.first_item && items == o.items; }
};

// What the ranks of a step mostly have in common: their entries, and their tensors' sites and
// shapes, in dump order (step ids). Ranks with the same layout share one; each keeps only its
// statistics, so that a step of thousands of ranks holds a hash per tensor per rank.
struct Layout {
  std::vector<EntryRow> entries;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> items;  // (site, shape)
  bool operator==(const Layout& o) const { return entries == o.entries && items == o.items; }
};

// One rank's step, boiled down. While it is read, `entries` and `items` hold it with the rank's own
// ids (`strings`); read_ranks then makes them the step's and moves them into `layout` and `stats`.
struct RankTable {
  long rank = -1;
  bool present = false;           // has a dump.json (or a digest)
  std::vector<EntryRow> entries;  // dump order (while read)
  std::vector<ItemRow> items;     // (while read)
  std::shared_ptr<const Layout> layout;
  std::vector<std::uint64_t> stats;  // each item's, in the layout's order
  // (an all_reduce output's statistics, its entry index), sorted: the first entry of each value.
  std::vector<std::pair<std::uint64_t, std::uint32_t>> reduced_at;
  std::string missing;                 // recovered incomplete: what it lacks
  std::optional<RankFirst> nonfinite;  // its first non-finite tensor
  Interner strings;                    // emptied once the ids are the step's

  // The entry index of the first all_reduce whose output has these statistics, or none.
  std::optional<std::uint32_t> reduced(std::uint64_t s) const {
    const auto it = std::lower_bound(reduced_at.begin(), reduced_at.end(), std::make_pair(s, std::uint32_t{0}));
    if (it == reduced_at.end() || it->first != s) return std::nullopt;
    return it->second;
  }
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
      if (reduction && site.rfind("output", 0) == 0) t.reduced_at.emplace_back(h, index);
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

// One rank's ranks_digest.bin (io/rank_digest.hpp) into its table: the same rows as read_table
// gives for the entries the digest keeps. Returns the file's size.
inline std::uintmax_t read_digest(const std::filesystem::path& file, RankTable& t) {
  const io::RankDigest d = io::read_rank_digest(file.string());
  std::vector<std::uint32_t> ids(d.strings.size());
  for (std::size_t k = 0; k < ids.size(); ++k) ids[k] = t.strings.id(d.strings[k]);
  for (const io::RankDigest::Entry& e : d.entries) {
    const auto index = static_cast<std::uint32_t>(t.entries.size());
    const bool reduction = d.strings[e.name].rfind("Distributed.all_reduce.", 0) == 0;
    t.entries.push_back({ids[e.name], static_cast<std::uint32_t>(t.items.size()), e.items});
    for (std::uint32_t k = e.first_item; k < e.first_item + e.items; ++k) {
      const io::RankDigest::Item& item = d.items[k];
      t.items.push_back({ids[item.site], ids[item.shape], item.stats});
      if (reduction && d.strings[item.site].rfind("output", 0) == 0) t.reduced_at.emplace_back(item.stats, index);
    }
  }
  t.missing = d.missing;
  t.nonfinite = d.nonfinite;
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(file, ec);
  return ec ? 0 : size;
}

// The step's distinct layouts: a rank's is replaced by an equal one read before (thread-safe).
class LayoutPool {
 public:
  std::shared_ptr<const Layout> share(std::shared_ptr<Layout> layout) {
    std::uint64_t h = 14695981039346656037ull;
    const auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    for (const EntryRow& e : layout->entries) mix((std::uint64_t{e.name} << 32) | e.items);
    for (const auto& [site, shape] : layout->items) mix((std::uint64_t{site} << 32) | shape);
    std::lock_guard<std::mutex> lock(mutex_);
    auto& same_hash = pool_[h];
    for (const auto& known : same_hash)
      if (*known == *layout) return known;
    same_hash.push_back(std::move(layout));
    return same_hash.back();
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::uint64_t, std::vector<std::shared_ptr<const Layout>>> pool_;
};

// Where a step's ranks were read from, and why, for the view to say.
struct StepSource {
  bool digests = false;             // every rank's ranks_digest.bin
  std::uintmax_t digest_bytes = 0;  // their sizes, together
  std::string note;                 // why dump.json was read although some rank had a digest
};

// Every rank directory of a step, read in parallel (one thread per core, at most one per rank); the
// ids of every table are then the step's, in `strings`. With `digests`, the ranks' ranks_digest.bin
// files are read instead of their dump.json when every rank of the step has one; a digest that
// cannot be read gives way to dump.json when every rank has that (the note says why), else is an
// error naming it.
inline std::vector<RankTable> read_ranks(const std::filesystem::path& step_dir, Interner& strings, bool digests = false,
                                         StepSource* source = nullptr) {
  namespace fs = std::filesystem;
  const auto dirs = compare::details::rank_dirs(step_dir);
  StepSource how;
  bool every_dump = true;
  if (digests) {
    std::string without;
    bool any = false;
    for (const auto& [rank, dir] : dirs) {
      const bool dump = fs::exists(dir / "dump.json"), digest = fs::exists(dir / io::kRankDigestFile);
      every_dump = every_dump && (dump || !digest);
      any = any || digest;
      if (dump && !digest) without += (without.empty() ? "" : ",") + std::to_string(rank);
    }
    how.digests = any && without.empty();
    if (any && !without.empty())
      how.note = "ranks " + without + " have no " + io::kRankDigestFile + ": every rank is read from dump.json";
  }
  std::vector<RankTable> tables(dirs.size());
  LayoutPool layouts;
  std::atomic<std::size_t> next{0};
  std::atomic<std::uintmax_t> digest_bytes{0};
  std::exception_ptr failed;
  std::mutex mutex;  // failed, and `strings`
  const auto work = [&] {
    for (std::size_t i; (i = next++) < dirs.size();) {
      RankTable& t = tables[i];
      try {
        t.rank = dirs[i].first;
        const auto file = dirs[i].second / (how.digests ? io::kRankDigestFile : "dump.json");
        if (!fs::exists(file)) continue;
        t.present = true;
        if (how.digests)
          digest_bytes += read_digest(file, t);
        else
          read_table(file, t);
        // The rank's ids become the step's: one lock a rank.
        std::vector<std::uint32_t> to_step(t.strings.size());
        {
          std::lock_guard<std::mutex> lock(mutex);
          for (std::uint32_t k = 0; k < to_step.size(); ++k) to_step[k] = strings.id(t.strings.text(k));
        }
        for (EntryRow& e : t.entries) e.name = to_step[e.name];
        auto layout = std::make_shared<Layout>();
        layout->entries = std::move(t.entries);
        layout->items.reserve(t.items.size());
        t.stats.reserve(t.items.size());
        for (const ItemRow& item : t.items) {
          layout->items.emplace_back(to_step[item.site], to_step[item.shape]);
          t.stats.push_back(item.stats);
        }
        std::vector<ItemRow>().swap(t.items);
        std::vector<EntryRow>().swap(t.entries);
        std::stable_sort(t.reduced_at.begin(), t.reduced_at.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
        t.reduced_at.erase(std::unique(t.reduced_at.begin(), t.reduced_at.end(),
                                       [](const auto& a, const auto& b) { return a.first == b.first; }),
                           t.reduced_at.end());
        t.reduced_at.shrink_to_fit();
        t.layout = layouts.share(std::move(layout));
        t.strings = Interner();
      } catch (const io::RankDigestError& e) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!failed) failed = std::make_exception_ptr(InputError(e.what()));
        next = dirs.size();
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
  if (failed && how.digests && every_dump) {  // a digest that cannot be read: the ranks' dump.json then
    try {
      std::rethrow_exception(failed);
    } catch (const std::exception& e) {
      strings = Interner();
      auto again = read_ranks(step_dir, strings, false, nullptr);
      if (source) *source = StepSource{false, 0, std::string(e.what()) + "; every rank is read from dump.json"};
      return again;
    }
  }
  if (failed) std::rethrow_exception(failed);
  tables.erase(std::remove_if(tables.begin(), tables.end(), [](const RankTable& t) { return !t.present; }),
               tables.end());
  how.digest_bytes = digest_bytes;
  if (source) *source = how;
  return tables;
}

}  // namespace torchprobe::compare::ranks::details

#pragma once
// What a sink receives when a step is flushed: the step's records, already in dump order and
// with every statistic resolved, plus the facts of the step needed for the file headers.
#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "torchprobe/core/names.hpp"
#include "torchprobe/core/record.hpp"
#include "torchprobe/io/dump_header.hpp"
#include "torchprobe/io/journal.hpp"
#include "torchprobe/io/stack_json.hpp"

namespace torchprobe {

// A file of the step besides dump.json and its companions: a task's own.
struct StepFile {
  std::string name;  // in the step directory
  std::string text;
};

// dump_json() also makes debug.json (save()'s entries, level "debug"): msprobe gives both files the
// same top-level keys.
struct StepDump {
  std::string task;       // "statistics"
  std::string level;      // "L1"
  std::string directory;  // {dump_path}/step{N}/{rank dir}
  std::int64_t step = 0;
  nlohmann::ordered_json dump_data_dir = nullptr;  // set when tensors are saved
  bool extra_info = true;                          // write stack.json and construct.json
  bool rank_digest = false;                        // write ranks_digest.bin (sink/step_digest.hpp)
  // The step's entries in dump order. A name committed twice (a second backward through a
  // retained graph) appears twice: the files keep its last value in its first place.
  std::vector<const Record*> records;
  // Keeps what `records` points to alive: a sink may write after the step has moved on.
  std::shared_ptr<const void> owner;
  // Files the task adds to the step directory (overflow_summary.json, free_benchmark.csv), as
  // their text, in the task's order: a sink writes them as they are, whatever the task.
  std::vector<StepFile> files;
  // The step journal's lines at this hand-over (sinks that keep one): each entry's text, already
  // made by the journal's thread, from which DirectorySink makes dump.json and debug.json while
  // the journal's file is whole (io/journal_dump.hpp). No file: the records are the only source.
  io::Journal::Position journal;
  // Some entries' lines were queued again at this hand-over, complete (device statistics, md5):
  // the journal then orders bodies of one name differently from the records; they are the source.
  bool lines_made_again = false;

  // The members before "data" (io/dump_header.hpp).
  io::DumpHeader header() const { return io::DumpHeader{task, level, dump_data_dir}; }

  // {"task", "level", "framework", "dump_data_dir", "data"} in msprobe's key order.
  nlohmann::ordered_json dump_json() const {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    header().put_into(j);
    j["data"] = keyed(by_first_place(in_dump), [](const Record& r) { return r.json_body(); });
    return j;
  }

  // construct.json: each entry's enclosing module's entry, null at top level (levels L0, mix).
  nlohmann::ordered_json construct_json() const {
    return keyed(by_first_place(has_parent), [](const Record& r) {
      return r.parent->empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(*r.parent);
    });
  }

  nlohmann::ordered_json stack_json() const {
    std::vector<std::pair<std::string, CallStack>> forward;
    for (const Record* r : records)
      if (r->stack) forward.emplace_back(r->name, *r->stack);
    return io::build_stack_json(forward);
  }

  // The records a {name: value} file lists, in its order: a name committed again (a second
  // backward through a retained graph) keeps its first place and takes the later record's value,
  // as a Python dict does. `listed(r)` says whether the file has an item for r at all
  // (in_dump for dump.json, has_parent for construct.json). The JSON trees above and the text of
  // sink/step_text.hpp both list what this returns.
  template <class Listed>
  std::vector<const Record*> by_first_place(Listed listed) const {
    std::vector<const Record*> out;
    out.reserve(records.size());
    std::unordered_map<std::string_view, std::size_t> where;
    where.reserve(records.size());
    for (const Record* r : records) {
      if (!listed(*r)) continue;
      auto [it, fresh] = where.emplace(r->name, out.size());
      if (fresh)
        out.push_back(r);
      else
        out[it->second] = r;
    }
    return out;
  }
  static bool in_dump(const Record& r) { return !r.construct_only; }
  static bool has_parent(const Record& r) { return r.parent.has_value(); }

 private:
  // {name: value(record)} for the listed records. ordered_json's operator[] searches keys one by
  // one, so items are appended directly.
  template <class Value>
  static nlohmann::ordered_json keyed(const std::vector<const Record*>& listed, Value value) {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    auto& items = out.get_ref<nlohmann::ordered_json::object_t&>();
    // Reserved: the items' keys are const, so a growing vector copies every value it moves.
    items.reserve(listed.size());
    for (const Record* r : listed) items.emplace_back(r->name, value(*r));
    return out;
  }
};

}  // namespace torchprobe

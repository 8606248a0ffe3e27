#pragma once
// The step's JSON files written as text straight from its records (io/json_text.hpp), in the
// same bytes as io::to_python_json of StepDump's trees: no JSON tree is built, and the text goes
// to the file in chunks, so a step of any size is written in bounded memory.
#include <cstddef>
#include <string>
#include <vector>

#include "torchprobe/core/record.hpp"
#include "torchprobe/io/files.hpp"
#include "torchprobe/io/json_text.hpp"
#include "torchprobe/io/record_text.hpp"
#include "torchprobe/io/stack_json.hpp"
#include "torchprobe/sink/step_dump.hpp"

namespace torchprobe {

namespace step_text {

// dump.json (and debug.json): {"task", "level", "framework", "dump_data_dir", "data"}, with the
// items of "data" written by `items(out)`, which returns how many it wrote.
template <class Items>
void write_dump_with(io::JsonText& out, const StepDump& d, Items&& items) {
  out.open_object();
  std::size_t members = 0;
  d.header().each([&](std::string_view key, const nlohmann::ordered_json& value) {
    out.key(members++, 0, key);
    io::write_json_value(out, value, 1);
  });
  out.key(members, 0, "data");
  out.open_object();
  const std::size_t count = items(out);
  out.close_object(count, 1);
  out.close_object(members + 1, 0);
}

// The same, its items made from the records.
inline void write_dump(io::JsonText& out, const StepDump& d) {
  write_dump_with(out, d, [&](io::JsonText& o) {
    const std::vector<const Record*> entries = d.by_first_place(StepDump::in_dump);
    for (std::size_t i = 0; i < entries.size(); ++i) {
      o.key(i, 1, entries[i]->name);
      io::write_record_body(o, *entries[i], 2);
      o.maybe_drain();
    }
    return entries.size();
  });
}

// construct.json: each entry's enclosing module's entry, null at top level (levels L0, mix).
inline void write_construct(io::JsonText& out, const StepDump& d) {
  const std::vector<const Record*> entries = d.by_first_place(StepDump::has_parent);
  out.open_object();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    out.key(i, 0, entries[i]->name);
    const std::string& parent = *entries[i]->parent;
    parent.empty() ? out.null() : out.string(parent);
    out.maybe_drain();
  }
  out.close_object(entries.size(), 0);
}

inline void write_stack(io::JsonText& out, const StepDump& d) {
  io::StackEntries forward;
  for (const Record* r : d.records)
    if (r->stack) forward.emplace_back(r->name, &*r->stack);
  io::write_stack_json(out, io::group_stacks(forward));
}

// Sends each chunk of text to the file being written.
class FileDrain final : public io::TextDrain {
 public:
  explicit FileDrain(io::AtomicFile& file) : file_(file) {}
  void take(std::string_view text) override { file_.write(text); }

 private:
  io::AtomicFile& file_;
};

// Replaces `path` (io::AtomicFile) with what write(JsonText&) produces, Python's indent=1 layout.
template <class Write>
void write_file(const std::string& path, bool sync, Write&& write) {
  io::AtomicFile file(path, 0640);
  FileDrain drain(file);
  std::string buf;
  buf.reserve(std::size_t{1} << 20);
  io::JsonText out(buf, 1, &drain);
  write(out);
  out.drain();
  file.commit(sync);
}

}  // namespace step_text

}  // namespace torchprobe

#pragma once
// The default sink: msprobe's directory layout, {dump_path}/step{N}/{rank dir}/{dump,stack,
// construct}.json (and debug.json for save()), and TorchProbe's ranks_digest.bin beside a rank's
// dump.json (sink/step_digest.hpp). Each flush rewrites the files atomically (temporary
// file + rename), so a reader never sees a half-written file and a failed write leaves the previous
// one intact. Between flushes the step journal in the same directory holds every kept entry.
// dump.json and debug.json are laid out from the journal's lines, where each entry's text was made
// already (io/journal_dump.hpp), or written from the records when the journal lost a line; the
// other files from the records (sink/step_text.hpp). All are written in chunks.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "torchprobe/io/files.hpp"
#include "torchprobe/io/journal_dump.hpp"
#include "torchprobe/sink/step_digest.hpp"
#include "torchprobe/sink/step_dump.hpp"
#include "torchprobe/sink/step_text.hpp"

namespace torchprobe {

class DirectorySink {
 public:
  static constexpr bool keeps_journal = true;
  static constexpr bool writes_in_background = true;  // details/step_writer.hpp

  // Called by start(): the step's directory must exist and be writable, or the user hears now,
  // with the path and the OS's reason.
  void open(const std::string& directory) { io::create_directories_for("create the dump directory", directory); }

  void write_step(const StepDump& d) {
    // A step without entries (overflow_check when nothing overflowed) has nothing a power loss
    // could take: its files skip the fsyncs, which would otherwise be most of such a step's cost.
    const bool sync = !d.records.empty();
    write_entries(d, "dump", sync);
    for (const StepFile& f : d.files) io::write_file_atomic(d.directory + "/" + f.name, f.text);
    // Not fsync'ed: a digest a power cut took (or cut short) makes the view read the step's
    // dump.json files instead; the fsync would be most of what the digest costs a small step.
    if (d.rank_digest)
      io::write_file_atomic(d.directory + "/" + io::kRankDigestFile,
                            step_digest::digest_of(d.by_first_place(StepDump::in_dump)), 0640, false);
    if (!d.extra_info) return;
    step_text::write_file(d.directory + "/stack.json", sync,
                          [&](io::JsonText& out) { step_text::write_stack(out, d); });
    step_text::write_file(d.directory + "/construct.json", sync,
                          [&](io::JsonText& out) { step_text::write_construct(out, d); });
  }

  void write_debug(const StepDump& d) { write_entries(d, "debug", true); }

  // How many dump.json and debug.json files were laid out from the journal, and how many written
  // from the records: what tests and benchmarks read (after wait_written()).
  struct Sources {
    std::uint64_t journal = 0, records = 0;
  };
  Sources sources() const { return {from_journal_.n.load(), from_records_.n.load()}; }

 private:
  // {which}.json ("dump" or "debug"): from the journal when its file holds every line of the
  // hand-over and those lines are the records' entries (an entry committed on another thread
  // while the step was handed over has its line counted but no record yet), else from the records.
  // A journal that cannot be read again half-way gives way to the records too.
  void write_entries(const StepDump& d, std::string_view which, bool sync) {
    const std::string path = d.directory + "/" + std::string(which) + ".json";
    try {
      std::optional<io::JournalDump> journal =
          d.journal.file && d.journal.file->whole()
              ? io::JournalDump::read(d.journal.file->path(), d.journal.lines, which)
              : std::nullopt;
      if (journal && journal->lines() == static_cast<std::size_t>(
                                             std::count_if(d.records.begin(), d.records.end(),
                                                           [](const Record* r) { return StepDump::in_dump(*r); }))) {
        step_text::write_file(path, sync, [&](io::JsonText& out) {
          step_text::write_dump_with(out, d, [&](io::JsonText& o) {
            journal->write_items(o);
            return journal->size();
          });
        });
        from_journal_.n.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    } catch (const std::exception&) {  // the records say it again; a failure to write the file repeats there
    }
    step_text::write_file(path, sync, [&](io::JsonText& out) { step_text::write_dump(out, d); });
    from_records_.n.fetch_add(1, std::memory_order_relaxed);
  }

  struct Counter {  // an atomic count that a sink's move (into its Debugger) takes along
    std::atomic<std::uint64_t> n{0};
    Counter() = default;
    Counter(const Counter& o) : n(o.n.load()) {}
    Counter& operator=(const Counter& o) {
      n = o.n.load();
      return *this;
    }
  };
  Counter from_journal_, from_records_;
};

}  // namespace torchprobe

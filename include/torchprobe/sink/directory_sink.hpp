#pragma once
// The default sink: msprobe's directory layout, {dump_path}/step{N}/{rank dir}/{dump,stack,
// construct}.json (and debug.json for save()). Each flush rewrites the files atomically (temporary
// file + rename), so a reader never sees a half-written file and a failed write leaves the previous
// one intact. Between flushes the step journal in the same directory holds every kept entry. The
// files are written as text straight from the records, in chunks (sink/step_text.hpp).
#include <string>

#include "torchprobe/io/files.hpp"
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
    step_text::write_file(d.directory + "/dump.json", sync, [&](io::JsonText& out) { step_text::write_dump(out, d); });
    for (const StepFile& f : d.files) io::write_file_atomic(d.directory + "/" + f.name, f.text);
    if (!d.extra_info) return;
    step_text::write_file(d.directory + "/stack.json", sync,
                          [&](io::JsonText& out) { step_text::write_stack(out, d); });
    step_text::write_file(d.directory + "/construct.json", sync,
                          [&](io::JsonText& out) { step_text::write_construct(out, d); });
  }

  void write_debug(const StepDump& d) {
    step_text::write_file(d.directory + "/debug.json", true, [&](io::JsonText& out) { step_text::write_dump(out, d); });
  }
};

}  // namespace torchprobe

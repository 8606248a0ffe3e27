#pragma once
// The default sink: msprobe's directory layout, {dump_path}/step{N}/{rank dir}/{dump,stack,
// construct}.json. Each flush rewrites the files atomically (temporary file + rename), so a
// reader never sees a half-written file and a failed write leaves the previous one intact.
#include <string>

#include "../io/files.hpp"
#include "../io/python_json.hpp"
#include "step_dump.hpp"

namespace torchprobe {

class DirectorySink {
 public:
  // Called by start(): the step's directory must exist and be writable, or the user hears now,
  // with the path and the OS's reason.
  void open(const std::string& directory) {
    try {
      io::create_directories(directory);
    } catch (const io::IoError& e) {
      throw io::IoError("create the dump directory", directory, e.error_code());
    }
  }

  void write_step(const StepDump& d) {
    io::write_file_atomic(d.directory + "/dump.json", io::to_python_json(d.dump_json()));
    if (!d.extra_info) return;
    io::write_file_atomic(d.directory + "/stack.json", io::to_python_json(d.stack_json()));
    io::write_file_atomic(d.directory + "/construct.json", io::to_python_json(d.construct_json()));
  }
};

}  // namespace torchprobe

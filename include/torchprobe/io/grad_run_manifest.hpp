#pragma once
// Which files of a grad_probe rank directory belong to the run that wrote there last.
//
// msprobe's layout has no notion of a run: a second run into the same dump_path overwrites the steps
// it reaches and leaves the rest (more steps, parameters dropped from param_list) lying beside them,
// and its GradComparator compares those stale files as if they were the run's (spec A.7). TorchProbe
// keeps msprobe's layout byte for byte and adds one file beside it, rank{R}/grad_probe_run.jsonl:
//
//   {"format":1,"run_id":"20261202T051500Z-4242-9c1f03aa","grad_level":"L2"}   first line: a new run
//   {"step":0,"params":["fc.weight","fc.bias"]}      one line per written step, parameters as files are named
//
// The first line is written (replacing an earlier run's file) when a monitor first records into the
// rank directory; a step's line is appended once all of that step's files are complete, so a crash
// mid-step leaves that step out. `torchprobe grad-compare` reads only the steps and parameters listed
// there when the file exists, and msprobe's tools, which never look for it, are unaffected.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchprobe/io/files.hpp"

namespace torchprobe::grad_probe {

inline constexpr const char* kRunManifestName = "grad_probe_run.jsonl";

// The run that last wrote into a rank directory: its id and, per step, the parameters it wrote.
struct RunManifest {
  std::string run_id;
  std::map<std::int64_t, std::vector<std::string>> steps;

  bool wrote(std::int64_t step, const std::string& param) const {
    const auto it = steps.find(step);
    if (it == steps.end()) return false;
    for (const std::string& p : it->second)
      if (p == param) return true;
    return false;
  }
};

// "20261202T051500Z-{pid}-{8 hex digits}": when, which process, and randomness for two monitors of
// one process started in the same second.
inline std::string new_run_id() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char when[32];
  std::strftime(when, sizeof when, "%Y%m%dT%H%M%SZ", &utc);
  std::random_device rd;
  char tail[16];
  std::snprintf(tail, sizeof tail, "%08x", static_cast<unsigned>(rd()));
  return std::string(when) + "-" + std::to_string(::getpid()) + "-" + tail;
}

// Starts a run in `rank_dir` (which must exist): replaces any earlier run's manifest.
inline void start_run_manifest(const std::string& rank_dir, const std::string& run_id, const std::string& level) {
  const nlohmann::json head = {{"format", 1}, {"run_id", run_id}, {"grad_level", level}};
  io::write_file_atomic(rank_dir + "/" + kRunManifestName, head.dump() + "\n", 0640, false);
}

// Appends a completed step.
inline void append_run_step(const std::string& rank_dir, std::int64_t step, const std::vector<std::string>& params) {
  const std::string path = rank_dir + "/" + kRunManifestName;
  const std::string line = nlohmann::json{{"step", step}, {"params", params}}.dump() + "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) throw io::IoError("open for appending", path, errno);
  const int err = io::write_all(fd, line.data(), line.size());
  ::close(fd);
  if (err != 0) throw io::IoError("append to", path, err);
}

// The manifest of `rank_dir`, or nullopt when there is none (msprobe's own dumps) or its first line is
// not one. A torn last line (a crash while appending) is ignored.
inline std::optional<RunManifest> read_run_manifest(const std::string& rank_dir) {
  std::ifstream in(rank_dir + "/" + kRunManifestName);
  if (!in) return std::nullopt;
  RunManifest m;
  std::string line;
  bool first = true;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (first) {
      if (!j.is_object() || !j.contains("run_id") || !j["run_id"].is_string()) return std::nullopt;
      m.run_id = j["run_id"].get<std::string>();
      first = false;
      continue;
    }
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer() || !j.contains("params") ||
        !j["params"].is_array())
      continue;
    std::vector<std::string>& names = m.steps[j["step"].get<std::int64_t>()];
    names.clear();  // a step listed twice: the later line wins
    for (const auto& p : j["params"])
      if (p.is_string()) names.push_back(p.get<std::string>());
  }
  if (first) return std::nullopt;
  return m;
}

}  // namespace torchprobe::grad_probe

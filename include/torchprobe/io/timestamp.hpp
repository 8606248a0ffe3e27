#pragma once
// The {ts} in msprobe's file names (compare_result_{ts}.csv, run_ut's and api_precision_compare's).
#include <ctime>
#include <string>

namespace torchprobe::io {

// time.strftime("%Y%m%d%H%M%S") in local time.
inline std::string compact_local_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y%m%d%H%M%S", &tm);
  return buf;
}

}  // namespace torchprobe::io

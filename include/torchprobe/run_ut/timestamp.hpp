#pragma once
// The {ts} in msprobe's run_ut and api_precision_compare file names.
#include <ctime>
#include <string>

namespace torchprobe::run_ut {

// time.strftime("%Y%m%d%H%M%S") in local time.
inline std::string timestamp_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y%m%d%H%M%S", &tm);
  return buf;
}

}  // namespace torchprobe::run_ut

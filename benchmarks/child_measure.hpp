#pragma once
// A measurement in a child process of its own, for the benchmarks that time a whole tool run
// (compare, ranks): each gets its own max RSS (one process would report the largest of all its
// measurements), and the seconds its body measured come back through a pipe.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace tpbench {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What one measured child process reports: its wall seconds (and exit status), and its max RSS.
struct Measured {
  double seconds = 0, rss_mb = 0;
  double cpu = 0;  // user + system seconds: unlike the wall time, not stretched by other work on the machine
  int status = 0;
  std::vector<std::pair<double, std::string>> lines;  // compare's log lines, with the second each came
};

inline Measured from_rusage(const rusage& u) {
  Measured m;
  m.rss_mb = static_cast<double>(u.ru_maxrss) / 1024.0;
  m.cpu = static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
          static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  return m;
}

// Runs `body` in a child process: each measurement gets its own max RSS (the nlohmann baseline of
// 1M entries peaks higher than the compare; one process would report the larger of the two), and
// the seconds are the child's own, written to a pipe. `body` returns the seconds it measured.
template <class Body>
Measured in_child(Body body) {
  std::fflush(stdout);
  int fd[2];
  if (::pipe(fd) != 0) std::abort();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fd[0]);
    int status = 0;
    const double s = body(status);
    const double out[2] = {s, static_cast<double>(status)};
    if (::write(fd[1], out, sizeof out) != static_cast<ssize_t>(sizeof out)) std::_Exit(3);
    std::fflush(stdout);
    std::_Exit(0);
  }
  ::close(fd[1]);
  double in[2] = {-1, -1};
  const bool got = ::read(fd[0], in, sizeof in) == static_cast<ssize_t>(sizeof in);
  ::close(fd[0]);
  int wstatus = 0;
  rusage u{};
  ::wait4(pid, &wstatus, 0, &u);
  Measured m = from_rusage(u);
  m.seconds = got ? in[0] : -1;
  m.status = got ? static_cast<int>(in[1]) : -1;
  return m;
}

}  // namespace tpbench

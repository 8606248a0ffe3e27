#pragma once
// Child processes for the tests that kill or limit a process: this test executable run again
// (posix_spawn of /proc/self/exe) with TORCHPROBE_TEST_CHILD=<mode>. In each test file that has
// child programs, a static object runs the program of its own modes before doctest's main and
// leaves other modes alone. Spawning a fresh process avoids forking a parent that already runs
// libtorch's threads.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>

extern char** environ;

namespace tptest {

// Runs this executable again as the child `mode`, with `extra_env` (NAME=value) added to an
// environment cleared of the parent's TORCHPROBE_TEST_* variables; returns its pid.
inline pid_t spawn_child(const std::string& mode, const std::vector<std::string>& extra_env) {
  std::vector<std::string> env_strings = {"TORCHPROBE_TEST_CHILD=" + mode};
  env_strings.insert(env_strings.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("TORCHPROBE_TEST_", 0) != 0) envp.push_back(*e);
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  char arg0[] = "torchprobe_tests_child";
  char* argv[] = {arg0, nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data());
  REQUIRE(rc == 0);
  return pid;
}

// waitpid() until the child has ended; returns its status.
inline int wait_child(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// Lines in a child's progress file (one per finished step, say); 0 while it does not exist.
inline std::size_t progress_lines(const std::string& path) {
  std::ifstream in(path);
  return static_cast<std::size_t>(
      std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n'));
}

// Waits until `path` exists and holds at least `lines` lines, or a minute has passed; returns when.
inline std::chrono::steady_clock::time_point wait_for_progress(const std::string& path, std::size_t lines) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((!std::filesystem::exists(path) || progress_lines(path) < lines) && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  return std::chrono::steady_clock::now();
}

}  // namespace tptest

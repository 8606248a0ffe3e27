#pragma once
// A test body run in a forked child, for checks that need process-wide changes (rlimits, dropping
// root): the child's code and the text it wrote come back to the test.
#include <doctest/doctest.h>

#include <string>

#include <sys/wait.h>
#include <unistd.h>

namespace tptest {

struct ChildResult {
  int code;
  std::string text;
};
template <class F>
ChildResult in_child(F body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::string text;
    int code = 99;
    try {
      code = body(text);
    } catch (...) {
      text = "unexpected exception";
    }
    (void)!::write(fds[1], text.data(), text.size());
    ::_exit(code);  // no doctest teardown in the child
  }
  ::close(fds[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  return {WEXITSTATUS(status), text};
}

// Drops root in a child before a permission check (CI runs as root, who may read any file):
// false when the switch to nobody (65534) fails.
inline bool drop_root() { return ::geteuid() != 0 || (::setgid(65534) == 0 && ::setuid(65534) == 0); }

}  // namespace tptest

#pragma once
// Helpers of the recovery and full-disk tests: running tools/recover_dump.py and comparing dump
// files through python's json (an independent reader), entry by entry.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "test_support.hpp"

namespace tptest {

inline std::string recover_tool() { return std::string(TORCHPROBE_TESTS_DIR) + "/../tools/recover_dump.py"; }

// The rank directory name of this process ("proc{pid}": no rank is set in these tests).
inline std::string rank_name() { return "proc" + std::to_string(::getpid()); }

struct ToolRun {
  int rc = -1;
  std::string out, err;  // stdout, stderr
};

// Runs `python3 tools/recover_dump.py ARGS` (ARGS as the shell reads them).
inline ToolRun run_recover_tool(const std::string& args) {
  const TempDir io;
  const std::string cmd =
      std::string(TORCHPROBE_PYTHON) + " " + recover_tool() + " " + args + " >" + io / "out" + " 2>" + io / "err";
  const int status = std::system(cmd.c_str());
  ToolRun r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_text(io / "out");
  r.err = read_text(io / "err");
  return r;
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// "SAME" when the JSON dump file `ours` holds the entries of `expected` (less the entry named `drop`,
// if given), in the same order and equal one by one, with the same task, level and framework;
// otherwise what differs. Read by python's json.
inline std::string compare_dump_files(const std::string& ours, const std::string& expected,
                                      const std::string& drop = "") {
  return run_python(
      "import json\n"
      "a = json.load(open('" +
      ours +
      "'))\n"
      "b = json.load(open('" +
      expected +
      "'))\n"
      "b['data'].pop('" +
      drop +
      "', None)\n"
      "bad = [k for k in ('task', 'level', 'framework') if a.get(k) != b.get(k)]\n"
      "if list(a['data']) != list(b['data']):\n"
      "    bad.append('names %s != %s' % (list(a['data']), list(b['data'])))\n"
      "bad += ['entry ' + n for n in b['data'] if a['data'].get(n) != b['data'][n]]\n"
      "print('SAME' if not bad and b['data'] else 'DIFFERENT: %s (%d expected entries)' % (bad, len(b['data'])))\n");
}

// "SAME" when the two JSON files hold equal values (objects: the same keys in the same order).
inline std::string compare_json_files(const std::string& ours, const std::string& expected) {
  return run_python(
      "import json\n"
      "a = json.load(open('" +
      ours +
      "'))\n"
      "b = json.load(open('" +
      expected +
      "'))\n"
      "same = a == b and (not isinstance(a, dict) or list(a) == list(b))\n"
      "print('SAME' if same else 'DIFFERENT')\n");
}

}  // namespace tptest

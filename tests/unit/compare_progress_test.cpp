// torchprobe compare's progress on stderr: nothing for small dumps; for more than kProgressEntries
// entries the stages (and, in tensor mode, a bar over the .pt pairs) -- redrawn in place on a
// terminal, one plain line per step elsewhere.
#include <doctest/doctest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "compare_support.hpp"
#include "torchprobe/analysis/compare/cli.hpp"
#include "torchprobe/analysis/compare/progress.hpp"

namespace compare_progress_test {
namespace fs = std::filesystem;
using namespace torchprobe::compare;
using namespace tp_compare_test;

// A dump of `n` relu calls, each with one input and one output tensor (data files named, for the
// tensor task, though none exists: the tests give run_compare their own cell function).
fs::path synthetic(const fs::path& dir, int n, const std::string& task) {
  Dir d;
  const Stats s{"torch.float32", {4, 4}, 1.0, -1.0, 0.1, 2.0};
  for (int i = 0; i < n; ++i) {
    const std::string name = "Aten.relu." + std::to_string(i) + ".forward";
    Json e = entry({s}, {s});
    if (task == "tensor") {
      e["input_args"][0]["data_name"] = name + ".input.0.pt";
      e["output"][0]["data_name"] = name + ".output.0.pt";
    }
    d.add(name, e);
  }
  return d.write(dir, task);
}

struct Run {
  int status = -1;
  std::string log;
  std::size_t cell_calls = 0;
};

Run run(const fs::path& dump, const fs::path& out, bool tty, bool tensor_cells) {
  CompareOptions o;
  o.target = o.bench = dump;
  o.out = out;
  o.progress_tty = tty;
  Run r;
  if (tensor_cells)
    o.pt_cells = [&](const fs::path&, const fs::path&) {
      ++r.cell_calls;
      return std::array<std::string, 6>{"1.0", "0.0", "0.0", "0.0", "1.0", "1.0"};
    };
  std::ostringstream log;
  r.status = run_compare(o, log);
  r.log = log.str();
  return r;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace compare_progress_test

using namespace compare_progress_test;

TEST_CASE("Progress draws a bar in place on a terminal and one line per tenth elsewhere") {
  std::ostringstream tty, plain, off;
  {
    Progress bar(tty, "pairs", 200, true, true);
    for (int i = 0; i < 200; ++i) bar.advance();
  }
  CHECK(count(tty.str(), "\r") == 100);  // one redraw per percent
  CHECK(tty.str().find("\rpairs [###############               ]  50% 100/200") != std::string::npos);
  CHECK(tty.str().size() > 0);
  CHECK(tty.str().back() == '\n');
  {
    Progress bar(plain, "pairs", 200, false, true);
    for (int i = 0; i < 200; ++i) bar.advance();
  }
  CHECK(plain.str().find('\r') == std::string::npos);
  CHECK(count(plain.str(), "\n") == 10);
  CHECK(plain.str().find("pairs: 10% (20/200)\n") == 0);
  CHECK(plain.str().find("pairs: 100% (200/200)\n") != std::string::npos);
  {
    Progress bar(off, "pairs", 200, true, false);
    for (int i = 0; i < 200; ++i) bar.advance();
  }
  CHECK(off.str().empty());
}

TEST_CASE("compare reports no progress for a small dump, and its stages for a dump over the threshold") {
  const fs::path tmp = temp_dir("progress_stages");
  const fs::path small = synthetic(tmp / "small", 20, "statistics");
  const Run quiet = run(small, tmp / "out_small", false, false);
  CHECK(quiet.status == 0);
  CHECK(quiet.log.find("[1/4]") == std::string::npos);

  const int n = static_cast<int>(kProgressEntries / 2) + 1;  // both sides together just over the threshold
  const fs::path big = synthetic(tmp / "big", n, "statistics");
  const Run lines = run(big, tmp / "out_big", false, false);
  INFO(lines.log);
  CHECK(lines.status == 0);
  const std::string sizes = " (" + std::to_string(n) + " + " + std::to_string(n) + " entries)\n";
  for (const char* s : {"[1/4] rows", "[2/4] msprobe's table", "[3/4] matching and judging", "[4/4] first divergence"})
    CHECK(lines.log.find(s + sizes) != std::string::npos);
  CHECK(lines.log.find('\r') == std::string::npos);  // not a terminal: plain lines

  const Run tty = run(big, tmp / "out_tty", true, false);
  CHECK(count(tty.log, "\r[") == 4);
  fs::remove_all(tmp);
}

TEST_CASE("in tensor mode a big dump gets a bar over its .pt pairs") {
  const fs::path tmp = temp_dir("progress_tensor");
  const int n = static_cast<int>(kProgressEntries / 2) + 1;
  const fs::path big = synthetic(tmp / "big", n, "tensor");
  const Run r = run(big, tmp / "out", false, true);
  INFO(r.log.substr(0, 2000));
  CHECK(r.status == 0);
  CHECK(r.cell_calls == static_cast<std::size_t>(2 * n));
  const std::string total = std::to_string(2 * n);
  CHECK(r.log.find("[2/4] msprobe's table, reading the .pt files") != std::string::npos);
  CHECK(r.log.find("  .pt pairs: 100% (" + total + "/" + total + ")\n") != std::string::npos);
  CHECK(count(r.log, "  .pt pairs: ") == 10);

  const fs::path small = synthetic(tmp / "small", 20, "tensor");
  const Run quiet = run(small, tmp / "out_small", false, true);
  CHECK(quiet.cell_calls == 40);
  CHECK(quiet.log.find(".pt pairs") == std::string::npos);
  fs::remove_all(tmp);
}

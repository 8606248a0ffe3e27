// Pairing inside paired modules: an extra call in one module stays there instead of shifting
// every later call of the same API onto the wrong partner (hand-written dumps).
#include <doctest/doctest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "compare_support.hpp"
#include "torchprobe/analysis/compare/cli.hpp"

namespace {
namespace fs = std::filesystem;
using namespace torchprobe::compare;
using namespace tp_compare_test;

const std::string f32 = "torch.float32";
const Stats x{f32, {4, 16}, 2.0, -2.0, 0.01, 9.0, false};
const Stats w{f32, {8, 16}, 0.25, -0.25, 0.001, 2.1}, b{f32, {8}, 0.2, -0.2, 0.01, 0.4};
Stats wt(Stats s) {
  std::swap(s.shape[0], s.shape[1]);
  return s;
}
// The outputs of the three linear calls: a's, the bench's extra one in a, b's. Same shape, other values.
const Stats ya{f32, {4, 8}, 1.5, -1.25, 0.02, 4.5}, extra{f32, {4, 8}, 0.75, -0.5, 0.1, 2.25},
    yb{f32, {4, 8}, 1.25, -1.0, 0.03, 3.5};

// Python names: blocks a and b each make one Functional.linear call.
Dir python_side() {
  Dir d;
  d.add("Functional.linear.0.forward", entry({x, w, b}, {ya}), "Module.a.Block.forward.0");
  d.add("Module.a.Block.forward.0", entry({x}, {ya}));
  d.add("Functional.linear.1.forward", entry({x, w, b}, {yb}), "Module.b.Block.forward.0");
  d.add("Module.b.Block.forward.0", entry({x}, {yb}));
  return d;
}

// C++ names, and block a makes one more linear call (t + addmm) after its first.
Dir cpp_side() {
  Dir d;
  const char* a = "Module.a.Block.forward.0";
  d.add("Aten.t.0.forward", entry({w}, {wt(w)}), a);
  d.add("Aten.addmm.0.forward", entry({b, x, wt(w)}, {ya}), a);
  d.add("Aten.t.1.forward", entry({w}, {wt(w)}), a);
  d.add("Aten.addmm.1.forward", entry({b, x, wt(w)}, {extra}), a);
  d.add(a, entry({x}, {ya}));
  d.add("Aten.t.2.forward", entry({w}, {wt(w)}), "Module.b.Block.forward.0");
  d.add("Aten.addmm.2.forward", entry({b, x, wt(w)}, {yb}), "Module.b.Block.forward.0");
  d.add("Module.b.Block.forward.0", entry({x}, {yb}));
  return d;
}

}  // namespace

TEST_CASE("an extra linear call inside one module pairs nothing outside it: block b's calls still meet") {
  const fs::path dir = temp_dir("align");
  python_side().write(dir / "py");
  cpp_side().write(dir / "cpp");
  CompareOptions o;
  o.target = dir / "cpp";
  o.bench = dir / "py";
  o.out = dir / "out";
  std::ostringstream log;
  const int status = run_compare(o, log);
  INFO(log.str());
  const auto report = read_json_file(dir / "out" / "first_divergence.json");
  CHECK(status == 0);
  CHECK(report["first_diverging_entry"].is_null());
  CHECK(report["summary"]["paired_align"] == 2);
  CHECK(report["summary"]["paired_exact"] == 2);  // the two blocks
  // The extra call is listed as what it is: the target's, unmatched.
  CHECK(report["unmatched"]["target_only"] == Json::array({"Aten.t.1.forward", "Aten.addmm.1.forward"}));
  CHECK(report["unmatched"]["bench_only"].empty());
  fs::remove_all(dir);
}

TEST_CASE("the alignment inside a module prefers the partner with the same statistics, then the same shape") {
  using details::align_items;
  // Items scored 1 (same name), 3 (same shape too), 7 (same statistics too), 0 (never).
  const std::vector<int> a = {7, 3}, b = {3, 7, 7};
  const auto score = [](int x, int y) { return x == y ? x : (x == 3 || y == 3) ? 1 : 0; };
  const auto pairs = align_items(a, b, score);
  REQUIRE(pairs.size() == 2);
  CHECK(pairs[0] == std::make_pair(std::size_t{0}, std::size_t{1}));  // 7 with the first 7, skipping a 3
  CHECK(pairs[1] == std::make_pair(std::size_t{1}, std::size_t{2}));  // then 3 with the last 7 (score 1)
  CHECK(align_items(std::vector<int>{}, b, score).empty());
  CHECK(align_items(a, std::vector<int>{0, 0}, [](int, int) { return 0; }).empty());
}

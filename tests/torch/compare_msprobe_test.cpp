// `torchprobe compare` on the question it exists for: a C++ libtorch run against msprobe's Python
// dump of the same model and seed (../shared/reference-dumps/stat_mix, md5_mix: Net{fc =
// Linear(8, 4)}, relu(fc(x)).sum().backward(), seed 1234, two steps). The C++ side has Aten.t +
// Aten.addmm where Python has Functional.linear: every entry must still pair, and nothing diverge.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <filesystem>
#include <sstream>
#include <string>

#include "torchprobe/analysis/compare/cli.hpp"
#include "reference_program.hpp"
#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;

namespace {
nlohmann::ordered_json compare_step(const std::string& ours, const fs::path& theirs, int step,
                                    tp::compare::JudgeMode mode, int& status) {
  tp::compare::CompareOptions o;
  o.target = ours + "/step" + std::to_string(step);
  o.bench = theirs / ("step" + std::to_string(step));
  o.out = ours + "/out" + std::to_string(step);
  o.mode = mode;
  std::ostringstream log;
  status = tp::compare::run_compare(o, log);
  INFO(log.str());
  REQUIRE(fs::exists(o.out / "first_divergence.json"));
  return tp::compare::read_json_file(o.out / "first_divergence.json");
}
}  // namespace

TEST_CASE("a C++ mix dump pairs entry for entry with msprobe's Python dump of the same model, and nothing diverges") {
  const fs::path ref = fs::path(TORCHPROBE_REFERENCE_DUMPS);
  REQUIRE_MESSAGE((fs::exists(ref / "stat_mix") && fs::exists(ref / "md5_mix")),
                  "no msprobe reference dumps at " << ref);
  for (const char* summary_mode : {"statistics", "md5"}) {
    CAPTURE(summary_mode);
    tptest::TempDir tmp;
    tptest::run_reference_program<tp::Level::Mix>(tmp.path(), summary_mode);
    const fs::path theirs = ref / (std::string(summary_mode) == "md5" ? "md5_mix" : "stat_mix");
    for (int step = 0; step < 2; ++step) {
      CAPTURE(step);
      for (const auto mode : {tp::compare::JudgeMode::tol, tp::compare::JudgeMode::msprobe}) {
        int status = -1;
        const auto r = compare_step(tmp.path(), theirs, step, mode, status);
        CAPTURE(r.dump(1));
        CHECK(status == 0);
        CHECK(r["diverged"] == false);
        // 11 C++ entries (t and addmm forward and backward, relu, sum, the module's three) against
        // msprobe's 9: the module's forward, backward and parameters_grad by name; linear, inside
        // the paired fc module, by alignment; relu and sum by template; forward and backward each.
        // Aten.t's backward is part of linear's.
        CHECK(r["summary"]["target_entries"] == 11);
        CHECK(r["summary"]["bench_entries"] == 9);
        CHECK(r["summary"]["paired_exact"] == 3);
        CHECK(r["summary"]["paired_align"] == 2);
        CHECK(r["summary"]["paired_template"] == 4);
        CHECK(r["summary"]["target_only"] == 0);
        CHECK(r["summary"]["bench_only"] == 0);
      }
    }
    // Step 0 against msprobe's step 1 (another x, accumulated gradients) does diverge.
    int status = -1;
    tp::compare::CompareOptions o;
    o.target = tmp.path() + "/step0";
    o.bench = theirs / "step1";
    o.out = tmp.path() + "/cross";
    std::ostringstream log;
    status = tp::compare::run_compare(o, log);
    CHECK(status == 1);
  }
}

// torchprobe ranks' cross-rank view (analysis/compare/ranks.hpp) on the hand-written three-rank dump
// of tests/data/ranks, changed here one value at a time.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "torchprobe/analysis/compare/ranks.hpp"

namespace fs = std::filesystem;
namespace ranks = torchprobe::compare::ranks;

TEST_CASE("a collective whose output differs on one rank is the first disagreement: that rank, entry and output") {
  const fs::path src = fs::path(TORCHPROBE_TESTS_DIR) / "data" / "ranks" / "step0";
  const fs::path dir = fs::temp_directory_path() / ("tp_ranks_" + std::to_string(::getpid())) / "step0";
  fs::remove_all(dir.parent_path());
  fs::create_directories(dir.parent_path());
  fs::copy(src, dir, fs::copy_options::recursive);
  {  // As committed, the all-reduce's outputs agree and nothing disagrees.
    const ranks::StepView v = ranks::view_step(dir, 0);
    REQUIRE(v.collectives.size() == 1);
    CHECK(v.collectives[0].outputs_agree);
    CHECK_FALSE(v.first.has_value());
  }
  // Rank 1's all-reduce output a little off (a reduction that went wrong on that rank).
  const fs::path dump = dir / "rank1" / "dump.json";
  nlohmann::ordered_json d = nlohmann::ordered_json::parse(std::ifstream(dump));
  d["data"]["Distributed.all_reduce.0.forward"]["output"][0]["Max"] = 0.61;
  std::ofstream(dump) << d.dump(1);

  const ranks::StepView v = ranks::view_step(dir, 0);
  REQUIRE(v.collectives.size() == 1);
  CHECK(v.collectives[0].name == "Distributed.all_reduce.0.forward");
  CHECK(v.collectives[0].entered == std::vector<long>{0, 1, 2});
  CHECK_FALSE(v.collectives[0].inputs_agree);  // each rank's own gradient, as committed
  CHECK_FALSE(v.collectives[0].outputs_agree);
  REQUIRE(v.first.has_value());
  CHECK(v.first->rank == 1);
  CHECK(v.first->entry == "Distributed.all_reduce.0.forward");
  CHECK(v.first->item == "output.0");
  CHECK(v.first->agreeing == std::vector<long>{0, 2});
  std::ostringstream text;
  CHECK(ranks::print_views({v}, text) == 1);
  CHECK(text.str().find("outputs differ") != std::string::npos);
  fs::remove_all(dir.parent_path());
}

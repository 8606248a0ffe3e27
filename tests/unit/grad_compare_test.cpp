// `torchprobe grad-compare` (compare/grad_compare.hpp): msprobe's GradComparator output for the two
// reference comparisons reproduced byte for byte, missing files reported instead of aborting, the
// summary page's suspicious steps, and the three-state sign comparison.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../skip.hpp"
#include "torchprobe/analysis/compare/grad_compare.hpp"
#include "torchprobe/io/npy.hpp"

namespace fs = std::filesystem;
namespace gc = torchprobe::compare::grad;

namespace {

const fs::path kRef = fs::path(TORCHPROBE_REFERENCE_DUMPS) / "grad_probe";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Scratch {
  fs::path path = fs::temp_directory_path() / ("tp_gradcmp_" + std::to_string(::getpid()) + "_" +
                                               std::to_string(reinterpret_cast<std::uintptr_t>(this)));
  Scratch() { fs::create_directories(path); }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

int run(const std::vector<std::string>& args, std::string* out = nullptr, std::string* err = nullptr) {
  std::ostringstream o, e;
  const int rc = gc::run_grad_compare(args, o, e);
  if (out) *out = o.str();
  if (err) *err = e.str();
  return rc;
}

void write_bool_npy(const fs::path& p, const std::vector<std::int64_t>& shape, const std::string& bytes,
                    const char* descr = "|b1") {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << torchprobe::io::npy_header(descr, shape) << bytes;
}

}  // namespace

TEST_CASE("grad-compare writes msprobe's similarities.csv for the reference runs, byte for byte") {
  REQUIRE_MESSAGE(fs::exists(kRef / "L1_runB"), "no msprobe reference dumps at " << kRef.string());
  for (const auto& [a, b, ref] : std::vector<std::tuple<const char*, const char*, const char*>>{
           {"L1", "L1_runB", "compare_L1_vs_L1_runB"}, {"L1", "L2", "compare_L1_vs_L2"}}) {
    CAPTURE(ref);
    Scratch out;
    std::string text;
    CHECK(run({(kRef / a).string(), (kRef / b).string(), "-o", out.path.string()}, &text) == 0);
    CHECK(slurp(out.path / "rank0/similarities.csv") == slurp(kRef / ref / "rank0/similarities.csv"));
    // One picture per parameter and one for summary, as msprobe's similarities_picture/ (SVG, not PNG).
    for (const char* name : {"fc.weight", "fc.bias", "summary"})
      CHECK(
          slurp(out.path / "rank0/similarities_picture" / (std::string(name) + "_similarities.svg")).rfind("<svg", 0) ==
          0);
  }
}

TEST_CASE("the summary page marks step 0 below 0.97 and drops above 0.03, and only those") {
  REQUIRE_MESSAGE(fs::exists(kRef / "L1_runB"), "no msprobe reference dumps at " << kRef.string());
  Scratch out;
  std::string text;
  REQUIRE(run({(kRef / "L1").string(), (kRef / "L1_runB").string(), "-o", out.path.string()}, &text) == 0);
  // fc.weight 0.53125 -> 0.625, fc.bias 1.0 -> 0.75, summary 0.583 -> 0.639 (reference similarities.csv).
  CHECK(text.find("suspicious: rank0: fc.weight: step 0 similarity 0.5312 < 0.97") != std::string::npos);
  CHECK(text.find("suspicious: rank0: fc.bias: step 1 similarity 0.7500 dropped") != std::string::npos);
  CHECK(text.find("suspicious: rank0: summary: step 0 similarity 0.5833") != std::string::npos);
  CHECK(text.find("fc.bias: step 0") == std::string::npos);    // 1.0 at step 0
  CHECK(text.find("fc.weight: step 1") == std::string::npos);  // it rose
  const std::string page = slurp(out.path / "rank0/summary.html");
  CHECK(page.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(page.find("<svg") != std::string::npos);
  CHECK(page.find("src=") == std::string::npos);  // self-contained: nothing loaded from elsewhere
  CHECK(page.find("fc.bias: step 1 similarity 0.7500") != std::string::npos);

  Scratch same;
  REQUIRE(run({(kRef / "L1").string(), (kRef / "L2").string(), "-o", same.path.string()}, &text) == 0);
  CHECK(text.find("suspicious") == std::string::npos);
  CHECK(slurp(same.path / "rank0/summary.html").find("None (first step") != std::string::npos);
}

TEST_CASE("a parameter missing in one step is reported with an empty cell, not an abort") {
  REQUIRE_MESSAGE(fs::exists(kRef / "L1_runB"), "no msprobe reference dumps at " << kRef.string());
  Scratch work;
  fs::copy(kRef / "L1_runB", work.path / "B", fs::copy_options::recursive);
  fs::remove(work.path / "B/rank0/step1/fc.bias.npy");
  std::string out, err;
  CHECK(run({(kRef / "L1").string(), (work.path / "B").string(), "-o", (work.path / "out").string()}, &out, &err) == 1);
  CHECK(err.find("missing: rank0: fc.bias: no file in step1 of run B") != std::string::npos);
  // fc.bias's step 1 cell is empty; summary of step 1 counts fc.weight's 32 elements only (20 agree).
  CHECK(slurp(work.path / "out/rank0/similarities.csv") ==
        "\xEF\xBB\xBFstep,0,1\r\nfc.weight,0.53125,0.625\r\nfc.bias,1.0,\r\nsummary,0.5833333333333334,0.625\r\n");
}

TEST_CASE("grad-compare refuses runs without a common rank and bad arguments, with exit status 2") {
  Scratch work;
  fs::create_directories(work.path / "A/rank0");
  fs::create_directories(work.path / "B/rank1");
  std::string out, err;
  CHECK(run({(work.path / "A").string(), (work.path / "B").string(), "-o", (work.path / "o").string()}, &out, &err) ==
        2);
  CHECK(err.find("no rank{N} directory is in both") != std::string::npos);
  CHECK(run({(work.path / "A").string(), "-o", "x"}, &out, &err) == 2);
  CHECK(err.find("expected RUN_A RUN_B -o OUT") != std::string::npos);
  CHECK(run({"--help"}, &out) == 0);
  CHECK(out.find("usage: torchprobe grad-compare") == 0);
}

TEST_CASE("with sign files in both runs, the three-state agreement goes to similarities_sign.csv") {
  Scratch work;
  // Directions agree everywhere (0 and -2 are both False), signs agree on 2 of 4 elements.
  write_bool_npy(work.path / "A/rank0/step0/w.npy", {4}, std::string("\1\0\0\1", 4));
  write_bool_npy(work.path / "B/rank0/step0/w.npy", {4}, std::string("\1\0\0\1", 4));
  write_bool_npy(work.path / "A/rank0/sign/step0/w.npy", {4}, std::string("\1\0\xff\1", 4), "|i1");
  write_bool_npy(work.path / "B/rank0/sign/step0/w.npy", {4}, std::string("\1\xff\0\1", 4), "|i1");
  CHECK(run({(work.path / "A").string(), (work.path / "B").string(), "-o", (work.path / "o").string()}) == 0);
  CHECK(slurp(work.path / "o/rank0/similarities.csv") == "\xEF\xBB\xBFstep,0\r\nw,1.0\r\nsummary,1.0\r\n");
  CHECK(slurp(work.path / "o/rank0/similarities_sign.csv") == "\xEF\xBB\xBFstep,0\r\nw,0.5\r\nsummary,0.5\r\n");
}

TEST_CASE("npy headers are numpy's: 64-byte aligned, room for the first axis to grow, v1.0") {
  using torchprobe::io::npy_header;
  // The reference file's header, byte for byte (np.save of a (4, 8) bool array).
  const std::string h = npy_header("|b1", {4, 8});
  CHECK(h.size() == 128);
  CHECK(h.substr(0, 10) == std::string("\x93NUMPY\x01\x00\x76\x00", 10));
  CHECK(h.substr(10, 59) == "{'descr': '|b1', 'fortran_order': False, 'shape': (4, 8), }");
  CHECK(h.back() == '\n');
  CHECK(npy_header("|b1", {}).find("'shape': (), }") != std::string::npos);
  CHECK(npy_header("|b1", {7}).find("'shape': (7,), }") != std::string::npos);
  // 20 dimensions push the header past 128 bytes: the next multiple of 64.
  CHECK(npy_header("|b1", std::vector<std::int64_t>(20, 1000)).size() % 64 == 0);
  if (fs::exists(kRef / "L2/rank0/step0/fc.weight.npy"))
    CHECK(slurp(kRef / "L2/rank0/step0/fc.weight.npy").substr(0, 128) == h);
  const auto parsed = torchprobe::io::parse_npy(h + std::string(32, '\1'));
  REQUIRE(parsed);
  CHECK(parsed->shape == std::vector<std::int64_t>{4, 8});
  CHECK(parsed->data.size() == 32);
}

TEST_CASE("a run manifest's torn last line (a crash mid-append) is left out; a file that is not one reads as none") {
  namespace gp = torchprobe::grad_probe;
  Scratch work;
  const std::string dir = work.path.string();
  CHECK_FALSE(gp::read_run_manifest(dir).has_value());
  gp::start_run_manifest(dir, "run-1", "L1");
  gp::append_run_step(dir, 0, {"w", "b"});
  std::ofstream(work.path / gp::kRunManifestName, std::ios::app) << "{\"step\":1,\"params\":[\"w\"";
  const auto m = gp::read_run_manifest(dir);
  REQUIRE(m.has_value());
  CHECK(m->run_id == "run-1");
  CHECK(m->steps.size() == 1);
  CHECK(m->wrote(0, "b"));
  CHECK_FALSE(m->wrote(1, "w"));
  gp::start_run_manifest(dir, "run-2", "L1");  // a new run replaces the old list
  CHECK(gp::read_run_manifest(dir)->steps.empty());
  std::ofstream(work.path / gp::kRunManifestName) << "step,0\n";
  CHECK_FALSE(gp::read_run_manifest(dir).has_value());
}

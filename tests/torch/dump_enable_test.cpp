// dump_enable (msprobe's dynamic start/stop): PrecisionDebugger watches its config file and uses an
// edit from the next step on; "dump_enable": false records nothing; a broken edit keeps the old one.
#include <torch/torch.h>
#include <doctest/doctest.h>

#include <torchprobe/torchprobe.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "test_support.hpp"

namespace tp = torchprobe;
namespace fs = std::filesystem;

namespace {

// Written through a new file and a rename, as editors save.
void write_config(const fs::path& path, const std::string& text) {
  std::ofstream(path.string() + ".new") << text;
  fs::rename(path.string() + ".new", path);
}

std::string config(const fs::path& dump, const std::string& extra) {
  return R"({"task": "statistics", "level": "L1", "dump_path": ")" + dump.string() + "\"" + extra + "}";
}

// The dump.json of step N ("" when the step wrote none).
std::string step_dump(const fs::path& dump, int step) {
  const fs::path dir = dump / ("step" + std::to_string(step));
  if (!fs::exists(dir)) return "";
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename() == "dump.json") return tptest::read_text(e.path().string());
  return "";
}

}  // namespace

TEST_CASE(
    "dump_enable: an edit of the config file is used from the next step; false stops dumping; a broken edit is kept "
    "out") {
  tptest::TempDir tmp;
  const fs::path cfg = fs::path(tmp.path()) / "config.json", dump = fs::path(tmp.path()) / "dump";
  write_config(cfg, config(dump, R"(, "dump_enable": true)"));
  tp::PrecisionDebugger dbg(cfg.string());
  const at::Tensor x = torch::ones({2});
  auto one_step = [&](const std::string& edit) {
    dbg.start();
    x.relu();
    x.neg();
    dbg.stop();
    if (!edit.empty()) write_config(cfg, edit);
    dbg.step();
  };
  one_step(config(dump, R"(, "dump_enable": false)"));                                        // step 0
  one_step(config(dump, R"(, "dump_enable": true, "statistics": {"list": ["neg"]})"));        // step 1
  one_step(R"({"task": "statistics", "level": "L1", "dump_enable": true, "dump_path": 3})");  // step 2
  one_step("");                                                                               // step 3
  dbg.wait_written();
  CHECK(dbg.current_step() == 4);

  const std::string s0 = step_dump(dump, 0), s2 = step_dump(dump, 2), s3 = step_dump(dump, 3);
  CHECK(s0.find("Aten.relu.0.forward") != std::string::npos);  // the file as it was at construction
  CHECK(step_dump(dump, 1).empty());                           // dump_enable false: nothing recorded
  CHECK(s2.find("Aten.neg.0.forward") != std::string::npos);   // the list of the second edit
  CHECK(s2.find("Aten.relu") == std::string::npos);
  CHECK(s3.find("Aten.neg.0.forward") != std::string::npos);  // the broken third edit changed nothing
  CHECK(s3.find("Aten.relu") == std::string::npos);
  const std::string log = tptest::read_text((dump / "dump_error_info.log").string());
  CHECK(log.find("config_reload failed: name=" + cfg.string()) != std::string::npos);
  CHECK(log.find("dump_path") != std::string::npos);
}

TEST_CASE("without dump_enable the config file is read once: an edit changes nothing") {
  tptest::TempDir tmp;
  const fs::path cfg = fs::path(tmp.path()) / "config.json", dump = fs::path(tmp.path()) / "dump";
  write_config(cfg, config(dump, ""));
  tp::PrecisionDebugger dbg(cfg.string());
  for (int step = 0; step < 2; ++step) {
    dbg.start();
    torch::ones({2}).relu();
    dbg.stop();
    write_config(cfg, config(dump, R"(, "statistics": {"list": ["neg"]})"));
    dbg.step();
  }
  dbg.wait_written();
  CHECK(step_dump(dump, 1).find("Aten.relu.0.forward") != std::string::npos);
  CHECK_THROWS_WITH_AS(tp::Options().config_file(cfg.string()).set("dump_enable", "yes").resolve(),
                       doctest::Contains("dump_enable"), tp::ConfigError);
}

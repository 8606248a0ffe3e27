// The "free_benchmark" section (config/free_benchmark.hpp): defaults, values, and every rule of
// classic msprobe's FreeBenchmarkCheckConfig (msprobe-reference.md §7.1), each error naming the key,
// the value and what is allowed; what TorchProbe does not implement yet is refused, not ignored.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "config_support.hpp"

using torchprobe::Config;
using torchprobe::FuzzHandler;
using torchprobe::FuzzStage;
using torchprobe::parse_config;
using torchprobe::PertMode;
using tptest::doc_with;
using tptest::rejection;
using json = nlohmann::json;

namespace {

json fb(json section) { return doc_with({{"task", "free_benchmark"}, {"free_benchmark", std::move(section)}}); }

// The message, and that it names each of `parts`.
void check_rejected(const json& doc, const std::vector<std::string>& parts) {
  const std::string why = rejection(doc);
  INFO(why);
  CHECK(why != "(accepted)");
  for (const std::string& p : parts) CHECK(why.find(p) != std::string::npos);
}

}  // namespace

TEST_CASE("free_benchmark defaults are msprobe's: improve_precision, check, forward, no preheat") {
  const Config c = parse_config(doc_with({{"task", "free_benchmark"}}));
  CHECK(c.free_benchmark.pert_mode == PertMode::ImprovePrecision);
  CHECK(c.free_benchmark.handler_type == FuzzHandler::Check);
  CHECK(c.free_benchmark.fuzz_stage == FuzzStage::Forward);
  CHECK(c.free_benchmark.fuzz_device == "npu");
  CHECK_FALSE(c.free_benchmark.if_preheat);
  CHECK(c.free_benchmark.preheat_step == 15);
  CHECK(c.free_benchmark.max_sample == 20);
  CHECK(c.warnings.empty());
}

TEST_CASE("free_benchmark reads every pert_mode and handler_type msprobe has") {
  const std::vector<std::pair<std::string, PertMode>> modes = {{"improve_precision", PertMode::ImprovePrecision},
                                                               {"add_noise", PertMode::AddNoise},
                                                               {"bit_noise", PertMode::BitNoise},
                                                               {"change_value", PertMode::ChangeValue},
                                                               {"no_change", PertMode::NoChange}};
  for (const auto& [name, mode] : modes) {
    CAPTURE(name);
    CHECK(parse_config(fb({{"pert_mode", name}})).free_benchmark.pert_mode == mode);
  }
  const Config cpu = parse_config(fb({{"pert_mode", "to_cpu"}, {"fuzz_device", "cpu"}, {"handler_type", "fix"}}));
  CHECK(cpu.free_benchmark.pert_mode == PertMode::ToCpu);
  CHECK(cpu.free_benchmark.fuzz_device == "cpu");
  CHECK(cpu.free_benchmark.handler_type == FuzzHandler::Fix);
  // The reference config of shared/reference-dumps/configs/cfg_mstt_fb.json is accepted as it is.
  CHECK(parse_config(fb({{"scope", json::array()},
                         {"list", json::array()},
                         {"fuzz_device", "npu"},
                         {"pert_mode", "improve_precision"},
                         {"handler_type", "check"},
                         {"fuzz_level", "L1"},
                         {"fuzz_stage", "forward"},
                         {"if_preheat", false}}))
            .warnings.empty());
}

TEST_CASE("free_benchmark values outside msprobe's sets are refused with the key and the allowed values") {
  check_rejected(fb({{"pert_mode", "noise"}}),
                 {"\"free_benchmark.pert_mode\"", "\"noise\"", "\"improve_precision\"", "\"to_cpu\""});
  check_rejected(fb({{"handler_type", "repair"}}),
                 {"\"free_benchmark.handler_type\"", "\"repair\"", "\"check\", \"fix\""});
  check_rejected(fb({{"fuzz_level", "L2"}}), {"\"free_benchmark.fuzz_level\"", "\"L2\"", "allowed: \"L1\""});
  check_rejected(fb({{"fuzz_stage", "both"}}),
                 {"\"free_benchmark.fuzz_stage\"", "\"both\"", "\"forward\", \"backward\""});
  check_rejected(fb({{"fuzz_device", "tpu"}}), {"\"free_benchmark.fuzz_device\"", "\"tpu\"", "\"npu\"", "\"cpu\""});
  check_rejected(fb({{"if_preheat", "yes"}}), {"\"free_benchmark.if_preheat\"", "\"yes\"", "true or false"});
  check_rejected(fb({{"pert_mode", 3}}), {"\"free_benchmark.pert_mode\"", "3", "it should be a string"});
}

TEST_CASE("fuzz_device cpu goes with pert_mode to_cpu, and only with it") {
  check_rejected(fb({{"fuzz_device", "cpu"}}),
                 {"\"free_benchmark.fuzz_device\"", "\"cpu\"", "pert_mode is \"improve_precision\"", "\"to_cpu\""});
  check_rejected(fb({{"fuzz_device", "cpu"}, {"pert_mode", "add_noise"}}), {"pert_mode is \"add_noise\""});
  check_rejected(fb({{"pert_mode", "to_cpu"}}),
                 {"\"free_benchmark.pert_mode\"", "\"to_cpu\"", "needs fuzz_device \"cpu\"", "fuzz_device is \"npu\""});
}

TEST_CASE("handler_type fix needs improve_precision or to_cpu, the forward stage and no preheat") {
  for (const char* mode : {"add_noise", "bit_noise", "change_value", "no_change"}) {
    CAPTURE(mode);
    check_rejected(fb({{"handler_type", "fix"}, {"pert_mode", mode}}),
                   {"\"free_benchmark.handler_type\"", "\"fix\"", std::string("pert_mode is \"") + mode + "\"",
                    "\"improve_precision\" or \"to_cpu\""});
  }
  CHECK(parse_config(fb({{"handler_type", "fix"}})).free_benchmark.handler_type == FuzzHandler::Fix);
  check_rejected(fb({{"handler_type", "fix"}, {"fuzz_stage", "backward"}, {"list", {"mul"}}}),
                 {"\"free_benchmark.handler_type\"", "forward stage only", "fuzz_stage is \"backward\""});
  check_rejected(fb({{"handler_type", "fix"}, {"if_preheat", true}}),
                 {"\"free_benchmark.handler_type\"", "if_preheat true", "if_preheat false"});
}

TEST_CASE("fuzz_stage backward needs a list of APIs") {
  check_rejected(fb({{"fuzz_stage", "backward"}}),
                 {"\"free_benchmark.list\"", "[]", "list is empty", "a non-empty list of API names"});
}

TEST_CASE("preheat counts must be positive integers when preheating, as msprobe checks them") {
  for (const json& bad : {json(0), json(-3), json(true), json(1.5), json("15")}) {
    CAPTURE(bad.dump());
    check_rejected(fb({{"if_preheat", true}, {"preheat_step", bad}}),
                   {"\"free_benchmark.preheat_step\"", bad.dump(), "an integer greater than 0"});
    check_rejected(fb({{"if_preheat", true}, {"max_sample", bad}}),
                   {"\"free_benchmark.max_sample\"", bad.dump(), "an integer greater than 0"});
  }
  // Without preheating msprobe does not read them.
  CHECK(parse_config(fb({{"preheat_step", 0}, {"max_sample", "x"}})).free_benchmark.preheat_step == 15);
}

TEST_CASE("fuzz_stage backward is accepted with a list") {
  const Config c = parse_config(fb({{"fuzz_stage", "backward"}, {"list", {"matmul"}}}));
  CHECK(c.free_benchmark.fuzz_stage == FuzzStage::Backward);
}

TEST_CASE("if_preheat true is accepted with its counts") {
  const Config c = parse_config(fb({{"if_preheat", true}, {"preheat_step", 4}, {"max_sample", 2}}));
  CHECK(c.free_benchmark.if_preheat);
  CHECK(c.free_benchmark.preheat_step == 4);
  CHECK(c.free_benchmark.max_sample == 2);
}

TEST_CASE("free_benchmark keys in another task's section are reported as ignored") {
  const Config c = parse_config(doc_with({{"task", "statistics"}, {"statistics", {{"pert_mode", "add_noise"}}}}));
  CHECK(c.free_benchmark.pert_mode == PertMode::ImprovePrecision);
  // Without a task list every known section key counts as read; with one, the statistics task does not read it.
  const torchprobe::TaskCatalog implemented{{torchprobe::Task::Statistics, {torchprobe::Level::L1}, {}}};
  const Config d =
      parse_config(doc_with({{"task", "statistics"}, {"statistics", {{"pert_mode", "add_noise"}}}}), &implemented);
  bool warned = false;
  for (const std::string& w : d.warnings)
    warned = warned ||
             w.find("\"statistics.pert_mode\" is ignored: task \"statistics\" does not use it") != std::string::npos;
  CHECK(warned);
}

// What the `torchprobe` tool does with libtorch, in a module of its own that the tool loads only
// when a command needs it (torch_module.hpp): `run_ut` (the API accuracy pre-check, which replays
// operators) and the tensor-mode cells of `compare` (which read .pt files). Loading libtorch costs
// a start of 0.6 s and 160 MB of memory, which every other command (compare of statistics dumps,
// grad-compare, ranks, recover) no longer pays.
#include <array>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "torch_module.hpp"
#include "torchprobe/analysis/run_ut/blame_replay.hpp"
#include "torchprobe/analysis/compare/tensor_metrics.hpp"
#include "torchprobe/analysis/run_ut/cli_options.hpp"
#include "torchprobe/analysis/run_ut/runner.hpp"

extern "C" TORCHPROBE_CLI_MODULE_EXPORT void torchprobe_cli_pt_cells(const std::filesystem::path* npu,
                                                                     const std::filesystem::path* bench,
                                                                     std::array<std::string, 6>* cells,
                                                                     std::string* error) {
  *cells = torchprobe::compare::pt_tensor_cells(*npu, *bench, error);
}

extern "C" TORCHPROBE_CLI_MODULE_EXPORT void torchprobe_cli_blame(const std::string* request, std::string* answer,
                                                                  std::string* error) {
  try {
    *answer = torchprobe::run_ut::blame_replay(nlohmann::ordered_json::parse(*request)).dump();
  } catch (const std::exception& e) {
    *error = e.what();
  }
}

extern "C" TORCHPROBE_CLI_MODULE_EXPORT int torchprobe_cli_run_ut(const std::vector<std::string>* arguments) {
  const std::vector<std::string>& args = *arguments;
  namespace ru = torchprobe::run_ut;
  for (const auto& a : args) {
    if (a == "-h" || a == "--help") {
      std::cout << ru::run_ut_usage();
      return 0;
    }
  }
  ru::CliOptions cli;
  try {
    cli = ru::parse_run_ut_args(args);
  } catch (const ru::UsageError& e) {
    std::cerr << "torchprobe run_ut: " << e.what() << "\n" << ru::run_ut_usage();
    return 2;
  }
  for (const auto& note : cli.notes) std::cerr << "torchprobe run_ut: " << note << "\n";
  ru::RunOptions o;
  static_cast<ru::RunSettings&>(o) = cli;  // what the command line and -config asked for
  o.replay.float64_bench = cli.float64_bench;
  try {
    o.replay.device = ru::replay_device(cli.device);
  } catch (const std::invalid_argument& e) {
    std::cerr << "torchprobe run_ut: " << e.what() << "\n";
    return 2;
  }
  try {
    const ru::RunOutput out = ru::run(o);
    ru::print_summary(std::cout, out.summary);
    std::cout << "result:  " << out.result_csv << "\ndetails: " << out.details_csv << "\nverdicts: " << out.verdicts_csv
              << "\n";
    if (!out.error_dir.empty()) std::cout << "error data: " << out.error_dir << "\n";
  } catch (const std::exception& e) {
    std::cerr << "torchprobe run_ut: " << e.what() << "\n";
    return 2;
  }
  return 0;
}

// `torchprobe run_ut`: the API accuracy pre-check (include/torchprobe/analysis/run_ut/). Its own translation
// unit because it needs libtorch to replay the operators; the rest of the CLI does not.
#include <iostream>
#include <string>
#include <vector>

#include "torchprobe/analysis/run_ut/cli_options.hpp"
#include "torchprobe/analysis/run_ut/runner.hpp"

int torchprobe_run_ut_main(const std::vector<std::string>& args) {
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
  o.api_info = cli.api_info;
  o.out_dir = cli.out_dir;
  o.save_error_data = cli.save_error_data;
  o.error_data_path = cli.error_data_path;
  o.continue_csv = cli.csv_path;
  o.filter_duplicates = cli.filter_duplicates;
  o.jobs = cli.jobs;
  o.white_list = cli.white_list;
  o.black_list = cli.black_list;
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

// The `torchprobe` command-line tool. Subcommands:
//   torchprobe compare TARGET BENCH -o OUT [...]   two dumps in, msprobe's CSV and the first divergence out
//   torchprobe grad-compare RUN_A RUN_B -o OUT     two grad_probe runs in, msprobe's similarities.csv out
//   torchprobe run_ut -api_info DUMP.json -o OUT [...]   replay each API against an up-cast benchmark (run_ut.cpp)
// Everything it does lives in headers (include/torchprobe/compare/, run_ut/), which the tests use too.
#include <iostream>
#include <string>
#include <vector>

#include <unistd.h>

#include "torchprobe/compare/cli.hpp"
#include "torchprobe/compare/grad_compare.hpp"
#include "torchprobe/compare/tensor_metrics.hpp"
#include "torchprobe/version.hpp"

int torchprobe_run_ut_main(const std::vector<std::string>& args);  // run_ut.cpp

namespace {
const char* kUsage =
    "usage: torchprobe <command> [args]\n"
    "commands:\n"
    "  compare       compare two dumps (run 'torchprobe compare --help')\n"
    "  grad-compare  compare two grad_probe runs (run 'torchprobe grad-compare --help')\n"
    "  run_ut        API accuracy pre-check of a dump (run 'torchprobe run_ut --help')\n"
    "  --version     print the version\n";
}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    std::cout << kUsage;
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::cout << "torchprobe " << TORCHPROBE_VERSION_STRING << "\n";
    return 0;
  }
  if (args[0] == "compare") {
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    for (const auto& a : rest) {
      if (a == "-h" || a == "--help") {
        std::cout << torchprobe::compare::compare_usage();
        return 0;
      }
    }
    torchprobe::compare::CompareOptions options;
    try {
      options = torchprobe::compare::parse_compare_args(rest);
    } catch (const torchprobe::compare::InputError& e) {
      std::cerr << "torchprobe compare: " << e.what() << "\n" << torchprobe::compare::compare_usage();
      return 2;
    }
    options.progress_tty = ::isatty(STDERR_FILENO) == 1;
    options.pt_cells = [](const std::filesystem::path& npu, const std::filesystem::path& bench) {
      std::string error;
      auto cells = torchprobe::compare::pt_tensor_cells(npu, bench, &error);
      if (!error.empty()) std::cerr << "torchprobe compare: " << error << " (its metrics are 'unsupported')\n";
      return cells;
    };
    return torchprobe::compare::run_compare(options, std::cerr);
  }
  if (args[0] == "grad-compare")
    return torchprobe::compare::grad::run_grad_compare({args.begin() + 1, args.end()}, std::cout, std::cerr);
  if (args[0] == "run_ut") return torchprobe_run_ut_main(std::vector<std::string>(args.begin() + 1, args.end()));
  std::cerr << "torchprobe: unknown command '" << args[0] << "'\n" << kUsage;
  return 2;
}

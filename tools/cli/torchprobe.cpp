// The `torchprobe` command-line tool: a table of subcommands (kSubcommands below), each a function
// from its arguments to its exit status.
//   compare TARGET BENCH -o OUT [...]        two dumps in, msprobe's CSV and the first divergence out
//   grad-compare RUN_A RUN_B -o OUT          two grad_probe runs in, msprobe's similarities.csv out
//   run_ut -api_info DUMP.json -o OUT [...]  replay each API against an up-cast benchmark (torch_module.cpp)
//   api_precision_compare -npu A.csv -gpu B.csv -o OUT   two run_ut details CSVs in, msprobe's verdicts out
//   ranks DUMP                               a step's ranks side by side
//   recover DUMP [--check] [--keep-journal]  interrupted steps rebuilt from their journals (io/recovery.hpp)
// What each does lives in headers (include/torchprobe/analysis/, io/recovery.hpp), which the tests use too.
#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <iostream>
#include <string>
#include <vector>

#include <unistd.h>

#include "torch_module.hpp"
#include "torchprobe/analysis/compare/cli.hpp"
#include "torchprobe/analysis/compare/grad_compare.hpp"
#include "torchprobe/analysis/compare/huge_pages.hpp"
#include "torchprobe/io/files.hpp"
#include "torchprobe/io/recovery.hpp"
#include "torchprobe/analysis/compare/ranks.hpp"
#include "torchprobe/analysis/run_ut/precision_compare.hpp"
#include "torchprobe/io/timestamp.hpp"
#include "torchprobe/version.hpp"

namespace {
const char* kPrecisionUsage =
    "usage: torchprobe api_precision_compare -npu TARGET_DETAILS.csv -gpu BENCH_DETAILS.csv [-o OUT]\n"
    "  judges each output of the target's run_ut details CSV against the bench device's (msprobe's\n"
    "  api_precision_compare) and writes api_precision_compare_{result,details}_{ts}.csv under OUT\n";

int api_precision_compare_main(const std::vector<std::string>& args) {
  namespace pc = torchprobe::run_ut::precision;
  std::string npu, gpu, out = ".";
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::cout << kPrecisionUsage;
      return 0;
    }
    std::string* target = a == "-npu" || a == "--npu_csv_path"   ? &npu
                          : a == "-gpu" || a == "--gpu_csv_path" ? &gpu
                          : a == "-o" || a == "--out_path"       ? &out
                                                                 : nullptr;
    if (!target || i + 1 >= args.size()) {
      std::cerr << "torchprobe api_precision_compare: "
                << (target ? a + " needs a value" : "unknown argument '" + a + "'") << "\n"
                << kPrecisionUsage;
      return 2;
    }
    *target = args[++i];
  }
  const auto is_csv = [](const std::string& p) { return p.size() > 4 && p.compare(p.size() - 4, 4, ".csv") == 0; };
  if (!is_csv(npu) || !is_csv(gpu)) {
    std::cerr << "torchprobe api_precision_compare: -npu and -gpu must name details CSVs (.csv)\n" << kPrecisionUsage;
    return 2;
  }
  try {
    torchprobe::io::create_directories(out);
    const std::string ts = torchprobe::io::compact_local_timestamp();
    const pc::Outcome o = pc::api_precision_compare(npu, gpu, out + "/api_precision_compare_result_" + ts + ".csv",
                                                    out + "/api_precision_compare_details_" + ts + ".csv");
    for (const auto& w : o.warnings) std::cerr << "torchprobe api_precision_compare: warning: " << w << "\n";
    std::cout << "result:  " << o.result_csv << "\ndetails: " << o.details_csv << "\n";
    if (!o.error.empty()) {
      std::cerr << "torchprobe api_precision_compare: stopped: " << o.error << "\n";
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "torchprobe api_precision_compare: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
}  // namespace

// A big compare starts again with huge pages (huge_pages.hpp: a third of its time was page faults).
// It does so from the program's preinit array, before any library's initializers run (the tool
// no longer links libtorch, whose took 0.6 s, but glibc reads its tunables only at start anyway). Only libc and plain
// library code (the argument parser, a directory walk) run this early; any doubt, and main goes on with normal pages.
// Not under a sanitizer, whose runtime starts there too.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
static void huge_pages_for_a_big_compare(int argc, char** argv, char** envp) {
  if (argc < 2 || std::strcmp(argv[1], "compare") != 0) return;
  try {
    const auto o = torchprobe::compare::parse_compare_args(std::vector<std::string>(argv + 2, argv + argc));
    if (torchprobe::compare::dump_json_bytes({o.target, o.bench}) >= torchprobe::compare::kHugePagesFromBytes)
      torchprobe::compare::rerun_with_huge_pages(argv, envp);
  } catch (...) {  // bad arguments: main says so
  }
}
__attribute__((section(".preinit_array"),
               used)) static void (*preinit_huge_pages)(int, char**, char**) = huge_pages_for_a_big_compare;
#endif

namespace {
// Every subcommand has one shape: its arguments in, the exit status out (llvm-cov's table of
// xMain functions). main only finds the row; the usage text is made from the table.
using SubcommandMain = int (*)(const std::vector<std::string>& args);

bool asks_for_help(const std::vector<std::string>& args) {
  return std::find_if(args.begin(), args.end(), [](const std::string& a) { return a == "-h" || a == "--help"; }) !=
         args.end();
}

int compare_main(const std::vector<std::string>& args) {
  namespace cmp = torchprobe::compare;
  if (asks_for_help(args)) {
    std::cout << cmp::compare_usage();
    return 0;
  }
  cmp::CompareOptions options;
  try {
    options = cmp::parse_compare_args(args);
  } catch (const cmp::InputError& e) {
    std::cerr << "torchprobe compare: " << e.what() << "\n" << cmp::compare_usage();
    return 2;
  }
  options.progress_tty = ::isatty(STDERR_FILENO) == 1;
  options.exit_after = true;  // main returns right after run_compare
  options.pt_cells = [](const std::filesystem::path& npu, const std::filesystem::path& bench) {
    std::string error;
    std::array<std::string, 6> cells;
    torchprobe_cli::TorchModule::get().pt_cells(&npu, &bench, &cells, &error);
    if (!error.empty()) std::cerr << "torchprobe compare: " << error << " (its metrics are 'unsupported')\n";
    return cells;
  };
  options.blame_fn = [](const nlohmann::ordered_json& request) {
    const std::string text = request.dump();
    std::string answer, error;
    torchprobe_cli::TorchModule::get().blame(&text, &answer, &error);
    if (!error.empty()) throw std::runtime_error(error);
    return nlohmann::ordered_json::parse(answer);
  };
  return cmp::run_compare(options, std::cerr);
}

int grad_compare_main(const std::vector<std::string>& args) {
  return torchprobe::compare::grad::run_grad_compare(args, std::cout, std::cerr);
}

int ranks_main(const std::vector<std::string>& args) {
  torchprobe::compare::ranks::ViewOptions options;
  std::vector<std::string> paths;
  for (const std::string& a : args) {
    if (a == "--grads-reduced")
      options.grads_reduced = true;
    else if (a == "--no-digest")
      options.digests = false;
    else
      paths.push_back(a);
  }
  if (paths.size() != 1 || asks_for_help(args)) {
    std::cerr << "usage: torchprobe ranks [--grads-reduced] [--no-digest] STEP_DIR_OR_DUMP_ROOT\n"
                 "  --grads-reduced  the gradients are reduced inside backward (DDP): every parameters_grad\n"
                 "                   is replicated (without it, only those the dump shows reduced first)\n"
                 "  --no-digest      read every rank's dump.json even where the ranks have ranks_digest.bin\n"
                 "                   (the digests keep collectives, module parameters and gradients only)\n";
    return paths.size() == 1 ? 0 : 2;
  }
  try {
    namespace ranks = torchprobe::compare::ranks;
    return ranks::print_views(ranks::view_dump(paths[0], options), std::cout);
  } catch (const std::exception& e) {
    std::cerr << "torchprobe ranks: " << e.what() << "\n";
    return 2;
  }
}

int recover_main(const std::vector<std::string>& args) {
  return torchprobe::io::recovery::run_recover(args, std::cout, std::cerr);
}

int run_ut_main(const std::vector<std::string>& args) {  // in the libtorch module (torch_module.cpp)
  try {
    return torchprobe_cli::TorchModule::get().run_ut(&args);
  } catch (const std::runtime_error& e) {
    std::cerr << "torchprobe run_ut: " << e.what() << "\n";
    return 2;
  }
}

int version_main(const std::vector<std::string>&) {
  std::cout << "torchprobe " << TORCHPROBE_VERSION_STRING << "\n";
  return 0;
}

struct Subcommand {
  const char* name;
  const char* summary;  // the usage text's lines for it, after the name
  SubcommandMain main;
};

const Subcommand kSubcommands[] = {
    {"compare", "compare two dumps (run 'torchprobe compare --help')", compare_main},
    {"grad-compare", "compare two grad_probe runs (run 'torchprobe grad-compare --help')", grad_compare_main},
    {"run_ut", "API accuracy pre-check of a dump (run 'torchprobe run_ut --help')", run_ut_main},
    {"api_precision_compare", "judge a target's run_ut details CSV against a bench device's",
     api_precision_compare_main},
    {"ranks",
     "[--grads-reduced] [--no-digest] DUMP  a step's ranks side by side: who entered each collective, whether\n"
     "inputs and outputs agreed, the first rank/op where replicated data (module parameters,\n"
     "collective outputs) disagrees (DUMP: a step dir or dump root; exit status 0 all agree,\n"
     "1 a disagreement, 2 bad input)",
     ranks_main},
    {"recover",
     "DUMP  rebuild the files of interrupted steps from their journals, say what could not be\n"
     "recovered ([--check] [--keep-journal]; exit status 0 whole, 3 a step incomplete or lost,\n"
     "1 a path missing or a journal unreadable; run 'torchprobe recover --help')",
     recover_main},
    {"--version", "print the version", version_main},
};

std::string usage() {
  std::string text = "usage: torchprobe <command> [args]\ncommands:\n";
  for (const Subcommand& c : kSubcommands) {
    std::string name = std::string("  ") + c.name;
    const std::string indent(16, ' ');
    text += name + (name.size() < indent.size() ? std::string(indent.size() - name.size(), ' ') : "  ");
    for (const char* s = c.summary; *s != '\0'; ++s) text += *s == '\n' ? "\n" + indent : std::string(1, *s);
    text += "\n";
  }
  return text;
}
}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    std::cout << usage();
    return args.empty() ? 2 : 0;
  }
  for (const Subcommand& c : kSubcommands)
    if (args[0] == c.name) return c.main({args.begin() + 1, args.end()});
  std::cerr << "torchprobe: unknown command '" << args[0] << "'\n" << usage();
  return 2;
}

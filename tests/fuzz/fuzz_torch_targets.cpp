// The fuzz targets whose readers need libtorch: the config parser with the built-in task catalog,
// the .pt reader of compare and run_ut, and run_ut's rebuilding of a call's inputs from a dump entry.
#include <torch/serialize.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include "fuzz_target.hpp"
#include "torchprobe/analysis/compare/tensor_metrics.hpp"
#include "torchprobe/analysis/run_ut/inputs.hpp"
#include "torchprobe/config/config.hpp"
#include "torchprobe/task/registry.hpp"

namespace torchprobe::fuzz {
namespace {

namespace fs = std::filesystem;

// A config file as Debugger and PrecisionDebugger read it: parsed, then checked against the tasks
// TorchProbe has. A refusal is a ConfigError; any other exception is a finding.
void config(std::string_view input) {
  clear_scratch();
  write_bytes(scratch() / "config.json", input);
  try {
    (void)load_config_file((scratch() / "config.json").string(), &BuiltinTasks::catalog());
  } catch (const ConfigError&) {
  }
}

void pt(std::string_view input) {
  clear_scratch();
  const fs::path file = scratch() / "x.pt";
  write_bytes(file, input);
  try {
    (void)compare::read_pt_values(file);
  } catch (const std::exception&) {
  }
  try {
    (void)run_ut::load_pt(file.string());
  } catch (const std::exception&) {
  }
}

// Outside the data directory run_ut reads: a tensor that must never be read through a data_name.
constexpr double kOutsideMarker = 4242.4242;

const fs::path& run_ut_data() {
  static const fs::path dir = [] {
    const fs::path root = scratch().parent_path() / (scratch().filename().string() + "-run_ut");
    fs::create_directories(root / "dump_tensor_data");
    const auto save = [](const fs::path& f, const at::Tensor& t) {
      const std::vector<char> bytes = torch::pickle_save(t);
      std::ofstream(f, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    };
    save(root / "dump_tensor_data" / "Torch.add.0.forward.input.0.pt", at::arange(6, at::kFloat).reshape({2, 3}));
    save(root / "outside.pt", at::full({1}, kOutsideMarker, at::kDouble));
    return root / "dump_tensor_data";
  }();
  return dir;
}

void check_not_outside(const run_ut::Arg& a) {
  if (a.value.isTensor()) {
    const at::Tensor t = a.value.toTensor();
    if (t.numel() == 1 && t.scalar_type() == at::kDouble && t.item<double>() == kOutsideMarker) {
      std::fprintf(stderr, "run_ut read a tensor outside its data directory\n");
      std::abort();
    }
  }
  for (const auto& i : a.items) check_not_outside(i);
}

// run_ut: a dump.json's API entries, each forward call's inputs rebuilt as run_ut rebuilds them
// (tensors from .pt files in the data directory, or drawn within the statistics).
void run_ut_inputs(std::string_view input) {
  run_ut::Dump dump;
  try {
    dump = run_ut::parse_dump(compare::parse_json_text(input), "fuzz/dump.json");
  } catch (const std::exception&) {
    return;
  }
  for (const auto& c : dump.cases) {
    if (!c.forward.is_object()) continue;
    try {
      run_ut::InputBuilder build(run_ut_data().string(), c.name);
      build.set_max_tensor_bytes(std::int64_t(64) << 20);
      const auto& fa = c.forward.contains("input_args") ? c.forward["input_args"] : run_ut::Json::array();
      const auto& fk = c.forward.contains("input_kwargs") ? c.forward["input_kwargs"] : run_ut::Json::object();
      if (fa.is_array())
        for (const auto& a : fa) check_not_outside(build.build(a));
      if (fk.is_object())
        for (const auto& [k, v] : fk.items()) check_not_outside(build.build(v));
    } catch (const std::exception&) {
    }
  }
}

}  // namespace

const std::vector<Target>& torch_targets() {
  static const std::vector<Target> targets = {
      {"config", "config.json, as Debugger and PrecisionDebugger read it (with the built-in task catalog)", config},
      {"pt", ".pt tensor file, as compare's tensor mode and run_ut read it", pt},
      {"run_ut_inputs", "dump.json, each API call's inputs rebuilt as run_ut rebuilds them", run_ut_inputs},
  };
  return targets;
}

}  // namespace torchprobe::fuzz

#pragma once
// The validated configuration and its value types: what parse_config (config/parser.hpp) makes of
// msprobe's config.json, cut down to what TorchProbe implements.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchprobe/core/kinds.hpp"

namespace torchprobe {

// Thrown for every invalid configuration; the message names the key, the bad value and what is allowed.
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

enum class SummaryMode { Statistics, Md5, Xor };
// free_benchmark (classic msprobe's FreeBenchmarkCheckConfig): how each call is perturbed, what is
// done with the result, and which pass is checked.
enum class PertMode { ImprovePrecision, AddNoise, BitNoise, ChangeValue, NoChange, ToCpu };
enum class FuzzHandler { Check, Fix };
enum class FuzzStage { Forward, Backward };
enum class RiskLevel { All, Focus, Core };

// Spellings used in config.json.
constexpr std::string_view summary_mode_name(SummaryMode m) {
  switch (m) {
    case SummaryMode::Statistics: return "statistics";
    case SummaryMode::Md5: return "md5";
    case SummaryMode::Xor: return "xor";
  }
  return "?";
}

constexpr std::string_view pert_mode_name(PertMode m) {
  switch (m) {
    case PertMode::ImprovePrecision: return "improve_precision";
    case PertMode::AddNoise: return "add_noise";
    case PertMode::BitNoise: return "bit_noise";
    case PertMode::ChangeValue: return "change_value";
    case PertMode::NoChange: return "no_change";
    case PertMode::ToCpu: return "to_cpu";
  }
  return "?";
}

constexpr std::string_view risk_level_name(RiskLevel r) {
  switch (r) {
    case RiskLevel::All: return "ALL";
    case RiskLevel::Focus: return "FOCUS";
    case RiskLevel::Core: return "CORE";
  }
  return "?";
}

// msprobe's data_mode: which directions (forward/backward) and which sides
// (input/output) of an entry are dumped. A key is dumped iff both its direction and its side are allowed.
struct DataMode {
  bool forward = true, backward = true, input = true, output = true;

  // What is dumped, by direction and side (msprobe's data_mode: "all", "forward", "input", ...).
  bool forward_inputs() const { return forward && input; }
  bool forward_outputs() const { return forward && output; }
  bool backward_inputs() const { return backward && input; }
  bool backward_outputs() const { return backward && output; }
  bool any_backward() const { return backward_inputs() || backward_outputs(); }
  // Module "parameters" ride on the forward output (msprobe collects them with it).
  bool allows_parameters() const { return forward_outputs(); }
  // parameters_grad entries: msprobe registers the grad hooks only when backward is dumped.
  bool allows_parameter_grads() const { return backward; }

  static DataMode parse(const std::vector<std::string>& modes);  // throws ConfigError
};

// A step or rank selection. Empty means "every step / every rank", as in msprobe.
class IndexSet {
 public:
  static constexpr int64_t kMax = 1000000;  // msprobe's bound for indices and for the list length

  bool all() const { return values_.empty(); }
  bool contains(int64_t v) const { return all() || std::binary_search(values_.begin(), values_.end(), v); }
  const std::vector<int64_t>& values() const { return values_; }  // sorted, without duplicates
  std::optional<int64_t> max() const {
    if (values_.empty()) return std::nullopt;
    return values_.back();
  }

  // A JSON list of integers and "a" / "a-b" strings; null counts as [].
  static IndexSet parse(const nlohmann::json& value, const std::string& key);

 private:
  std::vector<int64_t> values_;
};

// The "free_benchmark" section (config/free_benchmark.hpp checks it; docs/free_benchmark.md).
struct FreeBenchmarkConfig {
  std::string fuzz_device = "npu";  // "cpu" exactly when pert_mode is to_cpu; else the tensors' own device
  PertMode pert_mode = PertMode::ImprovePrecision;
  FuzzHandler handler_type = FuzzHandler::Check;
  FuzzStage fuzz_stage = FuzzStage::Forward;
  bool if_preheat = false;
  int64_t preheat_step = 15;
  int64_t max_sample = 20;  // msprobe's documented default (its code falls back to preheat_step's 15)
};

// The "grad_probe" section (config/grad_probe.hpp checks it; docs/grad_probe.md). A bound keeps the
// text Python's str() gives its JSON number ("-1", "0.1", "1e-05"): it names the CSV's interval columns.
enum class GradLevel { L0, L1, L2 };
struct GradBound {
  double value;
  std::string text;
};
struct GradProbeConfig {
  GradLevel grad_level = GradLevel::L1;
  std::vector<std::string> param_list;  // exact named_parameters() names; empty = every parameter
  std::vector<GradBound> bounds{{-1.0, "-1"}, {0.0, "0"}, {1.0, "1"}};
};

// The "run_ut" section (config/run_ut.hpp; docs/run_ut.md): bare API names ("linear", "__add__",
// "linalg.inv") and the directory -save_error_data writes under.
struct RunUtConfig {
  std::vector<std::string> white_list, black_list;
  std::string error_data_path = "./";
};

struct Config {
  TaskName task = Task::Statistics;
  Level level = Level::L1;
  std::string dump_path;
  IndexSet step, rank;
  bool async_dump = false;
  // dump_enable: absent = a static configuration; present = the config file is watched and re-read
  // at step() (PrecisionDebugger), and false means start() does not dump.
  std::optional<bool> dump_enable;
  bool extra_info = true;
  std::string precision = "low";
  // msprobe's seed / is_deterministic: when either is in the configuration, a Debugger calls
  // seed_all(seed or 1234, is_deterministic) as it is constructed (seed.hpp).
  std::optional<std::uint32_t> seed;
  bool is_deterministic = false;
  // msprobe defaults to FOCUS; a C++ user who asks for a dump expects every op, so TorchProbe says ALL.
  RiskLevel risk_level = RiskLevel::All;
  // TorchProbe's own: memory (MiB) that tensor snapshots waiting to be written may hold before the
  // training thread waits for the writer (tensor task, tensor_list, save()).
  int64_t max_pending_mb = 1024;
  // TorchProbe's own: a process with a rank writes ranks_digest.bin beside dump.json, what
  // `torchprobe ranks` reads of each rank (io/rank_digest.hpp); false: not written.
  bool rank_digest = true;
  // Options().process_group(pg): that group's rank, used when start() names no rank_id.
  std::optional<int64_t> group_rank;

  // Keys of the task's own section ("statistics": {...}, "tensor": {...}, ...).
  std::vector<std::string> scope, list, tensor_list;
  DataMode data_mode;
  SummaryMode summary_mode = SummaryMode::Statistics;
  int64_t overflow_nums = 1;  // "overflow_check" section; -1 = no limit
  // The live check (statistics and tensor sections): a reference dump.json (or its directory) each
  // entry is judged against while the run goes on, and how many differing entries get their
  // tensors saved (-1 = no limit). Empty: no check.
  std::string bench_path;
  int64_t diff_nums = 1;
  FreeBenchmarkConfig free_benchmark;
  GradProbeConfig grad_probe;
  RunUtConfig run_ut;

  // Unknown keys, ignored keys and forced values: one readable sentence each.
  std::vector<std::string> warnings;
};

}  // namespace torchprobe

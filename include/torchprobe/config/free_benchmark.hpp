#pragma once
// The "free_benchmark" section: classic msprobe's FreeBenchmarkCheckConfig, its values and the rules
// that tie them together (msprobe-reference.md §7.1), each violation named by key, value and what is
// allowed.
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "torchprobe/config/readers.hpp"
#include "torchprobe/config/types.hpp"

namespace torchprobe {

namespace details {

// preheat_step / max_sample: an integer > 0 (booleans are not integers).
inline int64_t read_positive_count(const json& section, const char* key, const std::string& label, int64_t fallback) {
  const json* v = find(section, key);
  if (!v) return fallback;
  const std::string allowed = "an integer greater than 0";
  if (v->is_boolean() || !v->is_number_integer()) reject(label, *v, "it should be an integer", allowed);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    reject(label, *v, "it is too large", allowed);
  if (v->get<int64_t>() <= 0) reject(label, *v, "it is not greater than 0", allowed);
  return v->get<int64_t>();
}

// `label(key)` spells a key as the messages show it: "free_benchmark.pert_mode".
template <class Label>
FreeBenchmarkConfig parse_free_benchmark(const json& section, const std::vector<std::string>& list, Label&& label) {
  FreeBenchmarkConfig f;
  static constexpr Choice<std::string_view> kDevices[] = {{"npu", "npu"}, {"cuda", "cuda"}, {"cpu", "cpu"}};
  f.fuzz_device =
      std::string(read_choice(section, "fuzz_device", label("fuzz_device"), kDevices, std::string_view("npu")));
  static constexpr Choice<PertMode> kModes[] = {{"improve_precision", PertMode::ImprovePrecision},
                                                {"add_noise", PertMode::AddNoise},
                                                {"bit_noise", PertMode::BitNoise},
                                                {"change_value", PertMode::ChangeValue},
                                                {"no_change", PertMode::NoChange},
                                                {"to_cpu", PertMode::ToCpu}};
  f.pert_mode = read_choice(section, "pert_mode", label("pert_mode"), kModes, PertMode::ImprovePrecision);
  static constexpr Choice<FuzzHandler> kHandlers[] = {{"check", FuzzHandler::Check}, {"fix", FuzzHandler::Fix}};
  f.handler_type = read_choice(section, "handler_type", label("handler_type"), kHandlers, FuzzHandler::Check);
  static constexpr Choice<int> kLevels[] = {{"L1", 1}};
  read_choice(section, "fuzz_level", label("fuzz_level"), kLevels, 1);
  static constexpr Choice<FuzzStage> kStages[] = {{"forward", FuzzStage::Forward}, {"backward", FuzzStage::Backward}};
  f.fuzz_stage = read_choice(section, "fuzz_stage", label("fuzz_stage"), kStages, FuzzStage::Forward);
  if (const json* v = find(section, "if_preheat"); v && !v->is_boolean())
    reject(label("if_preheat"), *v, "it should be a boolean", "true or false");
  f.if_preheat = read_bool(section, "if_preheat", false);
  if (f.if_preheat) {  // msprobe reads the counts only when preheating
    f.preheat_step = read_positive_count(section, "preheat_step", label("preheat_step"), f.preheat_step);
    f.max_sample = read_positive_count(section, "max_sample", label("max_sample"), f.max_sample);
  }

  // msprobe's rules between the keys.
  const std::string mode = quote(pert_mode_name(f.pert_mode));
  if (f.fuzz_device == "cpu" && f.pert_mode != PertMode::ToCpu)
    reject(label("fuzz_device"), "cpu",
           "fuzz_device \"cpu\" goes with pert_mode \"to_cpu\" only, and pert_mode is " + mode,
           "\"npu\" (the device the tensors are on) unless pert_mode is \"to_cpu\"");
  if (f.pert_mode == PertMode::ToCpu && f.fuzz_device != "cpu")
    reject(label("pert_mode"), "to_cpu",
           "pert_mode \"to_cpu\" needs fuzz_device \"cpu\", and fuzz_device is " + quote(f.fuzz_device),
           "\"to_cpu\" with fuzz_device \"cpu\", or another mode");
  if (f.handler_type == FuzzHandler::Fix) {
    if (f.pert_mode != PertMode::ImprovePrecision && f.pert_mode != PertMode::ToCpu)
      reject(label("handler_type"), "fix",
             "handler_type \"fix\" needs a pert_mode that computes better values, and pert_mode is " + mode,
             "\"fix\" with pert_mode \"improve_precision\" or \"to_cpu\", or \"check\"");
    if (f.fuzz_stage != FuzzStage::Forward)
      reject(label("handler_type"), "fix",
             "handler_type \"fix\" works in the forward stage only, and fuzz_stage is \"backward\"",
             "\"fix\" with fuzz_stage \"forward\", or \"check\"");
    if (f.if_preheat)
      reject(label("handler_type"), "fix", "handler_type \"fix\" cannot be combined with if_preheat true",
             "\"fix\" with if_preheat false, or \"check\"");
  }
  if (f.fuzz_stage == FuzzStage::Backward && list.empty())
    reject(label("list"), list, "fuzz_stage \"backward\" checks the APIs named in list, and list is empty",
           "a non-empty list of API names with fuzz_stage \"backward\"");

  return f;
}

}  // namespace details

}  // namespace torchprobe

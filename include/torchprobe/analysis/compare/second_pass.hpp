#pragma once
// From statistics-only dumps to a second run that dumps just what blame needs: how strongly each
// diverging entry amplifies the error of its inputs (first_divergence.json's "suspects"), and
// `--emit-config FILE`, msprobe's config.json for a tensor dump of only those entries, one file for
// each side with that side's names.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "torchprobe/analysis/compare/blame_plan.hpp"

namespace torchprobe::compare {

// The diverging entries from the source on (the plan's), each with its output error and the error of
// its tensor inputs (the judge's unit) and their ratio, the amplification: how many times its
// output's error is its inputs'. `inf` when its tensor inputs agree: the error starts there (an
// argument that is no tensor and differs, gelu's `approximate`, is said by "arguments_differ").
// A backward entry has none: its output depends on its forward's inputs too, which it does not list.
inline nlohmann::ordered_json suspects_json(const Judgement& j, const BlamePlan& plan) {
  using OJson = nlohmann::ordered_json;
  OJson list = OJson::array();
  for (const EntryVerdict* v : plan.entries) {
    OJson o;
    const EntryPair& p = *v->pair;
    o["entry"] = p.target->name;
    o["bench_entry"] = p.bench.front()->name;
    double tensors_in = 0;
    bool arguments_differ = false;
    for (const RowLink& l : p.links) {
      if (l.target->is_output() || l.target->place != Row::kInput) continue;
      const double e =
          cast_input(l) ? cast_input_error(l, j.mode, false, j.float_sums) : row_error(l, j.mode, false, j.float_sums);
      if (l.target->dtype.view().rfind("torch.", 0) == 0)
        tensors_in = std::max(tensors_in, e);
      else if (e > j.threshold)
        arguments_differ = true;
    }
    o["input_error"] = details::num(tensors_in);
    o["output_error"] = details::num(v->output_error);
    if (p.target->direction == "forward") {
      const double amp = tensors_in > 0 ? v->output_error / tensors_in : v->output_error > 0 ? INFINITY : 0.0;
      o["amplification"] = details::num(amp);
    }
    if (arguments_differ) o["arguments_differ"] = true;
    list.push_back(o);
  }
  return list;
}

namespace details {

// "Aten.addmm.0.forward" -> "Aten.addmm.0." : a list item that holds one call's entries (forward and
// backward) and no other's (msprobe's list matches names by substring: "Aten.addmm.1" would also
// take Aten.addmm.10).
inline std::string list_item_of(std::string_view entry) {
  const std::string_view call = call_name(entry);
  return call.size() < entry.size() ? std::string(call) + "." : std::string(entry);
}

// The step and rank of a dump.json in its dump tree (…/step3/rank1/dump.json), when it is in one.
inline void step_and_rank(const std::filesystem::path& dump_json, nlohmann::ordered_json& config) {
  const auto number_after = [](const std::string& name, const std::string& prefix) -> long {
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return -1;
    const std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) return -1;
    return std::stol(digits);
  };
  const std::filesystem::path rank_dir = dump_json.parent_path();
  const long rank = number_after(rank_dir.filename().string(), "rank");
  const long step = number_after(rank_dir.parent_path().filename().string(), "step");
  config["rank"] = rank >= 0 ? nlohmann::ordered_json::array({rank}) : nlohmann::ordered_json::array();
  config["step"] = step >= 0 ? nlohmann::ordered_json::array({step}) : nlohmann::ordered_json::array();
}

inline nlohmann::ordered_json second_pass_config(const Dump& d, const std::vector<std::string>& list,
                                                 const std::string& dump_path) {
  nlohmann::ordered_json c;
  c["task"] = "tensor";
  c["dump_path"] = dump_path;
  step_and_rank(d.file, c);
  c["level"] = d.level.empty() ? "L1" : d.level;
  c["tensor"] = {{"scope", nlohmann::ordered_json::array()}, {"list", list}, {"data_mode", {"all"}}};
  return c;
}

}  // namespace details

// The calls whose tensors blame needs, each side's names: the planned API entries (a module entry's
// calls, both sides of a template pair); a module with no API call inside (L0) by its own name.
inline std::pair<std::vector<std::string>, std::vector<std::string>> second_pass_lists(const BlamePlan& plan) {
  std::vector<std::string> tl, bl;
  std::set<std::string> tseen, bseen;
  const auto add = [](std::vector<std::string>& l, std::set<std::string>& seen, std::string_view entry) {
    const std::string c = details::list_item_of(entry);
    if (seen.insert(c).second) l.push_back(c);
  };
  const auto add_pair = [&](const EntryPair& p) {
    add(tl, tseen, p.target->name);
    for (const Entry* e : p.target_group) add(tl, tseen, e->name);
    for (const Entry* e : p.bench) add(bl, bseen, e->name);
  };
  for (const EntryVerdict* v : plan.entries) {
    const auto inner = plan.inner.find(v);
    if (inner != plan.inner.end() && !inner->second.empty()) {
      for (const EntryVerdict* w : inner->second) add_pair(*w->pair);
    } else if (v->pair->target->is_module()) {
      add(tl, tseen, v->pair->target->name);  // L0: the module itself
      for (const Entry* e : v->pair->bench) add(bl, bseen, e->name);
    } else {
      add_pair(*v->pair);
    }
  }
  return {tl, bl};
}

// Writes FILE (the target's names) and FILE's stem + "_bench" + its extension (the bench's); returns
// the two paths. Throws std::runtime_error naming a file that cannot be written.
inline std::pair<std::filesystem::path, std::filesystem::path> emit_second_pass_configs(
    const std::filesystem::path& file, const Dump& t, const Dump& b, const BlamePlan& plan) {
  const auto lists = second_pass_lists(plan);
  std::filesystem::path bench_file = file;
  bench_file.replace_filename(file.stem().string() + "_bench" + file.extension().string());
  const auto write = [](const std::filesystem::path& p, const nlohmann::ordered_json& c) {
    std::ofstream out(p, std::ios::binary);
    out << c.dump(4) << "\n";
    out.flush();
    if (!out) throw std::runtime_error(p.string() + ": cannot be written (--emit-config)");
  };
  write(file, details::second_pass_config(t, lists.first, "./dump_second_pass"));
  write(bench_file, details::second_pass_config(b, lists.second, "./dump_second_pass_bench"));
  return {file, bench_file};
}

}  // namespace torchprobe::compare

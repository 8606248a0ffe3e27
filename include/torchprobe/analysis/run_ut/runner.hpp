#pragma once
// `torchprobe run_ut`: every API of a dump replayed (in parallel with jobs > 1), the result and
// details CSVs written in dump order, -save_error_data's .pt files, and a summary. An API that
// cannot be replayed is SKIP with the reason and never stops the others.
#include <torch/serialize.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "torchprobe/io/files.hpp"
#include "torchprobe/io/timestamp.hpp"
#include "torchprobe/analysis/run_ut/report.hpp"
#include "torchprobe/analysis/run_ut/run_settings.hpp"

namespace torchprobe::run_ut {

struct RunOptions : RunSettings {
  ReplayOptions replay;
};

struct RunOutput {
  std::string result_csv, details_csv, verdicts_csv, error_dir;
  std::vector<ApiResult> results;
  Summary summary;
};

namespace details {

inline bool listed(const std::vector<std::string>& list, const std::string& api) {
  return std::find(list.begin(), list.end(), api) != list.end();
}

// The API names already in a result CSV (-csv_path).
inline std::set<std::string> done_apis(const std::string& csv) {
  std::ifstream in(csv, std::ios::binary);
  if (!in) throw RunUtError(csv + ": cannot open the result CSV to continue");
  std::set<std::string> names;
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (header) {
      header = false;
      continue;
    }
    const auto comma = line.find(',');
    if (comma != std::string::npos) names.insert(line.substr(0, comma));
  }
  return names;
}

// -f: the call's arguments without their Max/Min, to find repeated calls.
inline std::string call_key(const ApiCase& c) {
  Json f = c.forward.is_object() ? c.forward : Json::object();
  Json key = {c.api, f.value("input_args", Json()), f.value("input_kwargs", Json())};
  std::function<void(Json&)> strip = [&](Json& j) {
    if (j.is_object()) {
      j.erase("Max");
      j.erase("Min");
    }
    if (j.is_structured())
      for (auto& e : j) strip(e);
  };
  strip(key);
  return key.dump();
}

inline void save_values(const std::string& dir, const std::string& stem, const std::vector<c10::IValue>& values) {
  for (std::size_t k = 0; k < values.size(); ++k) {
    const c10::IValue& v = values[k];
    if (!v.isTensor() || !v.toTensor().defined()) continue;
    const std::vector<char> bytes = torch::pickle_save(v.toTensor().detach().cpu());
    std::ofstream out(dir + "/" + stem + "." + std::to_string(k) + ".pt", std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
}

inline void save_error_data(const std::string& dir, const ApiResult& r) {
  const bool bad = r.forward != Status::pass || (r.backward != "pass" && r.backward != " ");
  if (!bad || r.forward == Status::skip) return;
  save_values(dir, r.name + ".forward.input", r.inputs);
  save_values(dir, r.name + ".forward.output.bench", r.bench_out);
  save_values(dir, r.name + ".forward.output.device", r.device_out);
  if (r.backward == " " || r.backward == "SKIP") return;
  save_values(dir, r.name + ".backward.input", r.grad_in);
  save_values(dir, r.name + ".backward.output.bench", r.bench_grads);
  save_values(dir, r.name + ".backward.output.device", r.device_grads);
}

inline ApiResult run_one(const ApiCase& c, const Dump& dump, const RunOptions& o) {
  if (!c.api.empty() && (listed(o.black_list, c.api) || (!o.white_list.empty() && !listed(o.white_list, c.api))))
    return skipped(c.name, "API " + c.api + " in black list or not in white list. SKIP.");
  const auto t0 = std::chrono::steady_clock::now();
  ApiResult r;
  try {
    r = replay(c, dump.data_dir, o.replay);
  } catch (const std::exception& e) {  // NotReplayable, RunUtError, c10::Error from the op
    std::string what = e.what();
    if (const auto nl = what.find("\nException raised from"); nl != std::string::npos) what.resize(nl);
    r = skipped(c.name, what);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace details

inline RunOutput run(const RunOptions& o) {
  const Dump dump = read_dump(o.api_info);
  if (o.save_error_data && dump.data_dir.empty())
    throw RunUtError(o.api_info + ": -save_error_data needs a tensor dump (dump_data_dir is null: no tensors to save)");
  RunOutput out;
  std::set<std::string> done;
  if (!o.continue_csv.empty()) {
    const std::string& p = o.continue_csv;
    const auto pos = p.rfind("accuracy_checking_result_");
    if (pos == std::string::npos) throw RunUtError(p + ": -csv_path must name an accuracy_checking_result_{ts}.csv");
    done = details::done_apis(p);
    out.result_csv = p;
    out.details_csv = p.substr(0, pos) + "accuracy_checking_details_" + p.substr(pos + 25);
  } else {
    io::create_directories(o.out_dir);
    const std::string ts = io::compact_local_timestamp();
    out.result_csv = o.out_dir + "/accuracy_checking_result_" + ts + ".csv";
    out.details_csv = o.out_dir + "/accuracy_checking_details_" + ts + ".csv";
    if (o.save_error_data) out.error_dir = o.error_data_path + "/ut_error_data" + ts;
  }
  {
    const auto pos = out.result_csv.rfind("accuracy_checking_result_");
    out.verdicts_csv = out.result_csv.substr(0, pos) + "accuracy_checking_verdicts_" + out.result_csv.substr(pos + 25);
  }
  if (o.save_error_data && out.error_dir.empty())
    out.error_dir = o.error_data_path + "/ut_error_data" + io::compact_local_timestamp();
  if (o.save_error_data) io::create_directories(out.error_dir);
  CsvFile result(out.result_csv, kResultHeader), details(out.details_csv, kDetailsHeader),
      verdicts(out.verdicts_csv, kVerdictsHeader);

  std::vector<const ApiCase*> todo;
  std::set<std::string> seen;
  for (const auto& c : dump.cases) {
    if (done.count(c.name)) continue;
    if (o.filter_duplicates && !seen.insert(details::call_key(c)).second) continue;
    todo.push_back(&c);
  }
  out.results.resize(todo.size());
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<std::size_t> next{0};
  const auto worker = [&] {
    for (std::size_t i; (i = next++) < todo.size();) out.results[i] = details::run_one(*todo[i], dump, o);
  };
  const int jobs = std::max(1, std::min<int>(o.jobs, static_cast<int>(todo.size())));
  std::vector<std::thread> pool;
  for (int j = 1; j < jobs; ++j) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& r : out.results) {
    result.append(result_row(r));
    details.append(detail_rows(r));
    verdicts.append(verdict_row(r));
    if (o.save_error_data) details::save_error_data(out.error_dir, r);
  }
  out.summary = summarize(out.results, secs);
  return out;
}

}  // namespace torchprobe::run_ut

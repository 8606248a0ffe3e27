#pragma once
// The live check (msprobe's bench_path + diff_nums; issue 47): while training runs, each finished
// entry is judged against the entry of the same name in a reference dump.json, and the inputs and
// outputs of the first diff_nums entries that introduce a difference are saved as .pt files, so a
// long run needs no full dump of either side and no second pass.
//
// The judgment is compare's (core/stat_tolerance.hpp): an md5 run against an md5 reference compares
// checksums (bitwise, as msprobe does); otherwise each statistic is judged in dtype epsilons, 64 by
// default, with the float sums' allowance when the reference is a Python (msprobe) dump and the
// cast rule for inputs in another float precision. Like msprobe, an entry is saved when its
// outputs differ while its inputs do not -- here, when the outputs' error is more than 10 times the
// inputs', compare's rule for a source. Entries pair by name: an API entry of C++ (Aten.*) has no
// namesake in a Python dump, so against one the modules (levels mix and L0) are what is checked.
//
// Cost per entry: one hash lookup and a few comparisons per tensor; an API call's compact body is
// read as it is (DeferredBody::visit_items), not made JSON.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <cmath>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "torchprobe/config/types.hpp"
#include "torchprobe/core/record.hpp"
#include "torchprobe/core/stat_tolerance.hpp"
#include "torchprobe/io/console.hpp"
#include "torchprobe/task/live_check/reference.hpp"

namespace torchprobe {

class LiveCheck {
  using Json = nlohmann::ordered_json;

 public:
  // What the check found of one entry.
  struct Verdict {
    bool paired = false;  // the reference has an entry of this name
    double input_error = 0, output_error = 0;
    std::string worst_output;    // the pointer of the output that differs most
    bool differs = false;        // some output is beyond the threshold
    bool source = false;         // ... by more than 10 times the inputs' error
    bool inputs_source = false;  // a source by its inputs: the first entry that differs at all
    bool save = false;           // one of the first diff_nums sources: its tensors are saved
  };

  LiveCheck(const Config& c, bool md5_run)
      : reference_(c.bench_path, "bench_path"),
        limit_(c.diff_nums),
        md5_(md5_run && reference_.md5()),
        threshold_(md5_ ? 0 : kDefaultTolEpsilons) {}

  // Judges a finished entry whose body is JSON (Record::materialize()) and records the finding.
  Verdict judge(const Record& r) {
    Verdict v;
    const live::Items* theirs = reference_.find(r.name);
    checked_.fetch_add(1, std::memory_order_relaxed);
    if (!theirs) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (unpaired_.size() < kMaxListed) unpaired_.push_back(r.name);
      return v;
    }
    v.paired = true;
    live::Items ours = live::flatten(r.body);
    if (r.deferred) live::add_deferred(*r.deferred, ours);
    for (const live::TensorItem& t : ours) {
      const live::TensorItem* b = nullptr;
      for (const live::TensorItem& x : *theirs)
        if (x.pointer == t.pointer) b = &x;
      const double e = b ? error(t, *b) : kStatInf;  // an item the reference lacks: a different call
      double& worst = t.output ? v.output_error : v.input_error;
      if (t.output && (e > worst || v.worst_output.empty())) v.worst_output = t.pointer;
      worst = std::max(worst, e);
    }
    v.differs = v.output_error > threshold_;
    v.source = is_source(v.differs, v.output_error, v.input_error);
    const bool inputs_differ = v.input_error > threshold_;
    std::lock_guard<std::mutex> lock(mutex_);
    ++paired_;
    // The first forward entry that differs at all, with inputs that differ though nothing before
    // it did: what differs first is what it was given (a weight, or data no recorded call made).
    if ((v.differs || inputs_differ) && !seen_diverging_) {
      seen_diverging_ = true;
      if (inputs_differ && !v.source && forward(r.name)) v.source = v.differs = v.inputs_source = true;
    }
    if (!v.differs) return v;
    if (v.source && (limit_ < 0 || saved_ < limit_)) {
      v.save = true;
      ++saved_;
    }
    Finding f{r.name, r.order, step_, v};
    if (!first_ || better_first(f, *first_)) {
      // Said as soon as it is seen; once more if a source comes after a difference that was not.
      if (!first_ || (f.v.source && !first_->v.source)) tell_first(f, r);
      first_ = f;
    }
    ++differing_;
    differing_steps_.insert(step_);
    if (findings_.size() < kMaxListed) findings_.push_back(std::move(f));
    return v;
  }

  // The step whose entries come next: compare judges one step, so "nothing before it differed"
  // starts again.
  void set_step(std::int64_t step) {
    std::lock_guard<std::mutex> lock(mutex_);
    step_ = step;
    seen_diverging_ = false;
  }

  // live_check.json of `step`: what was checked, the first entry that differs (a source before
  // any other), and each differing entry of the step in dump order.
  Json report(std::int64_t step) const {
    std::lock_guard<std::mutex> lock(mutex_);
    Json j;
    j["bench_path"] = reference_.file();
    j["judged_by"] =
        md5_ ? "md5: equal checksums"
             : "statistics within " + std::to_string(int(threshold_)) + " dtype epsilons (compare's tol rule)";
    j["reference_float_sums"] = !md5_ && reference_.float_sums();
    j["diff_nums"] = limit_;
    j["entries_checked"] = checked_.load();
    j["entries_paired"] = paired_;
    j["entries_differing"] = differing_;
    j["entries_saved"] = saved_;
    j["first_divergence"] = first_ ? finding_json(*first_) : Json();
    std::vector<const Finding*> of_step;
    for (const Finding& f : findings_)
      if (f.step == step) of_step.push_back(&f);
    std::stable_sort(of_step.begin(), of_step.end(),
                     [](const Finding* a, const Finding* b) { return a->order < b->order; });
    j["differing"] = Json::array();
    for (const Finding* f : of_step) j["differing"].push_back(finding_json(*f));
    // What could not be checked: entries the reference has no namesake of (the first kMaxListed
    // of the run), e.g. the ATen calls of a C++ run against a Python dump.
    j["unpaired"] = unpaired_;
    return j;
  }

  bool any_checked() const { return checked_.load() > 0; }

  // Whether `step` gets a live_check.json: the first step written (it says that the check runs and
  // what it could not pair) and each step with a differing entry. A later step where nothing
  // differed writes none: on a small step that file was the largest cost of the check.
  bool reports(std::int64_t step) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!first_reported_) first_reported_ = step;
    return *first_reported_ == step || differing_steps_.count(step) != 0;
  }

 private:
  struct Finding {
    std::string name;
    std::uint64_t order;
    std::int64_t step;
    Verdict v;
  };
  static constexpr std::size_t kMaxListed = 10000;

  // One item against the reference's, in epsilons (0 or infinity for checksums).
  double error(const live::TensorItem& t, const live::TensorItem& b) const {
    if (t.shape != b.shape) return kStatInf;
    const bool castable = t.dtype != b.dtype && castable_dtype(t.dtype) && castable_dtype(b.dtype);
    if (t.dtype != b.dtype && !(castable && !t.output)) return kStatInf;
    if (md5_ && !castable) return t.md5 == b.md5 && !t.md5.empty() ? 0 : kStatInf;
    // An input that is the reference's in another float precision (a layer run in bfloat16 gets its
    // input cast) is judged in the coarser precision: within 2 of its epsilons it is that rounding.
    const std::string& coarse = coarser_dtype(t.dtype, b.dtype);
    double amax = 0;
    for (const live::TensorItem* x : {&t, &b})
      for (int s = 0; s < 2; ++s)
        if (x->stat[s] && std::isfinite(*x->stat[s])) amax = std::max(amax, std::fabs(*x->stat[s]));
    double elements = 1;
    for (const std::int64_t d : t.shape) elements *= static_cast<double>(d);
    const double allowance =
        reference_.float_sums() && float_dtype(t.dtype) ? kAccumulationEpsilonsPerElement * elements : 0;
    double worst = 0;
    for (int s = 0; s < 4; ++s) {
      if (!t.stat[s] && !b.stat[s]) continue;
      if (!t.stat[s] || !b.stat[s]) {
        // msprobe leaves an integer tensor's Mean and Norm null: not compared.
        if (s >= 2 && dtype_epsilon(t.dtype) == 0) continue;
        return kStatInf;
      }
      worst = std::max(worst, statistic_error(s, *t.stat[s], *b.stat[s], amax, dtype_epsilon(coarse), allowance));
    }
    return castable ? cast_input_error(worst, t.dtype, b.dtype) : worst;
  }

  // compare's answer: within the earliest step, a source before any other, then execution order
  // (forward entries, then backward), then dump order.
  static bool better_first(const Finding& a, const Finding& b) {
    if (a.step != b.step) return a.step < b.step;
    if (a.v.source != b.v.source) return a.v.source;
    if (forward(a.name) != forward(b.name)) return forward(a.name);
    return a.order < b.order;
  }
  // "Aten.mm.0.forward", "Module.fc.Linear.forward.0" (backward and parameters_grad entries are not).
  static bool forward(const std::string& name) {
    const std::size_t n = name.size();
    return (n > 8 && name.compare(n - 8, 8, ".forward") == 0) || name.find(".forward.") != std::string::npos;
  }

  // The first difference, as soon as it is seen, with the module it ran in.
  void tell_first(const Finding& f, const Record& r) const {
    std::string where;
    if (r.parent && !r.parent->empty()) {
      where = " in " + *r.parent;
      const std::string chain = module_path(*r.parent);
      if (!chain.empty()) where += " (module path " + chain + ")";
    }
    io::tell_user("live check: " + f.name + where + " differs from " + reference_.file() + " (" +
                  (f.v.inputs_source
                       ? "its inputs differ, and nothing before it did: a weight or data no recorded call made"
                   : f.v.source ? "its inputs do not: the difference starts here"
                                : "its inputs differ too") +
                  "; output " + f.v.worst_output + (md5_ ? ", checksum" : ", " + epsilons(f.v.output_error)) +
                  "); live_check.json lists every differing entry");
  }
  // "Module.block.fc1.Linear.forward.0" -> "block > fc1": the chain of modules the entry ran in.
  static std::string module_path(const std::string& module_entry) {
    const std::string prefix = "Module.";
    if (module_entry.rfind(prefix, 0) != 0) return {};
    std::size_t end = module_entry.rfind(".forward");
    if (end == std::string::npos) end = module_entry.rfind(".backward");
    if (end == std::string::npos || end <= prefix.size()) return {};
    const std::size_t cls = module_entry.rfind('.', end - 1);  // the class name before it
    if (cls == std::string::npos || cls < prefix.size()) return {};
    std::string path = module_entry.substr(prefix.size(), cls - prefix.size());
    std::string out;
    for (const char c : path) out += c == '.' ? std::string(" > ") : std::string(1, c);
    return out;
  }
  static std::string epsilons(double e) {
    return std::isinf(e) ? "dtype, shape or a non-number differs" : std::to_string(e) + " dtype epsilons";
  }
  static Json number_or_null(double e) { return std::isinf(e) ? Json() : Json(e); }
  static Json finding_json(const Finding& f) {
    Json j;
    j["entry"] = f.name;
    j["step"] = f.step;
    j["source"] = f.v.source;
    j["source_by_inputs"] = f.v.inputs_source;
    j["input_error"] = number_or_null(f.v.input_error);
    j["output_error"] = number_or_null(f.v.output_error);
    j["worst_output"] = f.v.worst_output;
    j["saved"] = f.v.save;
    return j;
  }

  live::Reference reference_;
  const std::int64_t limit_;  // diff_nums; -1: no limit
  const bool md5_;
  const double threshold_;
  std::atomic<std::uint64_t> checked_{0};
  mutable std::mutex mutex_;
  std::int64_t step_ = 0;
  std::uint64_t paired_ = 0, differing_ = 0;
  std::int64_t saved_ = 0;
  bool seen_diverging_ = false;
  std::optional<Finding> first_;
  std::vector<Finding> findings_;      // the differing entries, the first kMaxListed of the run
  std::vector<std::string> unpaired_;  // the entries without a namesake, the first kMaxListed
  std::set<std::int64_t> differing_steps_;
  mutable std::optional<std::int64_t> first_reported_;  // the first step given a live_check.json
};

}  // namespace torchprobe

#pragma once
// Blame by replay for `torchprobe compare` (analysis/compare/blame_plan.hpp asks; this replays, with
// libtorch: the CLI's module and the libtorch tests include it). For a pair of
// diverging forward API entries whose tensors both dumps hold as .pt files, the target's op is run
// again, with its own arguments and parameters, on the bench's inputs, in the target's dtypes:
//
//   O_t - O_b  =  (O_t - L_t)  +  (L_t - O_b)        O: the dumped outputs, L_t: that replay
//   total         propagated      local
//
// and both sides' ops are run in float64 on the same inputs (X_t, X_b), to say how far each side's
// output is from the exact result of its own op (err_t = |L_t - X_t|, err_b = |O_b - X_b|) and how
// far the two ops are from each other in exact arithmetic (|X_t - X_b|). Every figure is a relative
// L2 norm, |a - b| / |b| over all the entry's output elements.
//
// Verdicts, the first that applies:
//   parameter source   an input no recorded call made (a parameter, or the model's input) differs
//                      between the sides, beyond a cast of the finer to the coarser dtype, and the
//                      output differs beyond rounding with it (a transpose's backward does not);
//   introduced here    local > 8 max(min(err_t, err_b), eps), eps the finer side's epsilon, and the
//                      target is the side further from exact (or the two ops differ in exact
//                      arithmetic: another function, such as gelu's tanh approximation);
//   bench less exact than target   the same, with the bench further from exact;
//   propagated         local is within that allowance and the inputs differ;
//   rounding           local is within it and the inputs are the same: the two sides round
//                      differently (another summation order), which no op is to blame for.
// The allowance rests on the triangle inequality: two faithful ops on the same inputs differ by at
// most err_t + err_b, and faithful implementations of one op in one precision err alike.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "torchprobe/analysis/run_ut/replayed_call.hpp"

namespace torchprobe::run_ut {

namespace blame_details {

using OJson = nlohmann::ordered_json;
namespace ru = torchprobe::run_ut;
using namespace torchprobe::run_ut::replayed;

// How much wider the local discrepancy must be than the rounding both sides share to be an error.
constexpr double kRoundingFactor = 8;

inline double epsilon_of(c10::ScalarType t) {
  switch (t) {
    case at::kDouble: return std::numeric_limits<double>::epsilon();
    case at::kHalf: return 9.765625e-4;    // 2^-10
    case at::kBFloat16: return 7.8125e-3;  // 2^-7
    default: return std::numeric_limits<float>::epsilon();
  }
}

inline c10::ScalarType coarser(c10::ScalarType a, c10::ScalarType b) {
  if (!c10::isFloatingType(a) || !c10::isFloatingType(b)) return a;
  return epsilon_of(a) >= epsilon_of(b) ? a : b;
}

// |a - b| / |ref| over every element of the lists (float64; ref defaults to b); 0 when equal, inf
// when the non-finite elements differ in place or the shapes differ.
inline double relative(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                       const std::vector<at::Tensor>* ref = nullptr) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, norm = 0;
  if (ref != nullptr)
    for (const at::Tensor& t : *ref)
      norm += t.detach().cpu().to(at::kDouble).nan_to_num(0, 0, 0).pow(2).sum().item<double>();
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].defined() || !b[i].defined() || a[i].numel() != b[i].numel())
      return std::numeric_limits<double>::infinity();
    if (!a[i].is_floating_point() && !b[i].is_floating_point()) {
      if (!at::equal(a[i].cpu(), b[i].cpu().to(a[i].scalar_type()))) return std::numeric_limits<double>::infinity();
      continue;
    }
    at::Tensor x = a[i].detach().cpu().to(at::kDouble).reshape({-1});
    at::Tensor y = b[i].detach().cpu().to(at::kDouble).reshape({-1});
    const at::Tensor fx = x.isfinite(), fy = y.isfinite();
    if (!at::equal(fx, fy)) return std::numeric_limits<double>::infinity();
    const at::Tensor bad = fx.logical_not();
    if (bad.any().item<bool>()) {  // the same places: equal when the same values
      if (!at::equal(x.masked_select(bad).nan_to_num(0), y.masked_select(bad).nan_to_num(0)))
        return std::numeric_limits<double>::infinity();
      x = x.masked_select(fx);
      y = y.masked_select(fy);
    }
    diff += (x - y).pow(2).sum().item<double>();
    if (ref == nullptr) norm += y.pow(2).sum().item<double>();
  }
  if (diff == 0) return 0;
  return norm > 0 ? std::sqrt(diff / norm) : std::numeric_limits<double>::infinity();
}

}  // namespace blame_details

// The blame of one pair. `pair` (made by blame_plan.hpp): "entry", "bench_entry", "inputs" (each
// {"row", "bench_row", "leaf"}). Returns the entry's figures and verdict; an entry that cannot be
// replayed gets verdict "not replayed" and the reason.
inline nlohmann::ordered_json blame_pair(const nlohmann::ordered_json& target_data, const std::string& target_dir,
                                         const nlohmann::ordered_json& bench_data, const std::string& bench_dir,
                                         const nlohmann::ordered_json& pair) {
  namespace bd = blame_details;
  namespace ru = torchprobe::run_ut;
  using OJson = nlohmann::ordered_json;
  OJson r;
  r["entry"] = pair["entry"];
  r["bench_entry"] = pair["bench_entry"];
  try {
    // A backward entry is replayed through its forward call: that call's arguments, the gradients given.
    const bool backward = pair.contains("forward_entry");
    const std::string tcall = pair[backward ? "forward_entry" : "entry"].get<std::string>();
    const std::string bcall = pair[backward ? "bench_forward_entry" : "bench_entry"].get<std::string>();
    const bd::Call target = bd::read_call(target_data, tcall, target_dir);
    bd::Call bench = bd::read_call(bench_data, bcall, bench_dir);
    const ru::ResolvedOp top = ru::resolve(target.target, target.args, target.kwargs);
    const ru::ResolvedOp bop = ru::resolve(bench.target, bench.args, bench.kwargs);
    const std::size_t outs = std::min(target.outputs.size(), bench.outputs.size());
    std::vector<at::Tensor> ot(target.outputs.begin(), target.outputs.begin() + outs);
    std::vector<at::Tensor> ob(bench.outputs.begin(), bench.outputs.begin() + outs);

    // The replays' arguments: the target's, with each linked input taken from the bench (cast to
    // the target's dtype) unless it is a parameter that differs; `exact` the same in float64, with
    // the bench's finer copy of a parameter the sides hold in two precisions.
    bd::Call local = target, exact = target;
    bd::Call bench64 = bench;
    bool inputs_differ = false;
    OJson params = OJson::array();
    // Inputs the replay could not take from the bench (no link, or another size): the target's own stay,
    // and whatever error they carry counts as local.
    OJson kept = OJson::array();
    // Each linked input, compared with the bench's and taken from it where it is not a differing parameter.
    const auto& inputs = pair.contains("inputs") ? pair["inputs"] : OJson::array();
    for (const auto& in : inputs) {
      const std::string row = in["row"].get<std::string>();
      ru::Arg* lt = bd::locate(local, row);
      ru::Arg* xt = bd::locate(exact, row);
      ru::Arg* ab = bd::locate(bench, in["bench_row"].get<std::string>());
      if (lt == nullptr || xt == nullptr || ab == nullptr) {
        kept.push_back(row);
        continue;
      }
      const at::Tensor tv = lt->value.toTensor(), bv = ab->value.toTensor();
      if (tv.numel() != bv.numel()) {  // not the same tensor: left as it is
        kept.push_back(row);
        continue;
      }
      const at::Tensor b_as_t = bv.reshape(tv.sizes()).to(tv.scalar_type());
      const c10::ScalarType common = bd::coarser(tv.scalar_type(), bv.scalar_type());
      // (relative() takes NaN for NaN at the same place: identical inputs holding NaN are the same)
      const bool same = bd::relative({tv.to(common)}, {bv.reshape(tv.sizes()).to(common)}) == 0;
      if (!same) inputs_differ = true;
      if (in.value("leaf", false) && !same) {
        params.push_back(
            {{"row", row},
             {"relative_difference", compare::details::num(bd::relative({tv}, {bv.reshape(tv.sizes())}))}});
        continue;  // a differing parameter: the target keeps its own
      }
      lt->value = b_as_t;
      xt->value = bv.reshape(tv.sizes());  // the finer copy (float64 below)
    }
    bd::to_float64(exact);
    bd::to_float64(bench64);
    std::vector<at::Tensor> lt, xt, xb;
    if (!backward) {
      lt = bd::run(local, top, outs);
      xt = bd::run(exact, top, outs);
      xb = bd::run(bench64, bop, outs);
    } else {
      const bd::Gradients gt = bd::read_gradients(target_data, pair["entry"].get<std::string>(), target_dir);
      const bd::Gradients gb = bd::read_gradients(bench_data, pair["bench_entry"].get<std::string>(), bench_dir);
      if (gt.given.size() != gb.given.size()) throw ru::NotReplayable("the sides were given different gradients");
      for (std::size_t i = 0; i < gt.given.size(); ++i) {
        if (!gt.given[i].defined() && !gb.given[i].defined()) continue;
        inputs_differ = inputs_differ || bd::relative({gt.given[i]}, {gb.given[i]}) != 0;
      }
      std::vector<at::Tensor> given64;
      for (const at::Tensor& g : gb.given) given64.push_back(g.defined() ? g.to(at::kDouble) : g);
      const std::vector<at::Tensor> l = bd::run_backward(local, top, gb.given);
      const std::vector<at::Tensor> x = bd::run_backward(exact, top, given64);
      const std::vector<at::Tensor> y = bd::run_backward(bench64, bop, given64);
      if (gt.made.size() != l.size() || gb.made.size() != y.size() || l.size() != y.size())
        throw ru::NotReplayable("its gradients do not line up with its call's tensor arguments");
      ot.clear();
      ob.clear();
      for (std::size_t i = 0; i < l.size(); ++i) {  // the arguments both sides and every replay have one for
        if (!gt.made[i].defined() || !gb.made[i].defined() || !l[i].defined() || !x[i].defined() || !y[i].defined())
          continue;
        ot.push_back(gt.made[i]);
        ob.push_back(gb.made[i]);
        lt.push_back(l[i]);
        xt.push_back(x[i]);
        xb.push_back(y[i]);
      }
      if (ot.empty()) throw ru::NotReplayable("no gradient of its call's arguments is on both sides and in the replay");
    }
    const std::size_t compared = ot.size();
    const double total = bd::relative(ot, ob), local_d = bd::relative(lt, ob);
    const double propagated = bd::relative(ot, lt, &ob);  // relative to the bench's norm, as the others
    const double err_t = bd::relative(lt, xt), err_b = bd::relative(ob, xb), ops = bd::relative(xt, xb);
    double eps = 1;
    for (std::size_t i = 0; i < compared; ++i)
      eps = std::min({eps, bd::epsilon_of(ot[i].scalar_type()), bd::epsilon_of(ob[i].scalar_type())});
    const double allowance = bd::kRoundingFactor * std::max(std::min(err_t, err_b), eps);
    std::string verdict, why;
    if (!params.empty() && !(local_d <= allowance)) {  // a parameter differs, and it shows in this output
      verdict = "parameter source";
      why = params[0]["row"].get<std::string>() +
            " differs, and no recorded call made it: a parameter, or data from outside the dump";
    } else if (!(local_d <= allowance)) {
      if (ops > std::max(err_t, err_b)) {
        verdict = "introduced here";
        why = "the two ops differ in exact arithmetic (float64 replays " + std::to_string(ops) + " apart)";
      } else if (err_b > err_t) {
        verdict = "bench less exact than target";
        why = "on the same inputs the bench's output is further from float64 than the target's";
      } else {
        verdict = "introduced here";
        why = "on the bench's inputs the target's op differs from the bench beyond rounding";
      }
    } else if (inputs_differ) {
      verdict = "propagated";
      why = "on the bench's inputs the target's op agrees with the bench within rounding";
    } else {
      verdict = "rounding";
      why = "the same inputs, outputs apart only as two roundings are (within " + std::to_string(allowance) + ")";
    }
    r["verdict"] = verdict;
    r["why"] = why;
    r["total"] = compare::details::num(total);
    r["local"] = compare::details::num(local_d);
    r["propagated"] = compare::details::num(propagated);
    r["target_error_vs_float64"] = compare::details::num(err_t);
    r["bench_error_vs_float64"] = compare::details::num(err_b);
    r["ops_apart_in_float64"] = compare::details::num(ops);
    r["rounding_allowance"] = compare::details::num(allowance);
    if (!params.empty()) r["differing_parameters"] = params;
    if (!kept.empty()) r["inputs_not_from_bench"] = kept;
    r["target_dtype"] = std::string(c10::toString(ot.front().scalar_type()));
    r["bench_dtype"] = std::string(c10::toString(ob.front().scalar_type()));
  } catch (const c10::Error& e) {  // libtorch's message, without its backtrace
    r["verdict"] = "not replayed";
    r["why"] = e.what_without_backtrace();
  } catch (const std::exception& e) {
    r["verdict"] = "not replayed";
    r["why"] = e.what();
  }
  return r;
}

// The blame of every pair of a request (blame_plan.hpp's blame_request): {"target", "bench"} the
// two dump.json files, "pairs" the entries in order. Returns {"entries": [...]}, one per pair.
inline nlohmann::ordered_json blame_replay(const nlohmann::ordered_json& request) {
  using OJson = nlohmann::ordered_json;
  const auto read = [](const std::string& file) {
    OJson root = compare::parse_json_text(compare::read_text_file(file));
    if (!root.is_object() || !root.contains("data") || !root["data"].is_object())
      throw compare::InputError(file + ": not a dump.json (no \"data\" object)");
    return root;
  };
  const std::string tfile = request["target"].get<std::string>(), bfile = request["bench"].get<std::string>();
  const OJson troot = read(tfile), broot = read(bfile);
  const std::string tdir = run_ut::dirname_of(tfile) + "/dump_tensor_data";
  const std::string bdir = run_ut::dirname_of(bfile) + "/dump_tensor_data";
  OJson out;
  out["entries"] = OJson::array();
  for (const auto& p : request["pairs"])
    out["entries"].push_back(blame_pair(troot["data"], tdir, broot["data"], bdir, p));
  return out;
}

}  // namespace torchprobe::run_ut

#pragma once
// One API replayed twice through the dispatcher (spec B.4): the "device" side in the recorded
// dtypes, the benchmark on the CPU up-cast (fp16/bf16 -> fp32, fp32 -> fp64; several float dtypes
// -> fp32), then, when the dump has its backward, both sides backward from the first recorded
// output gradient, and the gradients of the tensor arguments compared.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "torchprobe/analysis/run_ut/accuracy.hpp"
#include "torchprobe/analysis/run_ut/op_resolver.hpp"

namespace torchprobe::run_ut {

struct ReplayOptions {
  bool float64_bench = false;  // every float benchmark in float64 (not msprobe's up-cast)
  // Where the recorded dtypes run (msprobe's NPU/GPU side); the benchmark always runs on the CPU.
  c10::Device device = c10::Device(c10::kCPU);
};

// The device named on the command line ("cpu", "cuda", "cuda:N"), checked against this machine:
// std::invalid_argument names what was asked and what there is.
inline c10::Device replay_device(const std::string& name) {
  std::optional<c10::Device> d;
  try {
    d = c10::Device(name);
  } catch (const std::exception&) {
  }
  const auto gpus = static_cast<int>(torch::cuda::device_count());
  const std::string have = gpus == 0 ? "cpu (no CUDA device here)" : "cpu, cuda:0 .. cuda:" + std::to_string(gpus - 1);
  if (!d || !(d->is_cpu() || d->is_cuda()))
    throw std::invalid_argument("device '" + name + "' is not one run_ut knows (available: " + have + ")");
  if (d->is_cuda() && (gpus == 0 || d->index() >= gpus))
    throw std::invalid_argument("device '" + name + "' is not on this machine (available: " + have + ")");
  return *d;
}

// The outcome of one API: its statuses and detail rows, and what -save_error_data writes.
struct ApiResult {
  std::string name;
  Status forward = Status::skip;
  std::string backward = " ";  // "pass", "Warning", "error", "SKIP" or " " (not run)
  std::string skip_message;    // why forward is SKIP
  std::vector<Detail> forward_rows, backward_rows;
  std::vector<c10::IValue> inputs, bench_out, device_out, grad_in, bench_grads, device_grads;
  double seconds = 0;
};

namespace details {

inline c10::ScalarType bench_dtype(const std::set<c10::ScalarType>& floats, c10::ScalarType t, bool all64) {
  if (!c10::isFloatingType(t) || t == at::kDouble) return t;
  if (all64) return at::kDouble;
  if (floats.size() > 1) return at::kFloat;
  return t == at::kFloat ? at::kDouble : at::kFloat;
}

template <class Fn>
void for_each_tensor(std::vector<Arg>& args, Kwargs& kwargs, Fn fn) {
  const auto visit = [&](Arg& a) {
    if (a.kind == ArgKind::tensor) fn(a);
    for (auto& e : a.items)
      if (e.kind == ArgKind::tensor) fn(e);
  };
  for (auto& a : args) visit(a);
  for (auto& kv : kwargs) visit(kv.second);
}

// Status of a direction: the worst of its rows (SKIP rows do not count, as in msprobe).
inline Status worst(const std::vector<Detail>& rows) {
  Status s = Status::pass;
  for (const auto& r : rows) {
    if (r.status == Status::error) return Status::error;
    if (r.status == Status::warning) s = Status::warning;
  }
  return s;
}

inline std::vector<Detail> compare_outputs(const std::string& api, const std::vector<c10::IValue>& bench,
                                           const std::vector<c10::IValue>& device, double input_scale) {
  std::vector<Detail> rows;
  if (bench.size() > device.size()) {
    Detail d;
    d.status = Status::error;
    d.message = "bench and npu output structure is different.";
    d.verdict = {"error", d.message};
    rows.push_back(d);
    return rows;
  }
  for (std::size_t i = 0; i < bench.size(); ++i) {
    const c10::IValue &b = bench[i], &d = device[i];
    if (b.isNone() || (b.isTensor() && !b.toTensor().defined())) {
      rows.push_back(skip_detail("Bench output is None, skip this test."));
    } else if (b.isTensor() && d.isTensor() && d.toTensor().defined()) {
      rows.push_back(compare_tensor(api, b.toTensor(), d.toTensor(), input_scale));
    } else if (b.isTensorList() && d.isTensorList()) {
      std::vector<c10::IValue> bl, dl;
      for (const auto& t : b.toTensorVector()) bl.emplace_back(t);
      for (const auto& t : d.toTensorVector()) dl.emplace_back(t);
      for (auto& r : compare_outputs(api, bl, dl, input_scale)) rows.push_back(std::move(r));
    } else if (b.tagKind() != d.tagKind()) {
      Detail r;
      r.status = Status::error;
      r.message = "bench and npu output type is different.";
      r.verdict = {"error", r.message};
      rows.push_back(r);
    } else {  // builtin values: equal or error
      Detail r;
      r.status = b == d ? Status::pass : Status::error;
      if (b == d) r.error_rate = Cell::integer(0);
      r.verdict = {status_text(r.status), "exact comparison of a non-tensor output"};
      rows.push_back(r);
    }
  }
  return rows;
}

// The largest finite |value| among the float tensors of `values` (TorchProbe's verdict scale).
inline double max_abs(const std::vector<c10::IValue>& values) {
  double m = 0;
  for (const auto& v : values) {
    if (!v.isTensor() || !v.toTensor().defined() || !v.toTensor().is_floating_point() || v.toTensor().numel() == 0)
      continue;
    const at::Tensor t = v.toTensor().detach().to(at::kDouble).abs();
    const at::Tensor f = t.masked_select(t.isfinite());
    if (f.numel()) m = std::max(m, f.max().item<double>());
  }
  return m;
}

inline std::vector<c10::IValue> call(const c10::OperatorHandle& op, std::vector<c10::IValue> stack) {
  op.callBoxed(&stack);
  return stack;
}

// Values with every tensor on the CPU (the comparison, the saved error data); CPU ones as they are.
inline c10::IValue on_host(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return !t.defined() || t.device().is_cpu() ? v : c10::IValue(t.detach().to(at::kCPU));
  }
  if (v.isTensorList()) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorVector()) out.push_back(on_host(t).toTensor());
    return out;
  }
  return v;
}
inline std::vector<c10::IValue> on_host(const std::vector<c10::IValue>& vs) {
  std::vector<c10::IValue> out;
  for (const auto& v : vs) out.push_back(on_host(v));
  return out;
}

}  // namespace details

inline ApiResult replay(const ApiCase& c, const std::string& data_dir, const ReplayOptions& options = {}) {
  ApiResult r;
  r.name = c.name;
  if (c.api.empty()) throw NotReplayable("API name " + c.name + " does not split into Type.api.n");
  static const std::set<std::string> never = {
      "to", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"};
  if (never.count(c.api)) throw NotReplayable("API " + c.api + " is not replayed (its result is not data). SKIP.");
  if (!c.forward.is_object()) throw NotReplayable("the dump has no forward entry for " + c.name);
  const Json& fa = c.forward.contains("input_args") ? c.forward["input_args"] : Json::array();
  const Json& fk = c.forward.contains("input_kwargs") ? c.forward["input_kwargs"] : Json::object();
  if (!fa.is_array() || !fk.is_object())
    throw RunUtError(c.name + ": input_args must be a list and input_kwargs an object");
  if (fk.contains("out")) throw NotReplayable("API " + c.name + " writes into out=, which is not replayed");

  OpTarget target = target_of(c.type, c.api);
  InputBuilder build(data_dir, c.name);
  std::vector<Arg> args;
  Kwargs kwargs;
  for (const auto& a : fa) args.push_back(build.build(a));
  for (const auto& e : target.extra_args) args.push_back(e);
  for (const auto& [k, v] : fk.items()) kwargs.emplace_back(k, build.build(v));
  if (c.type == "Functional") adapt_functional_kwargs(kwargs);
  kwargs.erase(std::remove_if(kwargs.begin(), kwargs.end(), [](const auto& kv) { return kv.first == "device"; }),
               kwargs.end());
  const ResolvedOp op = resolve(target, args, kwargs);

  std::set<c10::ScalarType> floats;
  details::for_each_tensor(args, kwargs, [&](Arg& a) {
    const auto t = a.value.toTensor().scalar_type();
    if (t == at::kHalf || t == at::kBFloat16 || t == at::kFloat) floats.insert(t);
  });
  for (const auto& a : args) r.inputs.push_back(a.kind == ArgKind::tensor ? a.value : c10::IValue());
  std::vector<Arg> dargs = args, bargs = args;
  Kwargs dkw = kwargs, bkw = kwargs;
  const auto prepare = [&](Arg& a, bool bench) {
    at::Tensor t = a.value.toTensor().detach();
    if (bench) t = t.to(details::bench_dtype(floats, t.scalar_type(), options.float64_bench));
    if (!bench) t = t.to(options.device);
    t = t.clone();
    if (a.requires_grad && c10::isFloatingType(t.scalar_type())) t.requires_grad_(true);
    a.value = t;
  };
  details::for_each_tensor(dargs, dkw, [&](Arg& a) { prepare(a, false); });
  details::for_each_tensor(bargs, bkw, [&](Arg& a) { prepare(a, true); });
  int unused = 0;
  const auto bench_stack = bind_schema(op.handle.schema(), bargs, bkw, unused);
  const auto device_stack = bind_schema(op.handle.schema(), dargs, dkw, unused);
  if (!bench_stack || !device_stack) throw NotReplayable("the up-cast arguments no longer fit " + c.name);
  r.bench_out = details::call(op.handle, *bench_stack);  // CPU first, as msprobe
  const std::vector<c10::IValue> device_raw = details::call(op.handle, *device_stack);
  r.device_out = details::on_host(device_raw);
  std::vector<c10::IValue> all_inputs;
  details::for_each_tensor(args, kwargs, [&](Arg& a) { all_inputs.push_back(a.value); });
  const double input_scale = details::max_abs(all_inputs);
  r.forward_rows = details::compare_outputs(c.api, r.bench_out, r.device_out, input_scale);
  r.forward = details::worst(r.forward_rows);

  if (!c.backward.is_object()) return r;  // no backward recorded: " "
  if (c.api == "repeat_interleave" || c.api == "masked_select") return r;
  const Json& bin = c.backward.contains("input") ? c.backward["input"] : Json();
  const auto no_backward = [&](const std::string& why) {
    r.backward = "SKIP";
    r.backward_rows = {skip_detail(why)};
    return r;
  };
  if (r.bench_out.size() != 1 || !r.bench_out[0].isTensor()) return no_backward("Multiple backward is not supported.");
  if (!bin.is_array() || bin.empty() || bin[0].is_null())
    return no_backward("the dump has no output gradient for " + c.name);
  const at::Tensor grad = build.build(bin[0]).value.toTensor();
  r.grad_in.push_back(grad);
  const at::Tensor bo = r.bench_out[0].toTensor(), dout = device_raw[0].toTensor();
  if (!bo.requires_grad() || !dout.requires_grad()) return no_backward("no input of " + c.name + " requires grad.");
  bo.backward(grad.to(bo.scalar_type()));
  dout.backward(grad.to(dout.device(), dout.scalar_type()));
  const auto grads = [](const std::vector<Arg>& as) {
    std::vector<c10::IValue> g;
    for (const auto& a : as) {
      if (a.kind == ArgKind::tensor) g.emplace_back(a.value.toTensor().grad());
      for (const auto& e : a.items)
        g.emplace_back(e.kind == ArgKind::tensor ? e.value.toTensor().grad() : at::Tensor());
    }
    return g;
  };
  r.bench_grads = grads(bargs);
  r.device_grads = details::on_host(grads(dargs));
  // A gradient scales with the gradient fed in: its rounding noise lives near |grad| * |inputs|.
  r.backward_rows = details::compare_outputs(c.api, r.bench_grads, r.device_grads,
                                             details::max_abs(r.grad_in) * std::max(1.0, input_scale));
  r.backward = status_text(details::worst(r.backward_rows));
  return r;
}

}  // namespace torchprobe::run_ut

#!/usr/bin/python3
"""Reference data for TorchProbe: a small residual CNN (torchvision-ResNet-like) dumped by msprobe.

Writes, next to this script:
  model.pt                 torch.jit.save(torch.jit.script(model)) -- the initial weights/buffers
  input.pt / input.bin     the input x (torch.save'd tensor / raw little-endian float32, shape 4x3x16x16)
  configs/cfg_{L0,mix}.json   msprobe configs (dump_path relative to this folder)
  L0/, mix/                msprobe's own output (task statistics), one step each
  autograd_reference.json  per module call: input/output gradients computed with plain autograd,
                           and their comparison with msprobe's Module.*.backward.N entries

Usage (cwd does not matter; see README.md):
  MSPROBE_PY=<msprobe checkout>/python /usr/bin/python3 make_reference.py
The msprobe dumps run in child processes of this script (`--dump-worker LEVEL`), so msprobe's global
patching of torch never touches the plain-autograd reference run.
"""
import argparse
import copy
import json
import os
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHIMS = os.path.join(HERE, "msprobe_shims")
LEVELS = ("L0", "mix")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


# ----------------------------------------------------------------------------------------------
# The model (exactly as specified; every ReLU/Dropout is out-of-place: inplace=False is the default)
# ----------------------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=False)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.downsample = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
                           if stride != 1 or c_in != c_out else None)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out = out + identity
        return self.relu(out)


class ResCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=False)
        self.maxpool = nn.MaxPool2d(2)
        self.layer1 = nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 8, 1))
        self.layer2 = nn.Sequential(BasicBlock(8, 16, 2))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.25, inplace=False)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self._forward_impl(x)          # like torchvision's ResNet: forward -> helper method

    def _stem(self, x):
        return self.maxpool(self.relu(self.bn1(self.conv1(x))))

    def _forward_impl(self, x):
        x = self._stem(x)                      # a helper method that calls another helper
        x = self.layer2(self.layer1(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(self.dropout(x))


MODEL_SEED, INPUT_SEED, STEP_SEED = 1234, 99, 7
INPUT_SHAPE = (4, 3, 16, 16)


def p(*parts):
    return os.path.join(HERE, *parts)


def load_eager_model():
    """Eager ResCNN with the weights/buffers of model.pt (built with the same seed, then checked)."""
    torch.manual_seed(MODEL_SEED)
    model = ResCNN()
    model.train()
    scripted = torch.jit.load(p("model.pt"))
    ref = scripted.state_dict()
    own = model.state_dict()
    assert list(ref.keys()) == list(own.keys()), "state dict keys differ"
    for k in own:
        assert torch.equal(own[k], ref[k]), f"seeded eager model differs from model.pt at {k}"
    model.load_state_dict(ref)
    return model


def load_input():
    x = torch.load(p("input.pt"))
    raw = torch.frombuffer(bytearray(open(p("input.bin"), "rb").read()), dtype=torch.float32).reshape(INPUT_SHAPE)
    assert torch.equal(x, raw), "input.pt and input.bin differ"
    return x.clone().requires_grad_(True)


def run_step(model, x):
    """The one training step used everywhere."""
    torch.manual_seed(STEP_SEED)
    out = model(x)
    loss = (out ** 2).sum()
    loss.backward()
    return out, loss


# ----------------------------------------------------------------------------------------------
# 1. model.pt, input.pt, input.bin
# ----------------------------------------------------------------------------------------------
def make_model_and_input():
    torch.manual_seed(MODEL_SEED)
    model = ResCNN()
    model.train()
    pristine = copy.deepcopy(model.state_dict())
    scripted = torch.jit.script(model)
    torch.jit.save(scripted, p("model.pt"))

    # scripted (freshly loaded) vs eager: same state, bit-identical train-mode forward with the
    # same RNG state (dropout). Every forward mutates BatchNorm running stats, so each check uses
    # a fresh copy of the pristine state.
    loaded = torch.jit.load(p("model.pt"))
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, pristine[k]), k
    torch.manual_seed(INPUT_SEED)
    x = torch.randn(*INPUT_SHAPE)
    eager = copy.deepcopy(model)
    x_e = x.clone().requires_grad_(True)
    x_s = x.clone().requires_grad_(True)
    y_eager, _ = run_step(eager, x_e)
    y_script, _ = run_step(loaded, x_s)
    assert torch.equal(y_eager, y_script), "scripted forward is not bit-identical to eager"
    # the whole step, backward included, is bit-identical too (first run of the scripted module)
    assert torch.equal(x_e.grad, x_s.grad), "scripted input gradient differs from eager"
    grads_s = dict(loaded.named_parameters())
    for k, v in eager.named_parameters():
        assert torch.equal(v.grad, grads_s[k].grad), f"scripted gradient of {k} differs from eager"
    # both mutated their buffers identically, too
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, eager.state_dict()[k]), k
    for k, v in model.state_dict().items():     # the saved model was never run
        assert torch.equal(v, pristine[k]), k

    torch.save(x.detach(), p("input.pt"))
    xs = x.detach().contiguous().view(-1).tolist()
    with open(p("input.bin"), "wb") as f:
        f.write(struct.pack("<%df" % len(xs), *xs))
    return {"eager_vs_script_forward_bit_identical": True,
            "eager_vs_script_step_input_and_param_grads_bit_identical": True,
            "eager_vs_script_bn_buffers_after_step_identical": True}


# ----------------------------------------------------------------------------------------------
# 2. plain autograd reference (no msprobe in this process)
# ----------------------------------------------------------------------------------------------
def stats64(t):
    """max, min, mean, L2 norm of a float32 tensor, computed in float64."""
    d = t.detach().double()
    return {"Max": d.max().item(), "Min": d.min().item(), "Mean": d.mean().item(), "Norm": d.norm().item()}


def stats32(t):
    """The same statistics computed the way msprobe 26.0 does (torch.max/min/mean/norm in the tensor's
    own dtype, float32 here), so an msprobe dump of the same tensor must match these exactly."""
    d = t.detach()
    return {"Max": d.max().item(), "Min": d.min().item(), "Mean": d.mean().item(), "Norm": torch.norm(d).item()}


def tensor_ref(t):
    if t is None:
        return None
    return {"dtype": str(t.dtype), "shape": list(t.shape), "stats_f64": stats64(t), "stats_f32_torch": stats32(t)}


def autograd_reference():
    model = load_eager_model()
    x = load_input()
    calls = []            # one dict per module call, in forward-start order
    counters = {}
    pending = {}

    def pre_hook(name):
        def hook(mod, inputs):
            prefix = f"Module.{name}.{mod.__class__.__name__}."     # msprobe's module prefix
            n = counters.get(prefix, 0)
            counters[prefix] = n + 1
            call = {"fwd": prefix + f"forward.{n}", "name": name, "cls": mod.__class__.__name__,
                    "ins": inputs, "out": None}
            calls.append(call)                       # forward start order, like msprobe's counters
            pending.setdefault(id(mod), []).append(call)
        return hook

    def post_hook(name):
        def hook(mod, inputs, output):
            call = pending[id(mod)].pop()
            assert isinstance(output, torch.Tensor)
            call["out"] = output
        return hook

    handles = []
    for name, mod in model.named_modules():
        if name == "":
            continue          # msprobe does not dump the root passed to start(model); handled below
        handles.append(mod.register_forward_pre_hook(pre_hook(name)))
        handles.append(mod.register_forward_hook(post_hook(name)))

    torch.manual_seed(STEP_SEED)
    out = model(x)
    loss = (out ** 2).sum()
    for h in handles:
        h.remove()
    # dloss/d(every call output) and dloss/dx in one autograd.grad call. (No retain_grad(): its hooks
    # would also fire inside the autograd.grad calls below and accumulate into .grad.)
    outs = [c["out"] for c in calls]
    *g_outs, g_root_out, g_x = torch.autograd.grad(loss, outs + [out, x], retain_graph=True)

    # Gradient w.r.t. a call's input from the uses inside that call: autograd.grad from the call's
    # output back to its input, seeded with dloss/d(output). (Equal to what a BackwardHook on the call
    # sees as long as the input reaches the output only through the call itself -- true for every
    # call here: each module takes one tensor.)
    entries = {}
    for c, g_out in zip(calls, g_outs):
        fwd_name, name, cls, ins, output = c["fwd"], c["name"], c["cls"], c["ins"], c["out"]
        tensor_ins = [t for t in ins if isinstance(t, torch.Tensor)]
        need = [t for t in tensor_ins if t.requires_grad]
        grads = torch.autograd.grad(outputs=output, inputs=need, grad_outputs=g_out,
                                    retain_graph=True, allow_unused=True) if need else []
        it = iter(grads)
        g_in = [next(it) if t.requires_grad else None for t in tensor_ins]
        entries[fwd_name] = {
            "module": name, "class": cls,
            "backward_entry": fwd_name.replace(".forward.", ".backward."),
            # = msprobe backward "output": gradient w.r.t. each tensor input, from the uses inside
            #   this module call only (autograd.grad from this call's output to its inputs)
            "grad_wrt_inputs": [tensor_ref(g) for g in g_in],
            # = msprobe backward "input": total gradient of the loss w.r.t. this call's output
            "grad_wrt_output": [tensor_ref(g_out)],
        }
    root = {
        "note": "root module (not dumped by msprobe: start(model) skips the model itself)",
        "class": "ResCNN",
        "grad_wrt_inputs": [tensor_ref(g_x)],
        "grad_wrt_output": [tensor_ref(g_root_out)],
    }
    loss.backward()            # the plain step itself, for the bit-identity checks of the msprobe runs
    assert torch.equal(x.grad, g_x)
    plain = {"out": out.detach().clone(), "loss": loss.detach().clone(), "x_grad": x.grad.clone()}
    return entries, root, plain


# ----------------------------------------------------------------------------------------------
# 3. msprobe dumps (child process)
# ----------------------------------------------------------------------------------------------
def write_configs():
    os.makedirs(p("configs"), exist_ok=True)
    for level in LEVELS:
        cfg = {
            "task": "statistics",
            "dump_path": f"./{level}",
            "rank": [],
            "step": [],
            "level": level,
            "async_dump": False,
            "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
            "tensor": {"scope": [], "list": [], "data_mode": ["all"]},
        }
        with open(p("configs", f"cfg_{level}.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")


def dump_worker(level, result_path):
    sys.path[:0] = [SHIMS, os.environ["MSPROBE_PY"]]
    import torch113_compat  # noqa: F401  (patches only what torch 1.13 lacks; see the module)
    from msprobe.pytorch import PrecisionDebugger

    os.chdir(HERE)                                  # dump_path in the config is relative
    model = load_eager_model()
    x = load_input()
    debugger = PrecisionDebugger(config_path=f"./configs/cfg_{level}.json")
    rng_before = torch.get_rng_state()
    debugger.start(model)
    rng_after_start = torch.get_rng_state()         # (not a hooked API: nothing is dumped for it)
    out, loss = run_step(model, x)                  # seeds (STEP_SEED) after start()
    debugger.stop()
    debugger.step()
    rng_consumed = not torch.equal(rng_before, rng_after_start)     # compared outside the dump
    torch.save({"out": out.detach().clone(), "loss": loss.detach().clone(), "x_grad": x.grad.clone(),
                "start_consumed_rng": rng_consumed}, result_path)


# ----------------------------------------------------------------------------------------------
# 4. post-processing: path rewriting, checks, comparison
# ----------------------------------------------------------------------------------------------
def rewrite_paths(text, msprobe_py):
    import site
    reps = []
    msprobe_dir = os.path.join(os.path.realpath(msprobe_py), "msprobe")
    reps.append((msprobe_dir, "<msprobe>"))
    sp = set(site.getsitepackages()) | {os.path.dirname(os.path.dirname(torch.__file__))}
    for d in sorted(sp, key=len, reverse=True):
        reps.append((d, "<site-packages>"))
    reps.append((HERE, "<here>"))
    reps.append((os.path.realpath(HERE), "<here>"))
    for a, b in reps:
        text = text.replace(a, b)
    return text


def find_rank_dirs(level):
    step0 = p(level, "step0")
    return [os.path.join(step0, d) for d in sorted(os.listdir(step0))]


def compare_with_msprobe(entries, level):
    (rank_dir,) = find_rank_dirs(level)
    with open(os.path.join(rank_dir, "dump.json")) as f:
        dump = json.load(f)["data"]
    keys = ("Max", "Min", "Mean", "Norm")
    report = {"compared": 0, "identical_to_f32_stats": 0,
              # dump value vs the float64 statistics: relative difference for Max/Min/Norm; for Mean the
              # difference relative to the RMS of the gradient (BatchNorm input grads have means ~1e-10
              # that are pure rounding noise, so a plain relative difference says nothing there)
              "max_diff_vs_f64": {k: 0.0 for k in keys}, "mismatches": []}
    for fwd_name, e in entries.items():
        bwd = dump.get(e["backward_entry"])
        if bwd is None:
            report["mismatches"].append({"entry": e["backward_entry"], "problem": "missing in dump"})
            continue
        for side, ours in (("output", e["grad_wrt_inputs"]), ("input", e["grad_wrt_output"])):
            theirs = bwd.get(side, [])
            if len(theirs) != len(ours):
                report["mismatches"].append({"entry": e["backward_entry"], "side": side,
                                             "problem": f"{len(theirs)} items in dump vs {len(ours)}"})
                continue
            for i, (o, t) in enumerate(zip(ours, theirs)):
                report["compared"] += 1
                if o is None or t is None:
                    if not (o is None and t is None):
                        report["mismatches"].append({"entry": e["backward_entry"], "side": side, "index": i,
                                                     "problem": f"autograd {o is not None} / dump {t is not None}"})
                    continue
                if t["shape"] != o["shape"] or t["dtype"] != o["dtype"]:
                    report["mismatches"].append({"entry": e["backward_entry"], "side": side, "index": i,
                                                 "problem": "shape/dtype"})
                    continue
                if all(t[k] == o["stats_f32_torch"][k] for k in keys):
                    report["identical_to_f32_stats"] += 1
                else:
                    report["mismatches"].append({"entry": e["backward_entry"], "side": side, "index": i,
                                                 "dump": {k: t[k] for k in keys},
                                                 "autograd_f32": o["stats_f32_torch"]})
                numel = 1
                for n in o["shape"]:
                    numel *= n
                rms = o["stats_f64"]["Norm"] / numel ** 0.5
                for k in keys:
                    ref = o["stats_f64"][k]
                    scale = rms if k == "Mean" else abs(ref)
                    diff = abs(t[k] - ref) / max(scale, 1e-300) if t[k] != ref else 0.0
                    report["max_diff_vs_f64"][k] = max(report["max_diff_vs_f64"][k], diff)
    return report


def main():
    if os.environ.get("PYTHONHASHSEED") != "0":
        # torch.jit.save writes the Final constants of a scripted class in set order; a fixed hash
        # seed makes model.pt byte-for-byte reproducible
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump-worker", choices=LEVELS)
    ap.add_argument("--result")
    args = ap.parse_args()
    if args.dump_worker:
        dump_worker(args.dump_worker, args.result)
        return

    msprobe_py = os.environ.get("MSPROBE_PY")
    if not msprobe_py or not os.path.isdir(os.path.join(msprobe_py, "msprobe")):
        sys.exit("set MSPROBE_PY to the directory that contains msprobe's package (<checkout>/python)")

    facts = make_model_and_input()
    entries, root, plain = autograd_reference()

    write_configs()
    import tempfile
    tmp = tempfile.mkdtemp(prefix="msprobe_residual_")
    worker = {}
    for level in LEVELS:
        shutil.rmtree(p(level), ignore_errors=True)
        res = os.path.join(tmp, f"{level}.pt")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--dump-worker", level, "--result", res],
                       check=True, cwd=HERE)
        r = torch.load(res)
        worker[level] = {
            "start_consumed_rng": r["start_consumed_rng"],
            "out_bit_identical_to_plain_run": torch.equal(r["out"], plain["out"]),
            "loss_bit_identical_to_plain_run": torch.equal(r["loss"], plain["loss"]),
            "x_grad_bit_identical_to_plain_run": torch.equal(r["x_grad"], plain["x_grad"]),
        }
    shutil.rmtree(tmp)

    # stack.json: absolute paths -> <msprobe>/..., <site-packages>/..., <here>/...; files world-readable
    for level in LEVELS:
        for rank_dir in find_rank_dirs(level):
            for fn in sorted(os.listdir(rank_dir)):
                path = os.path.join(rank_dir, fn)
                if fn == "stack.json":
                    with open(path) as f:
                        text = f.read()
                    with open(path, "w") as f:
                        f.write(rewrite_paths(text, msprobe_py))
                os.chmod(path, 0o644)
            for d in (rank_dir, os.path.dirname(rank_dir), p(level)):
                os.chmod(d, 0o755)

    comparison = {level: compare_with_msprobe(entries, level) for level in LEVELS}
    ref = {
        "description": "Plain-autograd gradients of every module call of ResCNN for the step "
                       "seed(7); out = model(x); loss = (out**2).sum(); loss.backward(). Keys are msprobe's "
                       "module forward entry names. grad_wrt_inputs[i] = gradient w.r.t. the i-th tensor "
                       "input from the uses inside that call (torch.autograd.grad(call_output, call_inputs, "
                       "grad_outputs=dloss/dcall_output)) = msprobe's backward 'output'; grad_wrt_output = "
                       "dloss/dcall_output (retain_grad) = msprobe's backward 'input'. stats_f64: max/min/"
                       "mean/L2 norm of the float32 gradient computed in float64; stats_f32_torch: the same "
                       "computed with torch.max/min/mean/norm in float32 (how msprobe computes them).",
        "torch_version": torch.__version__,
        "entries": entries,
        "root": root,
        "msprobe_comparison": comparison,
        "checks": dict(facts, msprobe_runs=worker),
    }
    with open(p("autograd_reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(json.dumps({"checks": ref["checks"], "comparison": {
        lv: {k: v for k, v in c.items() if k != "mismatches"} | {"mismatches": len(c["mismatches"])}
        for lv, c in comparison.items()}}, indent=1))


if __name__ == "__main__":
    main()

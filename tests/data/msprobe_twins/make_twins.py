#!/usr/bin/python3
"""The compare-twins corpus: small models built once in Python (here) and once in C++
(tests/torch/compare_twins_test.cpp), dumped by msprobe (here) and by TorchProbe (the test).

For every twin T this writes, next to this script:
  T/twin.pt   a flat list [name, tensor, name, tensor, ...] (libtorch's pickle_load reads lists, not
              dicts): "state.<name>" the weights and buffers before the step (the C++ twin copies
              them by name instead of trusting two constructors to draw the same numbers),
              "input.<i>" the inputs, and the plain (un-probed) step's results: "out", "loss",
              "grad.input.<i>" and "grad.<parameter>", which the C++ twin must reproduce bit for bit
  T/L1, T/mix msprobe's statistics dumps of the same step (one step each; paths in stack.json
              rewritten to <msprobe>/, <site-packages>/, <here>/)

The step: torch.manual_seed(7); out = model(*inputs) (the first item when it returns a tuple);
loss = out.pow(2).sum(); loss.backward(); with one intra-op thread, and on torch 2.x without oneDNN (see below).

Usage (cwd does not matter):
  MSPROBE_PY=<msprobe checkout>/python /usr/bin/python3 make_twins.py [TWIN ...]
  ... make_twins.py --set torch2.6 [TWIN ...]   (in Debian 13's chroot: .ci/debian13.sh)
--set NAME writes a second set under NAME/ (T/twin.pt, T/L1, T/mix) for another torch: the weights
and inputs are the first set's (read from T/twin.pt here), the plain step's results and msprobe's
dumps are this torch's. The C++ test of libtorch 2.x compares with torch2.6/, never with 1.13's.
msprobe runs in child processes (`--worker TWIN LEVEL`), so its patching of torch never touches the
plain reference run. Made with msprobe 26.0.0 (Ascend/msprobe @ 8ff00da) and Debian 12's torch 1.13.1;
torch 1.13 needs ../msprobe_residual/msprobe_shims (see torch113_compat.py there).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn

# The kernels, in the reference step and in msprobe's runs alike, and in the C++ test
# (tests/torch/test_support.hpp, ReferenceKernels): one intra-op thread, since ATen splits a
# reduction's work by thread count (layer_norm's weight gradient) and torch's default count is the
# machine's physical cores, which differ between machines (2 where the first torch 2.6 set was made,
# 1 on other CI machines); and on torch 2.x no oneDNN, whose convolution gradients (oneDNN 3.7 of
# Debian 13) are wrong and differ from run to run on some AVX-512 machines. The torch 1.13 set was
# made with oneDNN 2.6, which agrees with ATen there, and is kept.
torch.set_num_threads(1)
if int(torch.__version__.split(".")[0]) >= 2:
    torch.backends.mkldnn.enabled = False

HERE = os.path.dirname(os.path.abspath(__file__))
SHIMS = os.path.join(HERE, "..", "msprobe_residual", "msprobe_shims")
LEVELS = ("L1", "mix")
STEP_SEED = 7


class Twin(nn.Module):
    """The root of a twin: named children and a forward function (msprobe does not dump the root)."""

    def __init__(self, children, fn):
        super().__init__()
        for name, m in children.items():
            self.add_module(name, m)
        self.fn = fn

    def forward(self, *xs):
        return self.fn(self, *xs)


class Block(nn.Module):
    """The transformer twin's block: pre-norm MLP with a residual, then a norm. No module guard in
    C++ (a container known to construct.json only)."""

    def __init__(self, d):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * d, d)
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x):
        return self.ln2(x + self.fc2(self.act(self.fc1(self.ln1(x)))))


class AttnBlock(nn.Module):
    """A small transformer encoder block: attention (head_dim 16, where C++'s q * 1/sqrt(16) and
    Python 1.13's q / sqrt(16) are both exact) and an MLP, each pre-norm with a residual."""

    def __init__(self, d):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, d // 16)
        self.ln2 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, 2 * d)
        self.act = nn.ReLU()
        self.ff2 = nn.Linear(2 * d, d)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h)[0]
        return x + self.ff2(self.act(self.ff1(self.ln2(x))))


class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.downsample = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
                           if stride != 1 or c_in != c_out else None)

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


def randn(*shape):
    return torch.randn(*shape)


def activations_fn(m, x):
    h = m.fc(x)
    return (m.relu(h) + m.gelu(h) + m.silu(h) + m.tanh(h) + m.sigmoid(h) + m.leaky(h) + m.elu(h) + m.softplus(h) +
            m.hardtanh(h) + m.softmax(h) + m.logsoftmax(h))


def losses_fn(m, x, target, labels, probs):
    h = m.fc(x)
    return (m.mse(h, target) + m.ce(h, labels) + m.l1(h, target) + m.smooth(h, target) + m.bce(h, probs) +
            m.nll(m.logsm(h), labels))


def pooling_fn(m, x):
    h = m.maxpool(m.conv(x))
    return m.avgpool(h) + m.adaptmax(h) + m.adapt(h)


# name -> (children, forward, inputs, train mode). Integer inputs get no gradient.
TWINS = {
    "linear": (lambda: {"fc": nn.Linear(16, 8)}, lambda m, x: m.fc(x), lambda: [randn(4, 16)], True),
    "linear_3d": (lambda: {"fc": nn.Linear(16, 8, bias=False)}, lambda m, x: m.fc(x), lambda: [randn(2, 3, 16)],
                  True),
    "bilinear": (lambda: {"bil": nn.Bilinear(8, 6, 4)}, lambda m, a, b: m.bil(a, b), lambda: [randn(4, 8), randn(4, 6)],
                 True),
    "conv1d": (lambda: {"conv": nn.Conv1d(3, 4, 3, padding=1)}, lambda m, x: m.conv(x), lambda: [randn(2, 3, 10)], True),
    "conv2d": (lambda: {"conv": nn.Conv2d(3, 4, 3, stride=2, padding=1)}, lambda m, x: m.conv(x),
               lambda: [randn(2, 3, 8, 8)], True),
    "conv3d": (lambda: {"conv": nn.Conv3d(2, 3, 3, padding=1)}, lambda m, x: m.conv(x), lambda: [randn(1, 2, 4, 4, 4)],
               True),
    "conv_transpose2d": (lambda: {"deconv": nn.ConvTranspose2d(4, 3, 3, stride=2)}, lambda m, x: m.deconv(x),
                         lambda: [randn(2, 4, 5, 5)], True),
    "batch_norm": (lambda: {"bn": nn.BatchNorm2d(4)}, lambda m, x: m.bn(x), lambda: [randn(3, 4, 5, 5)], True),
    "instance_norm": (lambda: {"norm": nn.InstanceNorm1d(4, affine=True)}, lambda m, x: m.norm(x),
                      lambda: [randn(2, 4, 10)], True),
    "layer_norm": (lambda: {"ln": nn.LayerNorm(16)}, lambda m, x: m.ln(x), lambda: [randn(4, 16)], True),
    "group_norm": (lambda: {"gn": nn.GroupNorm(2, 4)}, lambda m, x: m.gn(x), lambda: [randn(2, 4, 6)], True),
    "embedding": (lambda: {"emb": nn.Embedding(20, 8)}, lambda m, i: m.emb(i), lambda: [torch.randint(0, 20, (3, 5))],
                  True),
    "embedding_bag": (lambda: {"bag": nn.EmbeddingBag(20, 8, mode="mean")}, lambda m, i: m.bag(i),
                      lambda: [torch.randint(0, 20, (4, 3))], True),
    "rnn": (lambda: {"rnn": nn.RNN(8, 16, batch_first=True)}, lambda m, x: m.rnn(x)[0], lambda: [randn(2, 5, 8)], True),
    "lstm": (lambda: {"lstm": nn.LSTM(8, 16, batch_first=True)}, lambda m, x: m.lstm(x)[0], lambda: [randn(2, 5, 8)],
             True),
    "gru": (lambda: {"gru": nn.GRU(8, 16, batch_first=True)}, lambda m, x: m.gru(x)[0], lambda: [randn(2, 5, 8)], True),
    "prelu": (lambda: {"act": nn.PReLU(4)}, lambda m, x: m.act(x), lambda: [randn(2, 4, 5)], True),
    "multihead_attention": (lambda: {"attn": nn.MultiheadAttention(32, 2)}, lambda m, x: m.attn(x, x, x)[0],
                            lambda: [randn(5, 2, 32)], True),
    "dropout_eval": (lambda: {"fc": nn.Linear(16, 16), "drop": nn.Dropout(0.5)}, lambda m, x: m.drop(m.fc(x)),
                     lambda: [randn(4, 16)], False),
    "activations": (lambda: {"fc": nn.Linear(16, 16), "relu": nn.ReLU(), "gelu": nn.GELU(), "silu": nn.SiLU(),
                             "tanh": nn.Tanh(), "sigmoid": nn.Sigmoid(), "leaky": nn.LeakyReLU(0.1), "elu": nn.ELU(),
                             "softplus": nn.Softplus(), "hardtanh": nn.Hardtanh(), "softmax": nn.Softmax(dim=-1),
                             "logsoftmax": nn.LogSoftmax(dim=-1)},
                    activations_fn, lambda: [randn(4, 16)], True),
    "pooling": (lambda: {"conv": nn.Conv2d(2, 4, 3, padding=1), "maxpool": nn.MaxPool2d(2), "avgpool": nn.AvgPool2d(2),
                         "adaptmax": nn.AdaptiveMaxPool2d(2), "adapt": nn.AdaptiveAvgPool2d(1)},
                pooling_fn, lambda: [randn(2, 2, 8, 8)], True),
    "losses": (lambda: {"fc": nn.Linear(16, 5), "mse": nn.MSELoss(), "ce": nn.CrossEntropyLoss(), "l1": nn.L1Loss(),
                        "smooth": nn.SmoothL1Loss(), "bce": nn.BCEWithLogitsLoss(), "nll": nn.NLLLoss(),
                        "logsm": nn.LogSoftmax(dim=1)},
               losses_fn, lambda: [randn(4, 16), randn(4, 5), torch.randint(0, 5, (4,)), torch.rand(4, 5)], True),
    # The issue's own case: an Embedding, a block of Linear and LayerNorm layers with an activation,
    # a head; the block is a container.
    "transformer": (lambda: {"emb": nn.Embedding(50, 32), "block": Block(32), "head": nn.Linear(32, 10)},
                    lambda m, i: m.head(m.block(m.emb(i))), lambda: [torch.randint(0, 50, (2, 6))], True),
    "transformer_attention": (lambda: {"emb": nn.Embedding(50, 32), "block": AttnBlock(32), "head": nn.Linear(32, 10)},
                              lambda m, i: m.head(m.block(m.emb(i))), lambda: [torch.randint(0, 50, (6, 2))], True),
    "residual_cnn": (lambda: {"conv": nn.Conv2d(3, 8, 3, 1, 1, bias=False), "bn": nn.BatchNorm2d(8), "relu": nn.ReLU(),
                              "layer1": nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 16, 2)),
                              "pool": nn.AdaptiveAvgPool2d(1), "fc": nn.Linear(16, 10)},
                     lambda m, x: m.fc(torch.flatten(m.pool(m.layer1(m.relu(m.bn(m.conv(x))))), 1)),
                     lambda: [randn(2, 3, 8, 8)], True),
}


if hasattr(torch.nn.functional, "scaled_dot_product_attention"):  # torch 2.x: the torch2.6 set only
    TWINS["scaled_dot_product_attention"] = (
        lambda: {"proj": nn.Linear(16, 48)},
        lambda m, x: torch.nn.functional.scaled_dot_product_attention(*m.proj(x).chunk(3, dim=-1)),
        lambda: [randn(2, 5, 16)], True)


FIRST_SET = sorted(n for n in TWINS if n != "scaled_dot_product_attention")


def build(name):
    children, fn, inputs, train = TWINS[name]
    seed = 1000 + FIRST_SET.index(name) if name in FIRST_SET else 2000
    torch.manual_seed(seed)
    model = Twin(children(), fn)
    model.train(train)
    xs = inputs()
    with_grad = 2 if name == "bilinear" else 1  # the leading inputs; targets and indices get no gradient
    xs = [x.requires_grad_(True) if x.is_floating_point() and i < with_grad else x for i, x in enumerate(xs)]
    return model, xs


def step(model, xs):
    torch.manual_seed(STEP_SEED)
    out = model(*xs)
    if isinstance(out, tuple):
        out = out[0]
    loss = out.pow(2).sum()
    loss.backward()
    return out, loss


def load_twin(name, root=HERE):
    """The model and inputs as root/name/twin.pt saved them (a fresh copy, gradients cleared)."""
    items = torch.load(os.path.join(root, name, "twin.pt"))
    saved = dict(zip(items[0::2], items[1::2]))
    model, xs = build(name)
    with torch.no_grad():
        for k, v in list(model.named_parameters()) + list(model.named_buffers()):
            v.copy_(saved["state." + k])
    xs = [saved[f"input.{i}"].clone().requires_grad_(x.requires_grad) for i, x in enumerate(xs)]
    return model, xs, saved


def make_twin(name, root=HERE):
    os.makedirs(os.path.join(root, name), exist_ok=True)
    if root == HERE or not os.path.exists(os.path.join(HERE, name, "twin.pt")):
        model, xs = build(name)  # (a twin of the second set only is built from its seed)
    else:  # a second set: the first set's weights and inputs
        model, xs, _ = load_twin(name)
    items = []
    for k, v in list(model.state_dict().items()):
        items += ["state." + k, v.detach().clone()]
    for i, x in enumerate(xs):
        items += [f"input.{i}", x.detach().clone()]
    out, loss = step(model, xs)
    items += ["out", out.detach().clone(), "loss", loss.detach().clone()]
    for i, x in enumerate(xs):
        if x.grad is not None:
            items += [f"grad.input.{i}", x.grad.clone()]
    for k, v in model.named_parameters():
        items += ["grad." + k, v.grad.clone()]
    torch.save(items, os.path.join(root, name, "twin.pt"))


def worker(name, level, result, root=HERE):
    sys.path[:0] = [SHIMS, os.environ["MSPROBE_PY"]]
    import torch113_compat  # noqa: F401
    import importlib.util
    import types
    if importlib.util.find_spec("tensorboard") is None:
        # msprobe's monitor imports torch.utils.tensorboard at import time, which needs tensorboard
        # (not packaged by Debian 13); the dump never uses it.
        stub = types.ModuleType("torch.utils.tensorboard")
        stub.SummaryWriter = type("SummaryWriter", (), {})
        sys.modules["torch.utils.tensorboard"] = stub
    from msprobe.pytorch import PrecisionDebugger

    work = tempfile.mkdtemp(prefix="twin_")
    cfg = {"task": "statistics", "dump_path": os.path.join(work, "dump"), "rank": [], "step": [], "level": level,
           "async_dump": False,
           "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}}
    with open(os.path.join(work, "cfg.json"), "w") as f:
        json.dump(cfg, f)
    model, xs, saved = load_twin(name, root)
    debugger = PrecisionDebugger(config_path=os.path.join(work, "cfg.json"))
    debugger.start(model)
    out, loss = step(model, xs)
    debugger.stop()
    debugger.step()
    same = torch.equal(out, saved["out"]) and torch.equal(loss, saved["loss"])
    (rank,) = os.listdir(os.path.join(work, "dump", "step0"))
    dest = os.path.join(root, name, level)
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(os.path.join(work, "dump", "step0", rank), dest)
    shutil.rmtree(work)
    with open(result, "w") as f:
        json.dump({"bit_identical_to_plain_run": same}, f)


def rewrite_paths(text):
    import site
    reps = [(os.path.join(os.path.realpath(os.environ["MSPROBE_PY"]), "msprobe"), "<msprobe>")]
    dirs = set(site.getsitepackages()) | {os.path.dirname(os.path.dirname(torch.__file__))}
    reps += [(d, "<site-packages>") for d in sorted(dirs, key=len, reverse=True)]
    reps += [(os.path.realpath(HERE), "<here>"), (HERE, "<here>")]
    for a, b in reps:
        text = text.replace(a, b)
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("twins", nargs="*")
    ap.add_argument("--worker", nargs=2, metavar=("TWIN", "LEVEL"))
    ap.add_argument("--result")
    ap.add_argument("--set", default="", help="a second set, written under this folder")
    args = ap.parse_args()
    root = os.path.join(HERE, args.set) if args.set else HERE
    if args.worker:
        worker(*args.worker, args.result, root)
        return
    if not os.path.isdir(os.path.join(os.environ.get("MSPROBE_PY", ""), "msprobe")):
        sys.exit("set MSPROBE_PY to the directory that contains msprobe's package (<checkout>/python)")
    names = args.twins or sorted(TWINS)
    print(f"torch {torch.__version__}: {len(names)} twins into {root}")
    procs = []
    for name in names:
        make_twin(name, root)
        for level in LEVELS:
            res = os.path.join(tempfile.gettempdir(), f"twin_{name}_{level}.json")
            procs.append((name, level, res, subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", name, level, "--result", res, "--set", args.set],
                stdout=subprocess.DEVNULL)))
            while sum(p.poll() is None for *_, p in procs) >= 2:
                procs[[p.poll() is None for *_, p in procs].index(True)][3].wait()
    failed = []
    for name, level, res, p in procs:
        if p.wait() != 0:
            failed.append(f"{name}/{level}: msprobe worker exit {p.returncode}")
            continue
        with open(res) as f:
            if not json.load(f)["bit_identical_to_plain_run"]:
                failed.append(f"{name}/{level}: msprobe's run is not bit-identical to the plain run")
        os.remove(res)
        stack = os.path.join(root, name, level, "stack.json")
        if os.path.exists(stack):
            with open(stack) as f:
                text = f.read()
            with open(stack, "w") as f:
                f.write(rewrite_paths(text))
    print("\n".join(failed) or f"{len(names)} twins, {len(procs)} msprobe dumps")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

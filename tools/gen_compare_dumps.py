#!/usr/bin/env python3
"""Synthetic transformer-like statistics dumps for timing `torchprobe compare` (issue 41, item 6).

gen_compare_dumps.py N OUT_DIR  ->  OUT_DIR/target/dump.json, OUT_DIR/bench/dump.json (N entries a
side, with construct.json: Module.layers.{i}.attn.Linear.forward.{n} modules, Aten.* ops inside,
forward + backward, some parameters_grad). The bench differs slightly from the target from the
middle on, so the judge has a divergence to find. Plain json: any python3 runs it.
"""
import json
import os
import sys


def tensor(seed, shape, drift=0.0):
    v = (seed % 997) / 997.0 + drift
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape, "Max": v + 1.0, "Min": v - 1.0,
            "Mean": v, "Norm": v * 3.0 + 1.0, "requires_grad": True}


def build(n, bench):
    data, construct = {}, {}
    ops = ["addmm", "gelu", "add", "mul", "softmax", "bmm"]
    i = 0
    layer = 0
    while len(data) < n:
        mod = f"Module.layers.{layer}.attn.Linear"
        fwd = f"{mod}.forward.0"
        drift = 1e-3 if bench and len(data) > n // 2 else 0.0
        shape = [8, 64]
        data[fwd] = {"input_args": [tensor(i, shape, drift)], "input_kwargs": {}, "output": [tensor(i + 1, shape, drift)]}
        construct[fwd] = None
        for k, op in enumerate(ops):
            if len(data) >= n:
                break
            name = f"Aten.{op}.{layer * len(ops) + k}.forward"
            data[name] = {"input_args": [tensor(i + k, shape, drift), tensor(i + k + 7, shape, drift)],
                          "input_kwargs": {}, "output": [tensor(i + k + 3, shape, drift)]}
            construct[name] = fwd
        for k, op in enumerate(ops[:3]):
            if len(data) >= n:
                break
            name = f"Aten.{op}.{layer * len(ops) + k}.backward"
            data[name] = {"input": [tensor(i + k + 11, shape, drift)], "output": [tensor(i + k + 13, shape, drift)]}
        if len(data) < n:
            data[f"{mod}.backward.0"] = {"input": [tensor(i + 5, shape, drift)], "output": [tensor(i + 6, shape, drift)]}
        if len(data) < n and layer % 4 == 0:
            data[f"{mod}.parameters_grad"] = {"weight": tensor(i + 9, [64, 64], drift), "bias": tensor(i + 10, [64], drift)}
        i += 17
        layer += 1
    return data, construct


def main():
    n, out = int(sys.argv[1]), sys.argv[2]
    for side in ("target", "bench"):
        data, construct = build(n, side == "bench")
        d = os.path.join(out, side)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "dump.json"), "w") as f:
            json.dump({"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None,
                       "data": data}, f, indent=1)
        with open(os.path.join(d, "construct.json"), "w") as f:
            json.dump(construct, f, indent=1)


if __name__ == "__main__":
    main()

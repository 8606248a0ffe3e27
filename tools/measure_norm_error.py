#!/usr/bin/env python3
"""How far torch's float32 Mean and Norm (what msprobe's Python dump writes) are from the exact ones.

Prints, for n = 10^3 .. 3*10^7 elements, the worst relative error of torch.norm and of torch.mean
(relative to the tensor's range) over standard normal, uniform [0, 1) and normal + 3 tensors, in
float32 epsilons (2^-23), and divided by n. compare/statistics_origin.hpp's allowance (n/1024
epsilons) comes from these figures. Run with Debian's /usr/bin/python3 (python3-torch).
"""
import math
import sys

import torch

EPS = 2.0 ** -23
sizes = [10**3, 10**4, 10**5, 10**6, 10**7, 3 * 10**7] if len(sys.argv) < 2 else [int(a) for a in sys.argv[1:]]
torch.manual_seed(0)
print(f"torch {torch.__version__}")
print(f"{'n':>10} {'norm err/eps':>13} {'/n':>10} {'mean err/eps':>13}")
for n in sizes:
    worst_norm = worst_mean = 0.0
    for make in (lambda: torch.randn(n), lambda: torch.rand(n), lambda: torch.randn(n) + 3):
        for _ in range(3):
            x = make()
            d = x.double()
            exact_norm = d.norm().item()
            worst_norm = max(worst_norm, abs(torch.norm(x).item() - exact_norm) / exact_norm)
            scale = max(abs(d.max().item()), abs(d.min().item()))
            worst_mean = max(worst_mean, abs(torch.mean(x).item() - d.mean().item()) / scale)
    print(f"{n:>10} {worst_norm / EPS:>13.1f} {worst_norm / EPS / n:>10.2e} {worst_mean / EPS:>13.1f}")
print(f"allowance: n/1024 = {1 / 1024:.2e} * n epsilons")

#!/usr/bin/env python3
"""msprobe's compare on the synthetic dumps of the compare benchmark (issue 41, item 6): a development
script, not run by CI (CI has no msprobe).

    PYTHONPATH=/path/to/msprobe/python python3 tools/msprobe_compare_ratio.py [N ...] [--work DIR]
        [--torchprobe BUILD/benchmarks/torchprobe_compare_benchmark]

For each N (default 10000 100000) it makes, or reuses, two dumps of N statistics entries a side with
tools/gen_compare_dumps.py (DIR/N/target, DIR/N/bench), then runs msprobe's Python compare on them in
a child process, as the reference dumps were compared: msprobe.pytorch.compare.pt_compare.pt_compare
with {"npu_path": .../dump.json, "bench_path": .../dump.json} (summary mode; no stack.json in these
dumps) -- and prints its wall time and the child's max RSS. Give TorchProbe's figure at the same size
(the compare benchmark's end-to-end seconds, benchmarks/compare_benchmark.cpp) with --tp N=SECONDS to
print the ratio msprobe / TorchProbe. msprobe's package imports einops for an NPU operator that compare
never calls; where einops is missing the child stubs it.
"""
import argparse
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import resource, sys, time, types
try:
    import einops  # noqa: F401  (msprobe.pytorch imports it for an NPU op that compare never calls)
except ImportError:
    stub = types.ModuleType("einops")
    stub.rearrange = stub.repeat = stub.reduce = lambda *a, **k: None
    sys.modules["einops"] = stub
from msprobe.pytorch.compare.pt_compare import pt_compare
npu, bench, out = sys.argv[1:4]
t = time.perf_counter()
pt_compare({"npu_path": npu, "bench_path": bench, "is_print_compare_log": False}, out)
print("SECONDS", time.perf_counter() - t)
print("MAXRSS_MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
"""


def dumps(n, work):
    d = os.path.join(work, str(n))
    if not os.path.exists(os.path.join(d, "bench", "dump.json")):
        subprocess.run([sys.executable, os.path.join(HERE, "gen_compare_dumps.py"), str(n), d], check=True)
    return os.path.join(d, "target", "dump.json"), os.path.join(d, "bench", "dump.json"), os.path.join(d, "msprobe_out")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sizes", nargs="*", type=int, default=[10000, 100000])
    ap.add_argument("--work", default="/tmp/tp_msprobe_ratio")
    ap.add_argument("--timeout", type=float, default=600, help="seconds before msprobe's run is given up")
    ap.add_argument("--tp", action="append", default=[], metavar="N=SECONDS",
                    help="TorchProbe's end-to-end figure at N (the compare benchmark's), for the ratio")
    a = ap.parse_args()
    tp = {int(k): float(v) for k, v in (x.split("=") for x in a.tp)}
    for n in a.sizes:
        npu, bench, out = dumps(n, a.work)
        t = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, "-c", CHILD, npu, bench, out], capture_output=True, text=True,
                               timeout=a.timeout)
        except subprocess.TimeoutExpired:
            print(f"{n:8d} entries a side: msprobe's compare did not finish in {a.timeout:.0f} s")
            continue
        wall = time.perf_counter() - t
        fig = dict(line.split(None, 1) for line in p.stdout.splitlines() if line.startswith(("SECONDS", "MAXRSS_MB")))
        if p.returncode != 0 or "SECONDS" not in fig:
            print(f"{n:8d} entries a side: msprobe's compare failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
            continue
        secs, rss = float(fig["SECONDS"]), float(fig["MAXRSS_MB"])
        line = (f"{n:8d} entries a side: msprobe's compare {secs:.2f} s (process {wall:.2f} s with imports), "
                f"max RSS {rss:.0f} MB")
        if n in tp:
            line += f"; TorchProbe {tp[n]:.2f} s: {secs / tp[n]:.1f}x faster"
        print(line, flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Run msprobe's offline multi-rank NaN/inf analyzer (nan_analyze) on one TorchProbe step directory.

    python3 tools/msprobe_nan_analyze.py --msprobe-src DIR STEP_DIR OUT_DIR

Runs exactly what `msprobe -f pytorch nan_analyze -i STEP_DIR -o OUT` runs: msprobe's own argument
parser (_nan_analyze_parser) and entry point (_run_nan_analyze in msprobe/nan_analyze/analyzer.py),
called directly because msprobe's full CLI imports every PyTorch tool (run_ut, einops, ...) first.
DIR is the folder holding the `msprobe` package (debug/accuracy_tools of Ascend/mstt, used at commit
99c2e0f990a17d328f487062acc9c490f7f6ff26, 2026-04-25; nan_analyze last changed in b2babb20); it
needs numpy, pandas, PyYAML, psutil and tqdm. msprobe reads STEP_DIR/rank{R}/{dump.json,
construct.json, stack.json} (a plain `rank` is rank 0), which is TorchProbe's layout, so nothing is
renamed (msprobe refuses symbolic links). msprobe writes anomaly_analyze_{time_ns}.json only where it
finds an anomaly; the file is copied into OUT_DIR unchanged. Its output is committed as test data,
so TorchProbe's tests do not need msprobe.
"""
import argparse
import glob
import os
import shutil
import sys
import tempfile


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--msprobe-src", required=True, help="folder holding the msprobe package")
    parser.add_argument("step_dir", help="a step directory: step{N}/ with rank{R}/ folders")
    parser.add_argument("out_dir", help="where msprobe's result file is copied")
    args = parser.parse_args()

    sys.path.insert(0, os.path.abspath(args.msprobe_src))
    from msprobe.nan_analyze.analyzer import _nan_analyze_parser, _run_nan_analyze

    with tempfile.TemporaryDirectory() as tmp:
        result_dir = os.path.join(tmp, "output")
        msprobe_parser = argparse.ArgumentParser(prog="msprobe -f pytorch nan_analyze")
        _nan_analyze_parser(msprobe_parser)
        _run_nan_analyze(msprobe_parser.parse_args(["-i", os.path.abspath(args.step_dir), "-o", result_dir]))
        results = sorted(glob.glob(os.path.join(result_dir, "anomaly_analyze_*.json")))
        if not results:
            print("msprobe found no anomaly; nothing written")
            return 0
        os.makedirs(args.out_dir, exist_ok=True)
        for path in results:
            shutil.copyfile(path, os.path.join(args.out_dir, os.path.basename(path)))
            print(os.path.join(args.out_dir, os.path.basename(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

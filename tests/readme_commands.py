#!/usr/bin/env python3
"""Runs every command README.md shows in a ```sh block, verbatim (issue 44, item 10).

The first block holds the two set-up commands, which CI runs as its stages; every other block is
the tool's commands. Each command runs with `sh -c`, as a user pastes it, in a scratch directory
that holds the inputs the README names (msprobe's reference dumps, copied under those names), with
the built `torchprobe` first on PATH. A command passes when it exits 0 (or 1 for `compare`, whose
status 1 says it found a divergence: README compares two different runs) and every path named in
the comment lines under it ("# -> ./cmp/...") exists, `{timestamp}`/`{ts}` matching any stamp.

  readme_commands.py --cli BUILD/tools/cli/torchprobe --readme README.md --ref REFERENCE_DUMPS --work DIR
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

# What each input path of README's commands is a copy of (under --ref). A command naming a path
# that is not here fails with that path: README and this table change together.
FIXTURES = {
    "dump_cpp/step0": "stat_mix/step0",
    "dump_python/step0": "stat_mix/step1",
    "dump_second_pass/step0": "tensor_mix/step1",
    "dump_second_pass_bench/step0": "tensor_mix/step0",
    "runA": "grad_probe/L1",
    "runB": "grad_probe/L1_runB",
    "dump_bf16": "run_ut/dump_bf16",
    "npu/accuracy_checking_details_{ts}.csv": "run_ut/out_bf16/accuracy_checking_details_20261201111944.csv",
    "gpu/accuracy_checking_details_{ts}.csv": "run_ut/out_bf16/accuracy_checking_details_20261201111944.csv",
}
# Exit statuses that mean success, per subcommand (compare: 1 = a divergence was found).
ACCEPTED = {"compare": {0, 1}}


def sh_blocks(readme):
    blocks, current = [], None
    for line in open(readme, encoding="utf-8").read().splitlines():
        if current is None and line.strip() == "```sh":
            current = []
        elif current is not None and line.strip() == "```":
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def commands(block):
    """(command, [paths its comment lines name]) for each command of a block."""
    out, pending = [], ""
    for line in block:
        stripped = line.strip()
        if pending:
            pending += "\n" + line
            if not stripped.endswith("\\"):
                out.append([pending, []])
                pending = ""
            continue
        if not stripped:
            continue
        if stripped.startswith("#"):
            if out:
                out[-1][1] += re.findall(r"\./[\w./{}-]+", stripped)
            continue
        if stripped.endswith("\\"):
            pending = line
        else:
            out.append([line, []])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--readme", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()

    blocks = sh_blocks(a.readme)
    if len(blocks) < 2:
        sys.exit("README.md has %d ```sh blocks; expected the set-up block and the tool's" % len(blocks))
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    for target, source in FIXTURES.items():
        src, dst = os.path.join(a.ref, source), os.path.join(a.work, target)
        if not os.path.exists(src):
            sys.exit("the reference input %s is missing (needed as %s)" % (src, target))
        os.makedirs(os.path.dirname(dst) or a.work, exist_ok=True)
        (shutil.copytree if os.path.isdir(src) else shutil.copyfile)(src, dst)
    bin_dir = os.path.join(a.work, ".bin")
    os.makedirs(bin_dir)
    os.symlink(os.path.abspath(a.cli), os.path.join(bin_dir, "torchprobe"))
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))

    failures, ran = [], 0
    for block in blocks[1:]:  # blocks[0]: the set-up commands, CI's stages
        for command, outputs in commands(block):
            words = command.split()
            if not words or words[0] != "torchprobe":
                failures.append("not a torchprobe command, which this test cannot run: " + command)
                continue
            ran += 1
            p = subprocess.run(["sh", "-c", command], cwd=a.work, env=env, capture_output=True, text=True)
            accepted = ACCEPTED.get(words[1], {0})
            if p.returncode not in accepted:
                failures.append("%s\n  exit status %d (expected %s)\n  stdout: %s\n  stderr: %s" %
                                (command, p.returncode, sorted(accepted), p.stdout[-2000:], p.stderr[-2000:]))
                continue
            for path in outputs:
                pattern = re.sub(r"\{(timestamp|ts)\}", "*", path)
                if not glob.glob(os.path.join(a.work, pattern)):
                    failures.append("%s\n  wrote no %s, which README says it writes" % (command, path))
            print("ran: %s (exit %d, %d outputs checked)" % (command.replace("\\\n", " "), p.returncode, len(outputs)))
    if ran == 0:
        failures.append("no command of README.md was run")
    for f in failures:
        print("FAILED: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

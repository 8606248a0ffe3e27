#!/usr/bin/env python3
"""Checks the rules the layout of include/torchprobe/ keeps (docs/architecture.md):

  1. folders form layers, and a header includes only headers of its own layer or of lower ones;
  2. our headers are included one way: #include "torchprobe/<folder>/<file>.hpp";
  3. no header is longer than 400 lines.

Exit status 1 with one line per violation; run by ctest (test "layout").
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "include" / "torchprobe"
# Bottom first. The top-level headers (debugger.hpp, ...) are above everything. compare/ is the
# `torchprobe compare` tool (no libtorch): it may use core/ and io/, and nothing includes it.
# run_ut/ is `torchprobe run_ut` (replays ops with libtorch): it may use compare/ and config/ (its -config goes
# through the config parser); nothing includes it.
LAYERS = ["core", "io", "compare", "stats", "config", "run_ut", "level", "sink", "details", "capture", "task", "."]
MAX_LINES = 400
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def layer_of(path: pathlib.Path) -> int:
    rel = path.relative_to(ROOT)
    folder = rel.parts[0] if len(rel.parts) > 1 else "."
    return LAYERS.index(folder)


def main() -> int:
    problems = []
    for header in sorted(ROOT.rglob("*.hpp")):
        rel = header.relative_to(ROOT.parent)
        text = header.read_text()
        lines = text.count("\n")
        if lines > MAX_LINES:
            problems.append(f"{rel}: {lines} lines (at most {MAX_LINES})")
        for kind, target in INCLUDE.findall(text):
            ours = target.startswith("torchprobe/") or (ROOT / target).exists() or (header.parent / target).exists()
            if not ours:
                continue
            if kind != '"' or not target.startswith("torchprobe/"):
                problems.append(f'{rel}: includes {target!r}; write #include "torchprobe/<folder>/<file>.hpp"')
                continue
            included = ROOT.parent / target
            if not included.exists():
                problems.append(f"{rel}: includes {target}, which does not exist")
                continue
            if layer_of(included) > layer_of(header):
                problems.append(f"{rel}: includes {target} from a higher layer "
                                f"({LAYERS[layer_of(header)]} < {LAYERS[layer_of(included)]})")
    for p in problems:
        print(p)
    print(f"check_layout: {len(problems)} problem(s) in {sum(1 for _ in ROOT.rglob('*.hpp'))} headers")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

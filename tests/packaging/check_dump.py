#!/usr/bin/env python3
"""Run a program that writes a TorchProbe dump, then check what it wrote.

    check_dump.py DUMP_DIR [checks...] -- PROGRAM [ARGS...]

DUMP_DIR is deleted first, so a dump left by an earlier run can never make the check pass. The
program must exit 0; then every expected step{N}/ must hold one rank/proc directory whose dump.json
parses (Python's json, which also reads the NaN/Infinity tokens msprobe writes) and has entries,
plus whatever the options ask: named entries, a name filter, skipped steps, a frame in stack.json,
a construct.json that maps entries to modules.
Used by the example tests and the consumer-project checks; needs only the standard library.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path


def fail(message: str) -> None:
    print(f"check_dump: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def steps_arg(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s]


def main() -> None:
    argv = sys.argv[1:]
    if "--" not in argv:
        fail("usage: check_dump.py DUMP_DIR [checks...] -- PROGRAM [ARGS...]")
    split = argv.index("--")
    p = argparse.ArgumentParser()
    p.add_argument("dump_dir", type=Path)
    p.add_argument("--steps", type=steps_arg, default=[0], help="steps that must be dumped (default 0)")
    p.add_argument("--absent-steps", type=steps_arg, default=[], help="steps that must not be dumped")
    p.add_argument("--entry", action="append", default=[], help="an entry every dumped step must contain")
    p.add_argument("--stack-frame", default="", help="text that stack.json must contain (a function name)")
    p.add_argument("--construct", action="store_true", help="construct.json must map entries to modules")
    p.add_argument("--only", default="", help="comma-separated: every entry name must contain one of these")
    args = p.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        fail("no program to run")

    shutil.rmtree(args.dump_dir, ignore_errors=True)
    rc = subprocess.call(command)
    if rc != 0:
        fail(f"{command[0]} exited with status {rc}")

    only = [s for s in args.only.split(",") if s]
    for step in args.steps:
        step_dir = args.dump_dir / f"step{step}"
        subdirs = sorted(d for d in step_dir.glob("*") if d.is_dir()) if step_dir.is_dir() else []
        if len(subdirs) != 1:
            fail(f"{step_dir}: expected one rank/proc directory, found {[d.name for d in subdirs]}")
        dump_json = subdirs[0] / "dump.json"
        try:
            dump = json.loads(dump_json.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            fail(f"{dump_json}: {e}")
        data = dump.get("data")
        if not isinstance(data, dict) or not data:
            fail(f"{dump_json}: no entries under \"data\"")
        for name in args.entry:
            if name not in data:
                fail(f"{dump_json}: no entry {name!r} (has {sorted(data)[:12]})")
        for name in data:
            if only and not any(part in name for part in only):
                fail(f"{dump_json}: entry {name!r} should have been filtered out (list {only})")
        if args.construct:
            construct_json = subdirs[0] / "construct.json"
            try:
                construct = json.loads(construct_json.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                fail(f"{construct_json}: {e}")
            if not isinstance(construct, dict) or not any(construct.values()):
                fail(f"{construct_json}: no entry is mapped to an enclosing module")
        if args.stack_frame:
            stack_json = subdirs[0] / "stack.json"
            stack = stack_json.read_text(encoding="utf-8") if stack_json.is_file() else ""
            if args.stack_frame not in stack:
                fail(f"{stack_json}: no frame names {args.stack_frame!r} (stripped, or linked without -rdynamic and symbols?)")
        print(f"check_dump: {dump_json}: {len(data)} entries, task {dump.get('task')!r}, level {dump.get('level')!r}")
    for step in args.absent_steps:
        if (args.dump_dir / f"step{step}").exists():
            fail(f"{args.dump_dir / f'step{step}'} exists although the configuration skips step {step}")
    print("check_dump: OK")


if __name__ == "__main__":
    main()

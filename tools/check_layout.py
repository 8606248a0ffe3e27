#!/usr/bin/env python3
"""Checks the rules the layout of include/torchprobe/ keeps (docs/architecture.md):

  1. folders form layers, and a header includes only headers of its own layer or of lower ones;
  2. our headers are included one way: #include "torchprobe/<folder>/<file>.hpp";
  3. no header is longer than 400 lines;
  4. what README promises of the sources: the library and the tool never call
     std::filesystem::remove_all (pip's torch 2.x exports a broken copy of it, README "Install"), and
     torchprobe.hpp does not reach distributed.hpp nor c10d's headers (README "Distributed").

Exit status 1 with one line per violation; run by ctest (test "layout").
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "include" / "torchprobe"
# The probe's layers, bottom first. The top-level headers (debugger.hpp, ...) are above everything.
LAYERS = ["core", "io", "stats", "config", "level", "sink", "task", "details", "capture", "."]
# analysis/ is a component apart from the probe (CMake target torchprobe::analysis, used by the CLI):
# nothing in the probe includes it, and each of its folders names the probe layers it may use.
# analysis/compare is `torchprobe compare` (no libtorch): core/ and io/ only. analysis/run_ut is
# `torchprobe run_ut` (replays ops with libtorch): compare, and config/ (its -config goes through the
# config parser).
ANALYSIS = {
    "analysis/compare": {"core", "io", "analysis/compare"},
    "analysis/run_ut": {"core", "io", "config", "analysis/compare", "analysis/run_ut"},
}
MAX_LINES = 400
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def folder_of(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "analysis" and len(rel.parts) > 2:
        return "analysis/" + rel.parts[1]
    return rel.parts[0] if len(rel.parts) > 1 else "."


def layer_of(path: pathlib.Path) -> int:
    return LAYERS.index(folder_of(path))


def misplaced(header: pathlib.Path, included: pathlib.Path):
    """Why header may not include included, or None."""
    mine, theirs = folder_of(header), folder_of(included)
    if mine in ANALYSIS:
        return None if theirs in ANALYSIS[mine] else f"{mine} may use only {', '.join(sorted(ANALYSIS[mine]))}"
    if theirs in ANALYSIS:
        return f"the probe never includes the analysis component ({theirs})"
    if layer_of(included) > layer_of(header):
        return f"from a higher layer ({mine} < {theirs})"
    return None


def reached_from(header: pathlib.Path) -> set:
    """Every header of ours that `header` includes, directly or not, and the others it names."""
    seen, todo, others = set(), [header], set()
    while todo:
        h = todo.pop()
        if h in seen:
            continue
        seen.add(h)
        for _, target in INCLUDE.findall(h.read_text()):
            if target.startswith("torchprobe/") and (ROOT.parent / target).exists():
                todo.append(ROOT.parent / target)
            else:
                others.add(target)
    return seen | others


def promised_rules() -> list:
    problems = []
    sources = list(ROOT.rglob("*.hpp")) + list((ROOT.parent.parent / "tools" / "cli").rglob("*.[ch]pp"))
    for f in sorted(sources):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("//")[0]
            if re.search(r"\bremove_all\s*\(", code):
                problems.append(f"{f.relative_to(ROOT.parent.parent)}:{n}: calls remove_all, which pip's torch 2.x "
                                "breaks (README, Install): remove folders as tests/remove_tree.hpp does")
    reached = reached_from(ROOT / "torchprobe.hpp")
    for r in sorted(map(str, reached)):
        if r.endswith("distributed.hpp") or "distributed/c10d" in r:
            problems.append(f"include/torchprobe/torchprobe.hpp reaches {r}: it needs c10d's headers and is "
                            "included only where the program asks for it (README, Distributed)")
    return problems


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
            why = misplaced(header, included)
            if why:
                problems.append(f"{rel}: includes {target}: {why}")
    problems += promised_rules()
    for p in problems:
        print(p)
    print(f"check_layout: {len(problems)} problem(s) in {sum(1 for _ in ROOT.rglob('*.hpp'))} headers")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

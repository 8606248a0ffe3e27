#!/usr/bin/env python3
"""Build single_include/torchprobe.hpp, the one-file edition of TorchProbe.

    python3 tools/make_single_include.py            # (re)write single_include/torchprobe.hpp and
                                                    # single_include/torchprobe_compiled.cpp
    python3 tools/make_single_include.py --check    # exit 1 when a committed file is stale
    python3 tools/make_single_include.py --list     # print the inlined headers in dependency order

Starting from the umbrella header include/torchprobe/torchprobe.hpp, every include of one of
TorchProbe's own headers is replaced by that header's text, depth first, so each header appears
after the headers it needs and only once (the first include wins, as #pragma once would make it).
Everything else -- <torch/...>, <nlohmann/...>, <xsimd/...>, the standard library -- stays an
ordinary #include, because a user of the single header still builds against those packages.

Only the Python standard library is used, and the output depends on nothing but the headers'
text (no dates, no absolute paths), so regenerating an unchanged tree gives the same bytes.
"""
from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INCLUDE_ROOT = REPO / "include"           # what -I points at: includes are "torchprobe/..."
PROJECT_DIR = INCLUDE_ROOT / "torchprobe"  # a header below here is ours and gets inlined
UMBRELLA = PROJECT_DIR / "torchprobe.hpp"
OUTPUT = REPO / "single_include" / "torchprobe.hpp"
# The compiled library of the single header's users (the CMake target torchprobe::compiled is the
# same for include/'s): one source file, written beside the header.
COMPILED_NAME = "torchprobe_compiled.cpp"

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
PRAGMA_ONCE_RE = re.compile(r"^\s*#\s*pragma\s+once\b")
IF_RE = re.compile(r"^\s*#\s*if(n?def)?\b")
ENDIF_RE = re.compile(r"^\s*#\s*endif\b")
ELSE_RE = re.compile(r"^\s*#\s*(else|elif)\b")
VERSION_RE = re.compile(r"^\s*#\s*define\s+TORCHPROBE_VERSION_STRING\s+\"([^\"]*)\"", re.M)

# Headers that are meant to be included more than once with different effects (assert.h follows
# NDEBUG at each inclusion), so a repeated include of them is never dropped.
REINCLUDABLE = {"cassert", "assert.h"}


class GenerationError(Exception):
    pass


def rel(path: Path) -> str:
    """The include spelling of one of our headers: torchprobe/config/config.hpp."""
    return path.relative_to(INCLUDE_ROOT).as_posix()


def resolve_own(spelling: str, quoted: bool, including_file: Path) -> Path | None:
    """Our header that an include names, or None for a system / third-party header.

    A quoted include is looked up next to the including file first, then under include/ (what the
    compiler does with -I include); an angle include only under include/.
    """
    candidates = []
    if quoted:
        candidates.append(including_file.parent / spelling)
    candidates.append(INCLUDE_ROOT / spelling)
    for c in candidates:
        c = c.resolve()
        if c.is_file() and PROJECT_DIR in c.parents:
            return c
    if quoted:
        # A quoted include we cannot find would break a user who has only the single header.
        raise GenerationError(f'{rel(including_file)}: cannot resolve #include "{spelling}" to a TorchProbe header')
    return None


class Amalgamator:
    def __init__(self) -> None:
        self.done: set[Path] = set()     # headers already inlined (or being inlined: a cycle stops here)
        self.order: list[Path] = []      # in the order their text appears in the output
        self.system_seen: set[str] = set()
        self.out: list[str] = []

    def inline(self, path: Path, outer_depth: int) -> None:
        self.done.add(path)
        name = rel(path)
        is_umbrella = path == UMBRELLA
        if not is_umbrella:
            self.out.append(f"// ---- begin {name} ----\n")
        depth = outer_depth  # #if nesting around the current line, counting the includer's
        # The umbrella may choose between branches at its top #if level (TORCHPROBE_COMPILED_LIB:
        # the compiled library's declarations, or the implementations). Each branch is inlined as if
        # it were the only one, from what was inlined before the #if; after the #endif nothing more
        # of ours may be included, since which headers are there depends on the branch taken.
        snapshot = None  # (done, system_seen) at the umbrella's #if
        union = None
        after_branches = False
        text = path.read_text(encoding="utf-8")
        for line in text.splitlines(keepends=True):
            if not line.endswith("\n"):
                line += "\n"
            if PRAGMA_ONCE_RE.match(line):
                continue  # the single header carries one #pragma once at its top
            if IF_RE.match(line):
                depth += 1
                if is_umbrella and depth == 1:
                    snapshot = (set(self.done), set(self.system_seen))
                    union = (set(), set())
            elif ENDIF_RE.match(line):
                depth -= 1
                if is_umbrella and depth == 0 and snapshot is not None:
                    union[0].update(self.done)
                    union[1].update(self.system_seen)
                    after_branches = after_branches or union[0] != snapshot[0]
                    self.done, self.system_seen = union
                    snapshot = union = None
            elif ELSE_RE.match(line) and is_umbrella and depth == 1 and snapshot is not None:
                union[0].update(self.done)
                union[1].update(self.system_seen)
                self.done, self.system_seen = set(snapshot[0]), set(snapshot[1])
            m = INCLUDE_RE.match(line)
            if not m:
                self.out.append(line)
                continue
            quoted, spelling = m.group(1) == '"', m.group(2).strip()
            own = resolve_own(spelling, quoted, path)
            if own is not None:
                if is_umbrella and depth == 1 and snapshot is not None:
                    if own not in self.done:
                        self.inline(own, 0)  # a branch of the umbrella: inlined as unconditional text
                    continue
                if is_umbrella and after_branches:
                    raise GenerationError(f"{name}: #include of {rel(own)} after the #if that chooses headers")
                if depth != 0:
                    # "Once each" is only right when the include is unconditional: inside an #if the
                    # first occurrence might be the inactive one.
                    raise GenerationError(f"{name}: #include of {rel(own)} inside #if is not supported")
                if own not in self.done:
                    self.inline(own, depth)
                continue
            # A system or third-party header: keep it where it is (macros defined before it may
            # matter), dropping repeats only where repeating provably changes nothing.
            if depth == 0 and spelling not in REINCLUDABLE:
                if spelling in self.system_seen:
                    continue
                self.system_seen.add(spelling)
            self.out.append(line)
        if depth != outer_depth:
            raise GenerationError(f"{name}: unbalanced #if/#endif")
        if not is_umbrella:
            self.out.append(f"// ---- end {name} ----\n")
        self.order.append(path)


def banner(version: str) -> str:
    return (
        "// TorchProbe " + version + " -- single-header edition\n"
        "//\n"
        "// GENERATED FILE, DO NOT EDIT. tools/make_single_include.py writes it from include/torchprobe/;\n"
        "// change those headers and run `python3 tools/make_single_include.py` (CI runs it with --check).\n"
        "//\n"
        "// Needs the same as the multi-file headers: C++17, -DNDEBUG, -fopenmp, libtorch, nlohmann_json,\n"
        "// xsimd and zlib on the include/link line, and -rdynamic for named frames in stack.json\n"
        "// (docs/packaging.md). Licensed under the Apache License 2.0 (LICENSE in the repository).\n"
        "#pragma once\n"
    )


def generate() -> tuple[str, list[Path]]:
    if not UMBRELLA.is_file():
        raise GenerationError(f"missing {UMBRELLA}")
    m = VERSION_RE.search((PROJECT_DIR / "version.hpp").read_text(encoding="utf-8"))
    if not m:
        raise GenerationError("include/torchprobe/version.hpp defines no TORCHPROBE_VERSION_STRING")
    a = Amalgamator()
    a.inline(UMBRELLA.resolve(), 0)
    body = "".join(a.out)
    return banner(m.group(1)) + body, a.order, compiled_source(m.group(1))


def compiled_source(version: str) -> str:
    """single_include/torchprobe_compiled.cpp: what src/*.cpp define, in one file for the single header."""
    return (
        "// TorchProbe " + version + " -- the compiled library of the single-header edition\n"
        "//\n"
        "// GENERATED FILE, DO NOT EDIT. tools/make_single_include.py writes it beside torchprobe.hpp.\n"
        "//\n"
        "// Compile this one file into your program (or a library of yours), with torchprobe.hpp next to it\n"
        "// and the same flags as the files that include torchprobe.hpp, and define TORCHPROBE_COMPILED_LIB\n"
        "// for every one of them and this one (-DTORCHPROBE_COMPILED_LIB=1). Your files then parse the\n"
        "// debuggers' faces only and compile in seconds; the built-in debuggers and PrecisionDebugger are\n"
        "// compiled here, once (minutes, and about 3 GB of the compiler's memory). docs/packaging.md.\n"
        "#if !defined(TORCHPROBE_COMPILED_LIB)\n"
        "#error \"define TORCHPROBE_COMPILED_LIB for this file and for every file that includes torchprobe.hpp\"\n"
        "#endif\n"
        "#define TORCHPROBE_INCLUDE_IMPLEMENTATION 1\n"
        "#include \"torchprobe.hpp\"\n"
        "\n"
        "TORCHPROBE_COMPILED_DEBUGGERS(TORCHPROBE_DEFINE_COMPILED)\n"
        "TORCHPROBE_DEFINE_COMPILED_PRECISION_DEBUGGER\n"
    )


def unreachable(order: list[Path]) -> list[str]:
    inlined = set(order)
    return sorted(rel(p.resolve()) for p in PROJECT_DIR.rglob("*.hpp") if p.resolve() not in inlined)


def check(text: str, order: list[Path], output: Path) -> int:
    shown = output.relative_to(REPO) if REPO in output.parents else output
    if not output.is_file():
        print(f"{shown} does not exist: run `python3 tools/make_single_include.py`", file=sys.stderr)
        return 1
    current = output.read_text(encoding="utf-8")
    if current == text:
        print(f"{shown} is up to date ({len(order)} headers inlined)")
        return 0
    diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(),
                                     f"{shown} (committed)", f"{shown} (from include/)", lineterm="", n=1))
    added = sum(1 for d in diff if d.startswith("+") and not d.startswith("+++"))
    removed = sum(1 for d in diff if d.startswith("-") and not d.startswith("---"))
    print(f"{shown} is out of date with include/: {removed} line(s) would go, {added} would come.\n"
          f"Run `python3 tools/make_single_include.py` and commit the result. First differences:",
          file=sys.stderr)
    limit = 60
    for d in diff[:limit]:
        print("  " + d, file=sys.stderr)
    if len(diff) > limit:
        print(f"  ... ({len(diff) - limit} more diff lines)", file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare with the existing file instead of writing it")
    p.add_argument("--list", action="store_true", help="print the inlined headers, each after the headers it includes")
    p.add_argument("-o", "--output", type=Path, default=OUTPUT, help="where to write (default: %(default)s)")
    args = p.parse_args(argv)
    output = args.output.resolve()
    try:
        text, order, compiled = generate()
    except GenerationError as e:
        print(f"make_single_include: error: {e}", file=sys.stderr)
        return 2
    if args.list:
        for path in order:
            print(rel(path))
        for name in unreachable(order):
            print(f"(not reachable from the umbrella: {name})")
        return 0
    compiled_output = output.parent / COMPILED_NAME
    if args.check:
        return max(check(text, order, output), check(compiled, order, compiled_output))
    output.parent.mkdir(parents=True, exist_ok=True)
    # newline="\n": the same bytes on every platform.
    for path, content in ((output, text), (compiled_output, compiled)):
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(content)
    shown = output.relative_to(REPO) if REPO in output.parents else output
    print(f"wrote {shown} ({len(order)} headers inlined) and {COMPILED_NAME} beside it")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

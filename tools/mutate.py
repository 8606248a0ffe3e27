#!/usr/bin/env python3
"""Mutation testing: does the suite notice when the code it guards is wrong?

Each mutation in tools/mutations.py plants one small change (a flipped comparison, a dropped +1,
two arguments swapped, an early return, a skipped write, a changed constant) in a copy of
include/, compiles the test files named for it against that copy, and runs them. The mutation is
"killed" when a test fails (or the run times out or crashes), "survived" when every test passes.
Every set of test files is first built and run against the unchanged headers: a set that fails
there makes its mutations "no baseline", never "killed".

    python3 tools/mutate.py [--build build] [--jobs 2] [--only ID,...] [--report FILE]

--build is a configured and built tree of the suite (README's command 2): the compile and link
flags of its two test executables are read from there, so the mutants are built as the suite is,
but header-only (the compiled library holds the unchanged code), at -O0 (quicker to compile; the
tests do not depend on it), each as one translation unit of its test files, as the suite's batches
are (tests/unity_build.cmake). <torch/torch.h>, doctest and nlohmann/json are precompiled once.
Slow (one libtorch compile per mutation, ~1 min): not part of CI; docs/testing.md has the report.
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)


# Test files that call into another translation unit of their own (tests/CMakeLists.txt keeps it out
# of the batches): built beside them.
COMPANIONS = {"torch/msprobe_usage_test.cpp": ["torch/process_debugger_loop.cpp"]}
OPT = "-O0"  # compiles in about half the time of -O1; the runs stay short (the tests are small)


def read_flags(build, target):
    """Compile flags (defines, includes, options) and link arguments of a test executable."""
    d = os.path.join(build, "tests", "CMakeFiles", target + ".dir")
    flags = {}
    with open(os.path.join(d, "flags.make")) as f:
        for line in f:
            m = re.match(r"(CXX_DEFINES|CXX_INCLUDES|CXX_FLAGS) = (.*)", line)
            if m:
                flags[m.group(1)] = shlex.split(m.group(2))
    with open(os.path.join(d, "link.txt")) as f:
        link = shlex.split(f.read())
    # The objects and the compiled library are replaced by the mutant's own translation unit.
    libs = [a for a in link[link.index("-o") + 2:] if not a.endswith(".o") and "torchprobe_compiled" not in a]
    compile_args = []
    for a in flags["CXX_DEFINES"]:
        if a != "-DTORCHPROBE_COMPILED_LIB=1":  # header-only: the mutated headers are the code
            compile_args.append(a)
    for a in flags["CXX_FLAGS"]:
        if a in ("-Werror", "-O3", "-O2"):
            continue
        compile_args.append(a)
    compile_args.append(OPT)
    return compile_args, flags["CXX_INCLUDES"], libs


def precompiled_headers():
    """The headers tests/CMakeLists.txt precompiles for torchprobe_tests: the test files rely on them."""
    text = open(os.path.join(REPO, "tests", "CMakeLists.txt")).read()
    m = re.search(r"target_precompile_headers\(torchprobe_tests PRIVATE(.*?)\)", text, re.S)
    return re.findall(r"<([^>]+)>", m.group(1))


class Builder:
    def __init__(self, build, cache):
        self.build = os.path.abspath(build)
        self.exe = {}
        for kind, target in (("unit", "torchprobe_unit_tests"), ("torch", "torchprobe_tests")):
            args, includes, libs = read_flags(self.build, target)
            self.exe[kind] = dict(args=args, includes=includes, libs=libs)
        self.cxx = "c++"
        # What never sees the mutated headers is built once and kept in `cache` (the build tree's
        # mutate-cache/), keyed by the flags and the sources it is made of.
        self.cache = cache
        common = os.path.join(cache, "common-" + digest(json.dumps(self.exe, sort_keys=True),
                                                         files=[os.path.join(REPO, "tests", "doctest_main.cpp"),
                                                                os.path.join(REPO, "tests", "skip.hpp")]))
        os.makedirs(common, exist_ok=True)
        self.main_obj = {}
        for kind in ("unit", "torch"):
            obj = os.path.join(common, "doctest_main_%s.o" % kind)
            if not os.path.exists(obj):
                self.run([self.cxx, *self.exe[kind]["args"], *self.includes(kind, os.path.join(REPO, "include")),
                          "-c", os.path.join(REPO, "tests", "doctest_main.cpp"), "-o", obj + ".tmp"])
                os.replace(obj + ".tmp", obj)
            self.main_obj[kind] = obj
        # <torch/torch.h> and friends, once (they never see the mutated headers).
        pch_dir = os.path.join(common, "pch")
        os.makedirs(pch_dir, exist_ok=True)
        if not os.path.exists(os.path.join(pch_dir, "mutant_pch.hpp.gch")):
            with open(os.path.join(pch_dir, "mutant_pch.hpp"), "w") as f:
                f.write("#include <torch/torch.h>\n#include <doctest/doctest.h>\n#include <nlohmann/json.hpp>\n")
            self.run([self.cxx, *self.exe["torch"]["args"], *self.exe["torch"]["includes"], "-x", "c++-header",
                      os.path.join(pch_dir, "mutant_pch.hpp"), "-o", os.path.join(pch_dir, "mutant_pch.hpp.tmp.gch")])
            os.replace(os.path.join(pch_dir, "mutant_pch.hpp.tmp.gch"), os.path.join(pch_dir, "mutant_pch.hpp.gch"))
        self.pch_dir = pch_dir
        self.torch_headers = precompiled_headers()

    @staticmethod
    def run(cmd, cwd=None, timeout=None):
        r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError("command failed (%d): %s\n%s" % (r.returncode, " ".join(cmd[:4]), r.stdout[-4000:]))
        return r.stdout

    def includes(self, kind, include_dir):
        out = []
        for a in self.exe[kind]["includes"]:
            out.append("-I" + include_dir if a == "-I" + os.path.join(REPO, "include") else a)
        return out

    def compile(self, kind, groups, include_dir, out_dir):
        """One executable per group of `groups` (lists of paths under tests/), against include_dir.

        A group is one translation unit of its files, as the suite's batches are; files that do not
        go together (two helpers of one name) are compiled as groups of one."""
        os.makedirs(out_dir, exist_ok=True)
        exes = []
        for g, tests in enumerate(groups):
            runner = os.path.join(out_dir, "runner%d.cpp" % g)
            with open(runner, "w") as f:
                if kind == "torch":
                    f.write('#include "mutant_pch.hpp"\n')
                    for h in self.torch_headers:
                        f.write("#include <%s>\n" % h)
                for t in tests:
                    f.write('#include "%s"\n' % os.path.join(REPO, "tests", t))
            obj = os.path.join(out_dir, "runner%d.o" % g)
            exe = os.path.join(out_dir, "runner%d" % g)
            pch = ["-I" + self.pch_dir, "-Winvalid-pch"] if kind == "torch" else []
            extra = ["-idirafter", os.path.join(REPO, "tests", "torch", "gloo_shim")] if kind == "torch" else []
            objs = [obj]
            sources = [(runner, obj)]
            for c, companion in enumerate(sorted({x for t in tests for x in COMPANIONS.get(t, [])})):
                objs.append(os.path.join(out_dir, "companion%d_%d.o" % (g, c)))
                sources.append((os.path.join(REPO, "tests", companion), objs[-1]))
            for src, o in sources:
                self.run([self.cxx, *self.exe[kind]["args"], *pch, *self.includes(kind, include_dir), *extra,
                          "-I" + os.path.join(REPO, "tests", kind), "-c", src, "-o", o])
            self.run([self.cxx, OPT, "-rdynamic", *objs, self.main_obj[kind], "-o", exe, *self.exe[kind]["libs"]])
            exes.append(exe)
        return exes

    def baseline(self, kind, tests):
        """(groups, executables) of `tests` against the unchanged headers, kept in the cache."""
        key = digest(kind, json.dumps(self.exe[kind], sort_keys=True), tests,
                     files=[os.path.join(REPO, "tests", t) for t in tests] + header_files())
        out = os.path.join(self.cache, "base-" + key)
        done = os.path.join(out, "groups.json")
        if os.path.exists(done):
            groups = json.load(open(done))
            return groups, [os.path.join(out, "runner%d" % g) for g in range(len(groups))]
        groups = [list(tests)]
        try:
            exes = self.compile(kind, groups, os.path.join(REPO, "include"), out)
        except RuntimeError:
            if len(tests) == 1:
                raise
            groups = [[t] for t in tests]
            exes = self.compile(kind, groups, os.path.join(REPO, "include"), out)
        with open(done, "w") as f:
            json.dump(groups, f)
        return groups, exes

    def test(self, kind, exes, tc, timeout):
        """(passed?, first failing case or why, doctest's summary) of runs of `exes`."""
        summaries = []
        for exe in exes:
            cmd = [exe, "--test-suite-exclude=needs_*", "--no-version"]
            if tc:
                cmd.append("--test-case=" + tc)
            cwd = os.path.join(self.build, "tests")
            try:
                r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   timeout=timeout, errors="replace")
            except subprocess.TimeoutExpired:
                return False, "timed out after %d s" % timeout, ""
            summary = re.findall(r"\[doctest\] test cases:.*", r.stdout)
            summaries.append(summary[-1] if summary else "")
            if r.returncode != 0:
                failing = re.findall(r"TEST CASE:\s+(.*)", r.stdout)
                why = failing[0].strip() if failing else "exit status %d" % r.returncode
                return False, why, summaries[-1]
        return True, "", " / ".join(summaries)


def header_files():
    return sorted(str(p) for p in pathlib.Path(REPO, "include").rglob("*.hpp"))


def digest(*parts, files=()):
    h = hashlib.sha256()
    for p in parts:
        h.update(repr(p).encode())
    for f in files:
        h.update(f.encode())
        with open(f, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()[:16]


def mutate_tree(work, m, name):
    """A copy of include/ with mutation m applied; the copy's path."""
    root = os.path.join(work, name)
    inc = os.path.join(root, "include")
    if os.path.exists(root):
        shutil.rmtree(root)
    shutil.copytree(os.path.join(REPO, "include"), inc)
    rel = m["file"][len("include/"):]
    path = os.path.join(inc, rel)
    text = open(path).read()
    if text.count(m["find"]) != 1:
        raise RuntimeError("%s: the text to replace occurs %d times in %s" % (m["id"], text.count(m["find"]), m["file"]))
    with open(path, "w") as f:
        f.write(text.replace(m["find"], m["replace"]))
    return inc


def print_table(reports):
    """The report as a Markdown table: one row per mutation, by area, with the case that caught it."""
    from mutations import MUTATIONS
    results = {}
    for path in reports:
        for r in json.load(open(path)):
            results[r["id"]] = r
    rows, killed, scored = [], 0, 0
    for m in MUTATIONS:
        r = results.get(m["id"])
        verdict = r["verdict"] if r else "not run"
        if verdict in ("killed", "survived"):
            scored += 1
            killed += verdict == "killed"
        by = r.get("why", "") if r and verdict == "killed" else ""
        rows.append("| %s | %s | `%s` | %s | %s | %s |" % (
            m["id"], m["area"], m["file"].replace("include/torchprobe/", ""), m["what"].replace("|", "\\|"),
            verdict, by.replace("|", "\\|")))
    print("%d of %d mutations killed (%.1f%%)\n" % (killed, scored, 100.0 * killed / max(1, scored)))
    print("| id | area | file (include/torchprobe/) | the planted bug | verdict | first failing case |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="a configured and built tree of the suite (default: build)")
    ap.add_argument("--jobs", type=int, default=2, help="mutants built at once (default 2)")
    ap.add_argument("--only", default="", help="comma-separated mutation ids (default: all)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds a run may take before it counts as killed")
    ap.add_argument("--report", default="", help="write the results as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--table", metavar="REPORT", help="print the JSON report of earlier runs (several, comma-separated: "
                    "a later one's verdict replaces an earlier one's) as docs/testing.md's Markdown table, and exit")
    args = ap.parse_args()
    if args.table:
        print_table(args.table.split(","))
        return 0

    from mutations import MUTATIONS
    ids = [m["id"] for m in MUTATIONS]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        sys.exit("duplicate mutation ids: %s" % ", ".join(sorted(dup)))
    chosen = [m for m in MUTATIONS if not args.only or m["id"] in args.only.split(",")]
    if args.list:
        for m in chosen:
            print("%-34s %-7s %s: %s" % (m["id"], m["exe"], m["file"], m["what"]))
        return 0
    for m in chosen:  # every mutation applies before anything is built
        text = open(os.path.join(REPO, m["file"])).read()
        if text.count(m["find"]) != 1:
            sys.exit("%s: the text to replace occurs %d times in %s" % (m["id"], text.count(m["find"]), m["file"]))
        for t in m["tests"]:
            if not os.path.isfile(os.path.join(REPO, "tests", t)) or not t.startswith(m["exe"] + "/"):
                sys.exit("%s: test file %s is not a %s test" % (m["id"], t, m["exe"]))

    work = tempfile.mkdtemp(prefix="torchprobe-mutate-")
    t0 = time.time()
    print("mutate: %d mutations, work in %s" % (len(chosen), work), flush=True)
    cache = os.path.join(os.path.abspath(args.build), "mutate-cache")
    builder = Builder(args.build, cache)
    print("mutate: runners and precompiled header ready (%.0f s)" % (time.time() - t0), flush=True)

    # Baselines: each set of test files, against the unchanged headers, must build and pass.
    sets = sorted({(m["exe"], tuple(m["tests"])) for m in chosen})
    baseline = {}

    def build_baseline(key):
        try:
            return key, builder.baseline(key[0], list(key[1]))
        except RuntimeError as e:
            print("baseline %s %s: DOES NOT BUILD: %s" % (key[0], ",".join(key[1]), str(e)[:2000]), flush=True)
            return key, None

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for key, built in pool.map(build_baseline, sets):
            baseline[key] = built
    base_ok = {}
    for m in chosen:
        key = (m["exe"], tuple(m["tests"]), m.get("tc", ""))
        if key in base_ok:
            continue
        built = baseline[key[:2]]
        if built is None:
            base_ok[key] = False
            continue
        ok, why, summary = builder.test(m["exe"], built[1], key[2], args.timeout)
        base_ok[key] = ok
        print("baseline %s %s [%s]: %s %s" % (m["exe"], ",".join(key[1]), key[2] or "*", "passes" if ok else "FAILS: " + why,
                                              summary), flush=True)

    results = []
    lock = threading.Lock()

    def run_one(m):
        t = time.time()
        key = (m["exe"], tuple(m["tests"]), m.get("tc", ""))
        r = dict(id=m["id"], area=m["area"], file=m["file"], what=m["what"], tests=m["tests"], tc=m.get("tc", ""),
                 expect=m.get("expect", ""))
        if not base_ok[key]:
            r.update(verdict="no baseline", why="the unchanged tests fail or do not build")
            return r
        inc = mutate_tree(work, m, "m-" + m["id"])
        try:
            exes = builder.compile(m["exe"], baseline[key[:2]][0], inc, os.path.join(work, "m-" + m["id"], "out"))
        except RuntimeError as e:
            r.update(verdict="does not compile", why=str(e).splitlines()[0])
            return r
        ok, why, summary = builder.test(m["exe"], exes, m.get("tc", ""), args.timeout)
        r.update(verdict="survived" if ok else "killed", why=why, summary=summary, seconds=round(time.time() - t))
        if not args.keep:
            shutil.rmtree(os.path.join(work, "m-" + m["id"]), ignore_errors=True)
        return r

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for r in pool.map(run_one, chosen):
            with lock:
                results.append(r)
                if args.report:  # as it goes: a long run that stops keeps what it found
                    with open(args.report, "w") as f:
                        json.dump(results, f, indent=1)
            print("%-9s %-34s %s%s" % (r["verdict"], r["id"], r.get("why", ""),
                                       " (%d s)" % r["seconds"] if "seconds" in r else ""), flush=True)
    scored = [r for r in results if r["verdict"] in ("killed", "survived")]
    killed = sum(r["verdict"] == "killed" for r in scored)
    print("mutate: %d of %d mutations killed (%.1f%%); %d not scored; %.0f s" %
          (killed, len(scored), 100.0 * killed / max(1, len(scored)), len(results) - len(scored), time.time() - t0))
    for r in results:
        if r["verdict"] != "killed":
            print("  %s %s: %s (%s)" % (r["verdict"], r["id"], r["what"], r["file"]))
    if args.report:
        with open(args.report, "w") as f:
            json.dump(results, f, indent=1)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if killed == len(scored) else 1


if __name__ == "__main__":
    sys.exit(main())

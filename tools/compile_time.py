#!/usr/bin/env python3
"""What TorchProbe adds to the compile of a user's file (issue 43), measured side by side.

Compiles, with the flags CMake gives the examples (a configured build directory's
examples/CMakeFiles/quick_start.dir/flags.make: the Release flags of a target that links
torchprobe::torchprobe), four small training files that differ only in what they include:

  plain      <torch/torch.h> and a tiny training step (the baseline)
  include    the same + <torchprobe/torchprobe.hpp>, nothing of it used (what parsing the header costs)
  debugger   the same + <torchprobe/torchprobe.hpp>, one Debugger<Mix, Statistics> and a ScopedDump
  precision  the same + one PrecisionDebugger (config-driven: every task and level)
  single     the debugger file with the single header (single_include/), compiled library only

and the last three again with the compiled library (-DTORCHPROBE_COMPILED_LIB=1, as the CMake
target torchprobe::compiled sets it: the debuggers are compiled once, in the library),
each --runs times, interleaved, and prints the median wall time and peak memory of the compiler
(GNU time's %e and %M), and each against the baseline with the issue's goals (<= 10 s and
<= 300 MB for the Debugger, <= 20 s for the PrecisionDebugger). It prints figures and exits 0 (a
benchmark, not a test); 2 when the build directory is not a configured one.

--library also compiles the library's own sources (src/*.cpp), and the single header's
(single_include/torchprobe_compiled.cpp), once: what a project pays once per build of the library,
not per file.

--only picks variants (CI measures plain, debugger+lib and precision+lib once: .ci/run).

Usage: python3 tools/compile_time.py BUILD_DIR [--runs N] [--library] [--only A,B]
"""
import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile

SOURCES = {
    "plain": "",
    "include": """
#include <torchprobe/torchprobe.hpp>
""",
    "debugger": """
#include <torchprobe/torchprobe.hpp>
namespace tp = torchprobe;
""",
    "precision": """
#include <torchprobe/torchprobe.hpp>
namespace tp = torchprobe;
""",
    "single": """
#include "torchprobe.hpp"
namespace tp = torchprobe;
""",
}

BODY = {
    "include": """
  for (int step = 0; step < 2; ++step) {
    auto loss = model->forward(torch::randn({2, 8})).sum();
    loss.backward();
  }
""",
    "plain": """
  for (int step = 0; step < 2; ++step) {
    auto loss = model->forward(torch::randn({2, 8})).sum();
    loss.backward();
  }
""",
    "debugger": """
  tp::Debugger<tp::Level::Mix, tp::Task::Statistics> dbg(tp::Options().dump_path(argc > 1 ? argv[1] : "./dump"));
  for (int step = 0; step < 2; ++step) {
    {
      tp::ScopedDump scope(dbg, model);
      auto loss = model->forward(torch::randn({2, 8})).sum();
      loss.backward();
    }
    dbg.step();
  }
""",
    "precision": """
  tp::PrecisionDebugger dbg(argc > 1 ? argv[1] : "config.json");
  for (int step = 0; step < 2; ++step) {
    {
      tp::ScopedDump scope(dbg, model);
      auto loss = model->forward(torch::randn({2, 8})).sum();
      loss.backward();
    }
    dbg.step();
  }
""",
}

BODY["single"] = BODY["debugger"]

TEMPLATE = """#include <torch/torch.h>
{include}
struct NetImpl : torch::nn::Module {{
  NetImpl() : fc(register_module("fc", torch::nn::Linear(8, 4))) {{}}
  torch::Tensor forward(const torch::Tensor& x) {{ return torch::relu(fc(x)); }}
  torch::nn::Linear fc;
}};
TORCH_MODULE(Net);

int main(int argc, char** argv) {{
  (void)argc;
  (void)argv;
  Net model;
{body}
  return 0;
}}
"""


def flags_of(build_dir):
    flags_make = os.path.join(build_dir, "examples", "CMakeFiles", "quick_start.dir", "flags.make")
    cache = os.path.join(build_dir, "CMakeCache.txt")
    if not (os.path.isfile(flags_make) and os.path.isfile(cache)):
        sys.exit(f"{build_dir}: not a configured TorchProbe build with examples ({flags_make} missing)")
    values = {}
    with open(flags_make) as f:
        for line in f:
            m = re.match(r"(CXX_DEFINES|CXX_INCLUDES|CXX_FLAGS) = (.*)", line)
            if m:
                values[m.group(1)] = m.group(2)
    compiler = "c++"
    with open(cache) as f:
        for line in f:
            if line.startswith("CMAKE_CXX_COMPILER:"):
                compiler = line.split("=", 1)[1].strip()
    args = []
    for key in ("CXX_DEFINES", "CXX_INCLUDES", "CXX_FLAGS"):
        args += shlex.split(values.get(key, ""))
    return compiler, args


COMPILED = ["include", "debugger", "precision"]  # the variants measured again with the library
LIBRARY_DEFINE = "-DTORCHPROBE_COMPILED_LIB=1"
LIBRARY_SOURCE_DEFINE = "-DTORCHPROBE_INCLUDE_IMPLEMENTATION=1"  # what the library's own sources get
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
SINGLE_INCLUDE = "-I" + os.path.join(REPO, "single_include")


def compile_once(compiler, args, source):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "time.txt")
        cmd = ["/usr/bin/time", "-f", "%e %M", "-o", out, compiler] + args + ["-c", source, "-o", os.devnull]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            raise SystemExit(f"compiling {source} failed")
        seconds, kb = open(out).read().split()[-2:]
        return float(seconds), int(kb) / 1024.0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build_dir")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--library", action="store_true", help="also compile the library's sources once")
    p.add_argument("--only", help="comma-separated variants (plain is always measured), e.g. debugger+lib")
    a = p.parse_args()
    compiler, args = flags_of(a.build_dir)
    variants = [(name, name, args) for name in SOURCES if name != "single"] + [
        (name + "+lib", name, args + [LIBRARY_DEFINE]) for name in COMPILED
    ] + [("single+lib", "single", [SINGLE_INCLUDE] + args + [LIBRARY_DEFINE])]
    if a.only:
        wanted = set(a.only.split(",")) | {"plain"}
        unknown = wanted - {label for label, _, _ in variants}
        if unknown:
            sys.exit(f"--only: no variant {', '.join(sorted(unknown))}; the variants: "
                     + ", ".join(label for label, _, _ in variants))
        variants = [v for v in variants if v[0] in wanted]
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name in SOURCES:
            files[name] = os.path.join(tmp, f"{name}.cpp")
            with open(files[name], "w") as f:
                f.write(TEMPLATE.format(include=SOURCES[name], body=BODY[name]))
        runs = {label: [] for label, _, _ in variants}
        for r in range(a.runs):  # interleaved: the machine's drift falls on all alike
            for label, name, flags in variants:
                runs[label].append(compile_once(compiler, flags, files[name]))
                print(f"  run {r + 1} {label:13s} {runs[label][-1][0]:6.1f} s {runs[label][-1][1]:7.0f} MB", flush=True)
        library = []
        if a.library:
            src = os.path.join(REPO, "src")
            lib_args = args + [LIBRARY_DEFINE, LIBRARY_SOURCE_DEFINE]
            for cpp in sorted(f for f in os.listdir(src) if f.endswith(".cpp")):
                library.append((cpp, compile_once(compiler, lib_args, os.path.join(src, cpp))))
                print(f"  library {cpp:26s} {library[-1][1][0]:6.1f} s {library[-1][1][1]:7.0f} MB", flush=True)
            single = compile_once(compiler, [SINGLE_INCLUDE] + args + [LIBRARY_DEFINE],
                                  os.path.join(REPO, "single_include", "torchprobe_compiled.cpp"))
            print(f"  single_include/torchprobe_compiled.cpp {single[0]:6.1f} s {single[1]:7.0f} MB", flush=True)
    med = {n: (statistics.median(t for t, _ in v), statistics.median(m for _, m in v)) for n, v in runs.items()}
    base_s, base_mb = med["plain"]
    print(f"\ncompile time of one user file ({compiler}, examples' flags), median of {a.runs}:")
    print(f"  {'file':13s} {'seconds':>8s} {'peak MB':>8s} {'+ seconds':>10s} {'+ MB':>8s}  spread (s)  goal")
    goals = {
        "include": "(the header alone)",
        "debugger": "(header-only: no bound)",
        "precision": "(header-only: no bound)",
        "debugger+lib": "<= +10 s, <= +300 MB",
        "precision+lib": "<= +20 s",
        "single+lib": "<= +10 s, <= +300 MB",
    }
    for label in runs:
        s, mb = med[label]
        times = [t for t, _ in runs[label]]
        spread = f"{min(times):5.1f}-{max(times):5.1f}"
        extra = "" if label == "plain" else f"{s - base_s:+10.1f} {mb - base_mb:+8.0f}"
        met = ""
        if label in ("debugger+lib", "single+lib"):
            met = "met" if s - base_s <= 10 and mb - base_mb <= 300 else "not met"
        elif label == "precision+lib":
            met = "met" if s - base_s <= 20 else "not met"
        print(f"  {label:13s} {s:8.1f} {mb:8.0f} {extra:>19s}  {spread}  {goals.get(label, '')} {met}")
    if library:
        total = sum(t for _, (t, _) in library)
        peak = max(m for _, (_, m) in library)
        print(f"  the library, once per build: {total:.1f} s of compile in {len(library)} files, peak {peak:.0f} MB;"
              f" the single header's, one file: {single[0]:.1f} s, peak {single[1]:.0f} MB")


if __name__ == "__main__":
    main()

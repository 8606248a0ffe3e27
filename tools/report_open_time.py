#!/usr/bin/env python3
"""How long headless Chromium takes to open a compare report.html (issue 41, item 6): a development
script, not run by CI.

    python3 tools/report_open_time.py OUT/report.html [--browser chromium] [--runs 3]

Each run starts a fresh headless Chromium that loads the page, runs its script and prints the DOM
(--dump-dom); the time is that whole process, start to exit, so it includes Chromium's own start
(printed apart, from an empty page). It fails when the page's script did not reach its end (no
data-ready="1" on <body>) or wrote to the console. Prints the file's size, each run's seconds and
the median, and how many table rows the DOM holds (a virtualised table draws only those in view).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


def open_page(browser, url, profile):
    t = time.perf_counter()
    p = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                        f"--user-data-dir={profile}", "--dump-dom", url], capture_output=True, text=True, timeout=300)
    return time.perf_counter() - t, p


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report")
    ap.add_argument("--browser", default="chromium")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    path = os.path.abspath(a.report)
    with tempfile.TemporaryDirectory() as profile:
        empty = os.path.join(profile, "empty.html")
        with open(empty, "w") as f:
            f.write("<!DOCTYPE html><html><body></body></html>\n")
        start, _ = open_page(a.browser, "file://" + empty, os.path.join(profile, "p0"))
        times = []
        for k in range(a.runs):
            s, p = open_page(a.browser, "file://" + path, os.path.join(profile, f"p{k + 1}"))
            if p.returncode != 0:
                sys.exit(f"{a.browser} exited with {p.returncode}:\n{p.stderr[-2000:]}")
            console = re.findall(r"[^\n]*:CONSOLE[^\n]*", p.stderr)
            if console:
                sys.exit("the page wrote to the console:\n" + "\n".join(console))
            if 'data-ready="1"' not in p.stdout:
                sys.exit("the page's script did not reach its end (no data-ready on <body>)")
            times.append(s)
            rows = p.stdout.count("<tr")
    print(f"{path}: {os.path.getsize(path) / 1e6:.1f} MB; opened in {a.browser} (headless, --dump-dom) in "
          + ", ".join(f"{t:.2f}" for t in times) + f" s, median {statistics.median(times):.2f} s "
          f"(Chromium's start alone, on an empty page: {start:.2f} s); {rows} <tr> in the DOM")


if __name__ == "__main__":
    main()

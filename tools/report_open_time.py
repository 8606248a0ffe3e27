#!/usr/bin/env python3
"""How long headless Chromium takes to open a compare report.html (issue 41, item 6): a development
script, not run by CI.

    python3 tools/report_open_time.py OUT/report.html [--browser chromium] [--runs 3]

Each run starts a fresh headless Chromium that loads the page, runs its script and takes a screenshot
of the result (--screenshot, 1200x3000); the time is that whole process, start to exit, so it
includes Chromium's own start (measured apart, on an empty page, and printed). One more run with
--dump-dom checks the page: its script reached its end (data-ready="1" on <body>) without writing to
the console, and, for a virtualised table, how many milliseconds after the start of navigation it was
drawn (data-ready-ms) and how many <tr> the DOM holds. (--dump-dom itself is not timed: it prints
the whole DOM, the table's data included, which takes longer than opening the page.)
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


def chromium(browser, profile, *args):
    t = time.perf_counter()
    p = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                        f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit(f"{browser} exited with {p.returncode}:\n{p.stderr[-2000:]}")
    return time.perf_counter() - t, p


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report")
    ap.add_argument("--browser", default="chromium")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    url = "file://" + os.path.abspath(a.report)
    with tempfile.TemporaryDirectory() as tmp:
        empty = os.path.join(tmp, "empty.html")
        with open(empty, "w") as f:
            f.write("<!DOCTYPE html><html><body></body></html>\n")
        shot = os.path.join(tmp, "shot.png")
        start, _ = chromium(a.browser, os.path.join(tmp, "p0"), f"--screenshot={shot}", "--window-size=1200,3000",
                            "file://" + empty)
        times = []
        for k in range(a.runs):
            s, _ = chromium(a.browser, os.path.join(tmp, f"p{k + 1}"), f"--screenshot={shot}",
                            "--window-size=1200,3000", url)
            times.append(s)
        _, p = chromium(a.browser, os.path.join(tmp, "dom"), "--dump-dom", url)
    console = re.findall(r"[^\n]*:CONSOLE[^\n]*", p.stderr)
    if console:
        sys.exit("the page wrote to the console:\n" + "\n".join(console))
    if 'data-ready="1"' not in p.stdout:
        sys.exit("the page's script did not reach its end (no data-ready on <body>)")
    ready = re.search(r'data-ready-ms="(\d+)"', p.stdout)
    print(f"{a.report}: {os.path.getsize(a.report) / 1e6:.1f} MB; opened and drawn by {a.browser} (headless, "
          f"--screenshot) in " + ", ".join(f"{t:.2f}" for t in times) + f" s, median {statistics.median(times):.2f} s"
          f" (Chromium's start alone, on an empty page: {start:.2f} s); "
          + (f"table drawn {int(ready.group(1)) / 1000:.2f} s after navigation start; " if ready else "")
          + f"{p.stdout.count('<tr')} <tr> in the DOM")


if __name__ == "__main__":
    main()

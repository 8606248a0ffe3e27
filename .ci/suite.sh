#!/usr/bin/env bash
# Configure, build and test the suite, one step per line (README's command 2, plus CMake args):
#
#   bash .ci/suite.sh NAME BUILD_DIR [CMAKE_ARGS...]
#
# .ci/run calls it for the host and the sanitizer builds, .ci/debian13.sh inside its chroot. The
# tests run with ctest -V into BUILD_DIR/ctest.log, so that every test's output is kept (two at a
# time, each line prefixed by its test's number); this
# prints the result line of each test, the "SKIPPED:" lines (tests/skip.hpp) with their count, and
# the whole log when a test fails. TORCHPROBE_CI_JOBS: parallel build jobs and tests (2).
# A skipped CTest test (tests/skip.hpp: NAME.needs_X, reported skipped) fails the run unless its
# name matches TORCHPROBE_CI_ALLOWED_SKIPS (an extended regex; default: the CUDA tests only, since CI
# installs everything else the tests need and runs as root).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 NAME BUILD_DIR [CMAKE_ARGS...]" >&2; exit 2; }
name=$1
dir=$2
shift 2
jobs=${TORCHPROBE_CI_JOBS:-2}
t0=$(date +%s)
log() { printf '[%s %4ss] %s\n' "$name" "$(($(date +%s) - t0))" "$*"; }

log "configure: cmake -S . -B $dir -DTORCHPROBE_BUILD_TESTS=ON -DTORCHPROBE_WERROR=ON $*"
cmake -S . -B "$dir" -DTORCHPROBE_BUILD_TESTS=ON -DTORCHPROBE_WERROR=ON "$@"
log "build: cmake --build $dir -j$jobs"
cmake --build "$dir" -j"$jobs"
log "test: ctest --test-dir $dir -j$jobs -V > $dir/ctest.log"
rc=0
ctest --test-dir "$dir" -j"$jobs" -V >"$dir/ctest.log" 2>&1 || rc=$?
grep -E '^ *[0-9]+/[0-9]+ Test +#|tests passed|tests failed' "$dir/ctest.log" || true
if [ "$rc" -ne 0 ]; then
  cat "$dir/ctest.log"
  log "ctest failed (exit status $rc)"
  exit "$rc"
fi
# ctest -V prefixes each line of a test's output with its number ("3: ").
skipped=$(grep -c 'SKIPPED:' "$dir/ctest.log" || true)
log "$skipped test cases skipped:"
grep 'SKIPPED:' "$dir/ctest.log" | sed -e 's/^[0-9]*: */  /' || true
# What skipped, as needs_X names: CTest's own list at the end of its log ("  12 - torch.needs_cuda
# (Skipped)"), and the runner's list of the cases that skipped in a test that still passed
# ("[torchprobe]   needs_root: case: reason", doctest_main.cpp).
allowed=${TORCHPROBE_CI_ALLOWED_SKIPS:-needs_cuda}
unexpected=$({
  sed -n 's/^[[:space:]]*[0-9]\+ - \(.*\) (Skipped)$/\1/p' "$dir/ctest.log" | sed 's/.*[.]//'
  sed -n 's/^[0-9]*: *\[torchprobe\]   \(needs_[a-z0-9_]*\): .*/\1/p' "$dir/ctest.log"
} | sort -u | grep -Evx "$allowed" || true)
if [ -n "$unexpected" ]; then
  log "FAILED: skipped here, but CI installs what they need (allowed to skip: $allowed):"
  printf '  %s\n' $unexpected
  grep 'SKIPPED:' "$dir/ctest.log" | sed -e 's/^[0-9]*: */  /' || true
  exit 1
fi
log "passed"

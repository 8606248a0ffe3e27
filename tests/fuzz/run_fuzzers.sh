#!/usr/bin/env bash
# Runs the libFuzzer targets (tests/fuzz) with ASan + UBSan: each from the committed corpus, for
# SECONDS each (or 10 million executions, whichever comes first), JOBS at a time, and prints a line
# per target from libFuzzer's final statistics. Findings land in BUILD/fuzz-findings/ and end the
# script with status 1.
#   tests/fuzz/run_fuzzers.sh BUILD SECONDS [JOBS [TARGET ...]]
# BUILD: a build directory configured with clang and -DTORCHPROBE_BUILD_FUZZERS=ON (built here).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: run_fuzzers.sh BUILD SECONDS [JOBS [TARGET ...]]}
seconds=${2:?usage: run_fuzzers.sh BUILD SECONDS [JOBS [TARGET ...]]}
jobs=${3:-2}
shift $(($# < 3 ? $# : 3))
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for d in tests/fuzz/corpus/*/; do targets+=("$(basename "$d")"); done
fi
# TORCHPROBE_FUZZ_NO_BUILD=1: use the binary as it is (several scripts running at once must not
# rebuild it under each other).
[ -n "${TORCHPROBE_FUZZ_NO_BUILD:-}" ] || cmake --build "$build" --target torchprobe_fuzz -j2 >/dev/null
fuzz=$build/tests/fuzz/torchprobe_fuzz
out=$build/fuzz-findings
mkdir -p "$out"
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$PWD/tests/sanitizers/ubsan.supp"
run_one() {
  local t=$1 work=$build/fuzz-corpus/$1
  mkdir -p "$work"
  # The committed corpus is read, never written: new inputs go to the work folder.
  TORCHPROBE_FUZZ_TARGET=$t "$fuzz" "$work" "tests/fuzz/corpus/$t" -dict=tests/fuzz/msprobe.dict \
    -max_total_time="$seconds" -runs=10000000 -timeout=5 -rss_limit_mb=2048 -malloc_limit_mb=100 \
    -print_final_stats=1 -artifact_prefix="$out/$t-" >"$out/$t.log" 2>&1 || true
  local execs time cov
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$t.log" | tail -1 || true)
  time=$(grep -oE '^Done [0-9]+ runs in [0-9]+ second' "$out/$t.log" | grep -oE '[0-9]+ second' | grep -oE '[0-9]+' || true)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9a-zA-Z]+' "$out/$t.log" | tail -1 || true)
  printf '%-14s executions %-10s seconds %-6s %s findings %s\n' "$t" "${execs:-?}" "${time:-?}" "$cov" \
    "$(ls "$out" | grep -c "^$t-" || true)"
}
pids=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || true
    pids=("${pids[@]:1}")
  fi
done
wait || true
if ls "$out" | grep -qE -- '-(crash|leak|timeout|oom|slow-unit)-'; then
  echo "fuzzing found inputs that fail (in $out):"
  ls "$out" | grep -E -- '-(crash|leak|timeout|oom|slow-unit)-'
  exit 1
fi

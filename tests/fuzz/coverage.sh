#!/usr/bin/env bash
# Line coverage of each reader by its fuzz target's corpus: builds torchprobe_fuzz with
# -fprofile-instr-generate in BUILD (clang), replays CORPUS/TARGET (default: the committed corpus)
# and prints llvm-cov's line coverage of the files the target reads with.
#   tests/fuzz/coverage.sh BUILD [CORPUS]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: coverage.sh BUILD [CORPUS]}
corpus=${2:-tests/fuzz/corpus}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=None \
    "-DCMAKE_CXX_FLAGS=-O1" -DTORCHPROBE_BUILD_TESTS=OFF -DTORCHPROBE_BUILD_EXAMPLES=OFF -DTORCHPROBE_BUILD_CLI=OFF \
    -DTORCHPROBE_BUILD_FUZZERS=ON -DTORCHPROBE_FUZZ_COVERAGE=ON >/dev/null
fi
cmake --build "$build" --target torchprobe_fuzz -j2 >/dev/null
fuzz=$build/tests/fuzz/torchprobe_fuzz
inc=include/torchprobe
# The files that make up each target's reader (what its coverage is of).
declare -A files=(
  [config]="$inc/config/parser.hpp $inc/config/readers.hpp $inc/config/free_benchmark.hpp $inc/config/grad_probe.hpp $inc/config/run_ut.hpp $inc/config/name_filter.hpp"
  [dump_json]="$inc/analysis/compare/json_reader.hpp $inc/analysis/compare/json_pieces.hpp $inc/analysis/compare/dump_reader.hpp $inc/analysis/compare/dump_rows_reader.hpp $inc/analysis/compare/rows.hpp"
  [ranks]="$inc/analysis/compare/ranks.hpp"
  [journal]="$inc/io/journal_reader.hpp $inc/io/json_spans.hpp $inc/io/recovery.hpp"
  [npy]="$inc/io/npy.hpp"
  [grad_csv]="$inc/analysis/compare/grad_compare.hpp $inc/io/grad_run_manifest.hpp"
  [compare_map]="$inc/analysis/compare/user_map.hpp"
  [pt]="$inc/io/pt_archive.hpp $inc/io/pickle_scan.hpp $inc/io/pt_reader.hpp"
  [run_ut_inputs]="$inc/analysis/run_ut/api_case.hpp $inc/analysis/run_ut/inputs.hpp"
)
for t in $(ls "$corpus"); do
  rm -f "$build/$t.profraw"
  LLVM_PROFILE_FILE="$build/$t.profraw" TORCHPROBE_FUZZ_TARGET=$t ASAN_OPTIONS=detect_leaks=0 \
    "$fuzz" -runs=0 "$corpus/$t" >"$build/$t.coverage.log" 2>&1
  llvm-profdata merge -sparse "$build/$t.profraw" -o "$build/$t.profdata"
  # shellcheck disable=SC2086
  total=$(llvm-cov report "$fuzz" -instr-profile="$build/$t.profdata" ${files[$t]} | tail -1)
  read -r -a f <<<"$total"
  # TOTAL regions missed cover functions missed executed lines missed cover ...
  printf '%-14s inputs %6d  lines %6s of %6s covered (%s)\n' "$t" "$(ls "$corpus/$t" | wc -l)" \
    "$((f[7] - f[8]))" "${f[7]}" "${f[9]}"
done

#!/usr/bin/env bash
# Packaging checks (issue 7). .ci/run calls this after the host test suite; it also runs alone on
# any machine with the project's packages installed (no root needed):  bash .ci/packaging.sh
#
#  1. single_include/torchprobe.hpp is exactly what tools/make_single_include.py makes of include/.
#  2. CHANGELOG.md has a section for the version in include/torchprobe/version.hpp (CMake's
#     configure step already fails when that header and project(VERSION) disagree).
#  3. install: TorchProbe is configured without tests/examples and installed into a temporary
#     prefix; a copy of tests/consumer, outside the repository, finds it with find_package and builds.
#  4. add_subdirectory: the same consumer adds the repository after find_package(Torch); its
#     CMakeLists fails if that defined any test/example target or turned the install rules on.
# Each consumer must have got NDEBUG, -fopenmp and -rdynamic from the target; its program then dumps
# a Linear + relu step, checked by tests/packaging/check_dump.py (dump.json has the relu entry and
# stack.json names the consumer's own function). TORCHPROBE_PACKAGING_KEEP=1 keeps the work folder.
# Cost: the tool (two libtorch TUs, one per core), then the two consumers in parallel (the package one
# builds torchprobe::compiled: four libtorch TUs more); the rest takes seconds.
# The single-header test and the examples run in the README's ctest command, not here.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd -P)
python=${PYTHON:-python3}   # the checks need only the standard library, not torch
t0=$(date +%s)
log() { printf '[packaging %3ss] %s\n' "$(($(date +%s) - t0))" "$*"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/torchprobe-packaging.XXXXXX")
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  if [ "${TORCHPROBE_PACKAGING_KEEP:-0}" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

echo "== packaging checks (single header, install + find_package, add_subdirectory)"
log "1. single header is in sync with include/"
"$python" tools/make_single_include.py --check

log "2. CHANGELOG.md has a section for the version"
version=$(sed -n 's/^#define TORCHPROBE_VERSION_STRING "\(.*\)"/\1/p' include/torchprobe/version.hpp)
grep -q "^## \[${version//./\\.}\]" CHANGELOG.md || { echo "CHANGELOG.md has no '## [$version]' section" >&2; exit 1; }

log "3. install into a temporary prefix"
prefix=$work/prefix
# TORCHPROBE_PACKAGING_BUILD_DIR: a build directory already built (CI's host build), installed from
# instead of building the tool again; the option that installs the single header changes only the
# install rules, so configuring it there compiles nothing.
build=${TORCHPROBE_PACKAGING_BUILD_DIR:-$work/torchprobe-build}
if [ -n "${TORCHPROBE_PACKAGING_BUILD_DIR:-}" ]; then
  cmake -S . -B "$build" -DTORCHPROBE_INSTALL_SINGLE_HEADER=ON >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
else
  cmake -S . -B "$build" -DTORCHPROBE_BUILD_TESTS=OFF -DTORCHPROBE_BUILD_EXAMPLES=OFF -DTORCHPROBE_INSTALL_SINGLE_HEADER=ON \
    >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
fi
# The one compiled thing installed is the torchprobe command-line tool: its own TU (no libtorch) and
# the libtorch module it loads for run_ut and .pt files, one per core.
cmake --build "$build" --target torchprobe_cli -j"${TORCHPROBE_CI_JOBS:-2}" >>"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
cmake --install "$build" --prefix "$prefix" >>"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
for f in include/torchprobe/torchprobe.hpp include/torchprobe/version.hpp \
         share/cmake/TorchProbe/TorchProbeConfig.cmake share/cmake/TorchProbe/TorchProbeConfigVersion.cmake \
         share/cmake/TorchProbe/TorchProbeTargets.cmake share/torchprobe/single_include/torchprobe.hpp share/torchprobe/single_include/torchprobe_compiled.cpp bin/torchprobe; do
  [ -f "$prefix/$f" ] || { echo "not installed: $f" >&2; find "$prefix" -type f >&2; exit 1; }
done
"$prefix/bin/torchprobe" --version | grep -qx "torchprobe $version" || { echo "bin/torchprobe --version is not $version" >&2; exit 1; }
# run_ut's libtorch part is a module the tool loads from lib/torchprobe/ (tools/cli/torch_module.hpp)
[ -f "$prefix/lib/torchprobe/libtorchprobe_torch.so" ] || [ -n "$(find "$prefix" -name libtorchprobe_torch.so)" ] \
  || { echo "not installed: the tool's libtorch module" >&2; exit 1; }
"$prefix/bin/torchprobe" run_ut --help | grep -q "api_info" || { echo "bin/torchprobe run_ut cannot load its module" >&2; exit 1; }
echo "installed $(find "$prefix" -type f | wc -l) files into $prefix"

# The consumer is built from a copy outside the repository, so nothing can reach the source tree
# by a relative path.
cp -r tests/consumer "$work/consumer-src"
# configure_consumer MODE ARGS...: configures $work/consumer-MODE, showing the consumer's own
# status lines, or everything when it fails.
configure_consumer() {
  local mode=$1
  shift
  if cmake -S "$work/consumer-src" -B "$work/consumer-$mode" -DTORCHPROBE_CONSUMER_MODE="$mode" "$@" \
       >"$work/configure-$mode.log" 2>&1; then
    grep -E '^-- TorchProbe' "$work/configure-$mode.log" || true
  else
    cat "$work/configure-$mode.log" >&2
    echo "configuring the consumer in $mode mode failed" >&2
    exit 1
  fi
}
log "3. configure the consumer with find_package(TorchProbe)"
configure_consumer package -DCMAKE_PREFIX_PATH="$prefix"
log "4. configure the consumer with add_subdirectory(<repo>)"
configure_consumer subdirectory -DTORCHPROBE_SOURCE_DIR="$repo"

log "3+4. build both consumers in parallel (package: the compiled library's four TUs, then one; subdirectory: one)"
for mode in package subdirectory; do
  cmake --build "$work/consumer-$mode" --parallel 2 >"$work/build-$mode.log" 2>&1 &
  pids+=($!)
done
failed=0
for i in 0 1; do
  mode=$([ "$i" = 0 ] && echo package || echo subdirectory)
  if ! wait "${pids[$i]}"; then
    echo "building the $mode consumer failed:" >&2
    tail -n 40 "$work/build-$mode.log" >&2
    failed=1
  fi
done
pids=()
[ "$failed" = 0 ] || exit 1

for mode in package subdirectory; do
  log "the $mode consumer got the target's flags, and its dump is right"
  # What torchprobe::torchprobe promises to carry to its users (docs/packaging.md).
  dir=$work/consumer-$mode/CMakeFiles/consumer.dir
  for flag in -DNDEBUG -fopenmp; do
    grep -q -- "$flag" "$dir/flags.make" || { echo "$mode consumer: $flag missing from its compile flags" >&2; exit 1; }
  done
  grep -q -- -rdynamic "$dir/link.txt" || { echo "$mode consumer: -rdynamic missing from its link line" >&2; exit 1; }
  "$python" tests/packaging/check_dump.py "$work/dump-$mode" --entry Aten.relu.0.forward \
    --stack-frame ConsumerNetImpl::forward -- "$work/consumer-$mode/consumer" "$work/dump-$mode"
done
# The package consumer used the compiled library: it compiled no debugger of its own (the
# instantiation declarations of torchprobe/compiled.hpp), so its object file defines none.
grep -q -- -DTORCHPROBE_COMPILED_LIB "$work/consumer-package/CMakeFiles/consumer.dir/flags.make" ||
  { echo "package consumer: -DTORCHPROBE_COMPILED_LIB missing from its compile flags" >&2; exit 1; }
if nm -C --defined-only "$work/consumer-package/CMakeFiles/consumer.dir/main.cpp.o" | grep -q 'DebuggerImpl<'; then
  echo "package consumer: main.cpp.o defines a DebuggerImpl; the compiled library should" >&2
  exit 1
fi
log "packaging checks passed"

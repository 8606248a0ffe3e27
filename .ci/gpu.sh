#!/usr/bin/env bash
# The checks that need a GPU, on a machine with CUDA and a pip torch (torch 2.x + CUDA, whose
# python package holds libtorch's headers and CMake files). CI never has a GPU: there the same
# tests are built into torchprobe_tests and each says SKIPPED.
#
#   bash .ci/gpu.sh --prepare   on a Debian machine with the project's packages: copies the
#                               header-only dependencies (nlohmann_json, xsimd, doctest) and zlib
#                               into .gpu-deps/ (git-ignored), for a GPU machine that has no
#                               package registry; ~10 MB
#   bash .ci/gpu.sh             on the GPU machine, in the repository root: configures against the
#                               python's torch and .gpu-deps/, builds the CUDA tests and the CUDA
#                               benchmark (one TU each), runs both; ends with one line per check
#   bash .ci/gpu.sh --cpu       the same build against Debian's CPU libtorch (CI does this: the CUDA
#                               code paths must compile where no GPU is); the tests then say SKIPPED
#
# Environment: TORCHPROBE_GPU_JOBS (default: every core), TORCHPROBE_GPU_BUILD_DIR (build-gpu),
# PYTHON (python3 that imports torch; default: python3 on PATH), TORCHPROBE_GPU_TORCH_PREFIX (where
# Torch's CMake files are; default: the python's torch.utils.cmake_prefix_path).
set -euo pipefail
cd "$(dirname "$0")/.."
deps=$PWD/.gpu-deps

if [ "${1:-}" = "--prepare" ]; then
  rm -rf "$deps"
  mkdir -p "$deps/include" "$deps/lib"
  cp -r /usr/include/nlohmann /usr/include/xsimd /usr/include/doctest "$deps/include/"
  cp /usr/include/zlib.h /usr/include/zconf.h "$deps/include/"
  cp /usr/lib/x86_64-linux-gnu/libz.a "$deps/lib/"
  # Debian's CMake files name /usr; these name the copies, wherever the folder lands.
  xsimd_version=$(sed -n 's/^#define XSIMD_VERSION_MAJOR \([0-9]*\)/\1/p' /usr/include/xsimd/config/xsimd_config.hpp)
  # name, target, version
  for pkg in "nlohmann_json nlohmann_json::nlohmann_json 3.11" "xsimd xsimd $xsimd_version" "doctest doctest::doctest 2.4"; do
    read -r name target version <<<"$pkg"
    mkdir -p "$deps/lib/cmake/$name"
    cat >"$deps/lib/cmake/$name/${name}Config.cmake" <<EOF
if(NOT TARGET $target)
  add_library($target INTERFACE IMPORTED)
  set_target_properties($target PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "\${CMAKE_CURRENT_LIST_DIR}/../../../include")
endif()
EOF
    cat >"$deps/lib/cmake/$name/${name}ConfigVersion.cmake" <<EOF
set(PACKAGE_VERSION "$version")
set(PACKAGE_VERSION_COMPATIBLE TRUE)
EOF
  done
  du -sh "$deps"
  exit 0
fi

cpu_only=0
if [ "${1:-}" = "--cpu" ]; then
  cpu_only=1
  export TORCHPROBE_GPU_TORCH_PREFIX=${TORCHPROBE_GPU_TORCH_PREFIX:-/usr}
fi
[ -d "$deps" ] || { echo "gpu.sh: $deps is missing: run 'bash .ci/gpu.sh --prepare' on a Debian machine first" >&2; exit 2; }
PYTHON=${PYTHON:-$(command -v python3)}
build=${TORCHPROBE_GPU_BUILD_DIR:-build-gpu}
jobs=${TORCHPROBE_GPU_JOBS:-$(nproc)}
t0=$(date +%s)
stamp() { echo "[gpu $(($(date +%s) - t0))s] $*"; }

nvidia-smi -L || true
# CUDA's compiler for libtorch's CMake files; the arch list spares them compiling a probe program.
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)}
echo "c++: $(c++ --version | head -1); nvcc: $(nvcc --version 2>/dev/null | tail -1); arch: ${TORCH_CUDA_ARCH_LIST:-?}"
torch_prefix=${TORCHPROBE_GPU_TORCH_PREFIX:-$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')}
stamp "torch $("$PYTHON" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())')"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$deps" \
  -DZLIB_INCLUDE_DIR="$deps/include" -DZLIB_LIBRARY="$deps/lib/libz.a" \
  -DTORCHPROBE_PYTHON="$PYTHON" -DTORCHPROBE_BUILD_BENCHMARKS=ON \
  -DTORCHPROBE_BUILD_EXAMPLES=OFF -DTORCHPROBE_BUILD_CLI=OFF -DTORCHPROBE_INSTALL=OFF
stamp "configured"
cmake --build "$build" -j "$jobs" --target torchprobe_cuda_tests torchprobe_cuda_benchmark
stamp "built"
status=0
log=$build/gpu-checks.log
"$build/tests/torchprobe_cuda_tests" 2>&1 | tee "$log" || status=$?
# 77: every case skipped (tests/skip.hpp, no device): the summary below counts and reports that.
if [ "$status" -eq 77 ]; then status=0; fi
stamp "CUDA tests: exit status $status"
"$build/benchmarks/torchprobe_cuda_benchmark" cuda 2>&1 | tee -a "$log" || status=$?
stamp "CUDA benchmark done (exit status so far $status)"

# One line per check: each test case and whether it ran or was skipped (no device), then the result.
echo "== summary ($(($(date +%s) - t0)) s)"
"$build/tests/torchprobe_cuda_tests" --list-test-cases --no-version 2>/dev/null | sed -n 's/^\(.\+\)$/\1/p' |
  grep -v -e '^\[doctest\]' -e '^=\+$' | while IFS= read -r name; do
  if grep -qF "SKIPPED" <(grep -A3 -F "TEST CASE:  $name" "$log"); then
    echo "SKIPPED  $name"
  else
    echo "RAN      $name"
  fi
done || true
skipped=$(grep -c "SKIPPED" "$log" || true)
if [ "$cpu_only" = 1 ]; then
  echo "gpu.sh --cpu: the CUDA tests and benchmark built against the CPU libtorch; exit status $status ($skipped SKIPPED lines: no device here)"
elif [ "$skipped" -gt 0 ]; then
  echo "gpu.sh: $skipped checks were SKIPPED: this machine gave no CUDA device (exit status $status)"
  [ "$status" -eq 0 ] && status=3
else
  echo "gpu.sh: every CUDA check ran; exit status $status"
fi
exit "$status"

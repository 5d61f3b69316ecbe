#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# GPU check, for a machine with an NVIDIA GPU (CUDA 13, CMake; no network needed):
#   scripts/gpu-check.sh RESULTS_DIR
# configures a fresh build for the local GPU (CMAKE_CUDA_ARCHITECTURES=native), builds the CUDA
# tests and the first-step benchmark, runs every GPU test, then times one denoising step on the
# dg_wide fixture (FP32 and BF16), on a synthetic hidden-1024 / vocab-262144 model and, when the
# GPU has the memory (DG_GPU_CHECK_REAL=0 skips it), on the real 26B-A4B shapes with random
# weights made on the device. Sized for 8 minutes on an H200; each step has its own timeout.
#
# RESULTS_DIR receives six files (a device runner may return only a few):
#   summary.json          exit status and seconds of every step, and the benchmark results
#   env.txt               nvidia-smi, nvcc, cmake, compiler versions
#   build.log             configure and build output
#   tests.log             ctest -L cuda -V, with the measured errors (DG_TEST_VERBOSE=1)
#   bench.log             benchmark output
#   first_step.json       one JSON object per benchmark configuration, one per line
set -uo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 RESULTS_DIR" >&2
  exit 2
fi
mkdir -p "$1"
results="$(cd "$1" && pwd)"
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${DG_GPU_BUILD_DIR:-$root/build-gpu}"
jobs="$(nproc)"
if [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
t0=$(date +%s)
steps_json=""
failed=0

# run NAME TIMEOUT LOG COMMAND...: runs the command with a timeout, appends its output to LOG and
# records the exit status and duration in summary.json.
run() {
  local name="$1" limit="$2" log="$3"
  shift 3
  local start=$(date +%s)
  echo "== $name: $*" >>"$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  local secs=$(($(date +%s) - start))
  echo "== $name: exit $rc after ${secs}s" >>"$log"
  echo "[$(($(date +%s) - t0))s] $name: exit $rc (${secs}s)"
  steps_json="${steps_json}${steps_json:+, }\"$name\": {\"exit\": $rc, \"seconds\": $secs}"
  [ "$rc" -eq 0 ] || failed=1
  return "$rc"
}

: >"$results/build.log"
: >"$results/tests.log"
: >"$results/bench.log"
: >"$results/first_step.json"
{
  nvidia-smi || true
  nvcc --version || true
  cmake --version | head -1 || true
  "${CXX:-c++}" --version | head -1 || true
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' \
    2>/dev/null || echo "python: torch/transformers not importable (not needed by this check)"
} >"$results/env.txt" 2>&1

# A fresh build: remove an earlier build tree of this script, never anything else.
if [ -e "$build" ]; then
  if [ -f "$build/CMakeCache.txt" ]; then
    rm -rf "$build"
  else
    echo "$build exists and is not a CMake build tree; set DG_GPU_BUILD_DIR" >&2
    exit 2
  fi
fi
# The local GPU's architecture: CMake's "native" (3.24+), else the compute capability nvidia-smi
# reports; DG_GPU_CHECK_ARCH overrides both (e.g. to dry-run the script on a machine without a GPU).
arch="native"
cmake_version="$(cmake --version | head -1 | awk '{print $3}')"
if [ "$(printf '%s\n' 3.24 "$cmake_version" | sort -V | head -1)" != "3.24" ]; then
  arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')"
fi
arch="${DG_GPU_CHECK_ARCH:-${arch:-native}}"
run configure 300 "$results/build.log" \
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDG_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DDG_BUILD_EXAMPLES=OFF -DDG_BUILD_BENCHMARKS=ON -DDG_INSTALL=OFF
if [ $failed -eq 0 ]; then
  run build 420 "$results/build.log" cmake --build "$build" -j"$jobs" --target dg_cuda_tests dg_gpu_first_step
fi

if [ $failed -eq 0 ]; then
  # -V keeps the test's own output: with DG_TEST_VERBOSE=1 it prints the measured logit errors
  # that the BF16 tolerances should be recalibrated from.
  DG_TEST_VERBOSE=1 run ctest 360 "$results/tests.log" ctest --test-dir "$build" -L cuda -V
  if grep -q "dg_cuda_tests .*Skipped" "$results/tests.log"; then
    echo "dg_cuda_tests reported no device: this check needs a GPU" | tee -a "$results/tests.log"
    steps_json="${steps_json}, \"gpu_present\": {\"exit\": 1, \"seconds\": 0}"
    failed=1
  fi

  bench="$build/benchmarks/gpu/dg_gpu_first_step"
  bench_run() {  # name timeout args...
    local name="$1" limit="$2"
    shift 2
    run "bench_$name" "$limit" "$results/bench.log" "$bench" "$@" --json "$results/.bench_$name.json" &&
      cat "$results/.bench_$name.json" >>"$results/first_step.json"
    rm -f "$results/.bench_$name.json"
  }
  bench_run dg_wide_f32 60 --fixture "$root/tests/fixtures/dg_wide" --dtype f32 --prompt 64
  bench_run dg_wide_bf16 60 --fixture "$root/tests/fixtures/dg_wide" --dtype bf16 --prompt 64
  bench_run synthetic_small_bf16 120 --synthetic small --dtype bf16 --prompt 512
  free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -dc '0-9')
  if [ "${DG_GPU_CHECK_REAL:-1}" != "0" ] && [ "${free_mib:-0}" -gt 70000 ]; then
    bench_run synthetic_real_bf16 240 --synthetic real --dtype bf16 --prompt 1024 --steps 5
  else
    echo "synthetic real: skipped (DG_GPU_CHECK_REAL=${DG_GPU_CHECK_REAL:-1}, ${free_mib:-?} MiB free)" \
      >>"$results/bench.log"
  fi
fi

benchmarks="$(paste -sd, "$results/first_step.json")"
cat >"$results/summary.json" <<EOF
{"elapsed_seconds": $(($(date +%s) - t0)), "failed": $failed, "steps": {${steps_json}}, "first_step": [${benchmarks}]}
EOF
cat "$results/summary.json"
exit $failed

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU check: runs only the prebuilt binaries of scripts/gpu-build.sh, on a machine with an
# NVIDIA GPU and its driver (no compiler, no package registry, no network needed):
#
#   gpu-check.sh RESULTS_DIR
#
# Environment:
#   DG_GPU_BUNDLE           the folder gpu-build.sh made (default: this script's folder when it holds
#                           bin/, else build-gpu-bundle in the repository)
#   DG_GPU_CHECK_DEADLINE   seconds for everything (default 420); each step gets what is left
#   DG_GPU_CHECK_REAL=0     skips the 26B-A4B timing (it needs about 55 GB of device memory)
#   DG_CUBLAS_DIR           where libcublas.so.13 / libcublasLt.so.13 are, if not found otherwise
#   DG_SANITIZER            the compute-sanitizer executable, if not on PATH or in the CUDA toolkit
#
# Steps, in order, each under its own limit and the overall deadline:
#   memcheck, racecheck   the kernel tests under compute-sanitizer; memcheck_engine: the engine on
#                         the small fixtures under memcheck (skipped, and said so, without it)
#   tests                 every GPU test (transformers golden outputs, CPU oracle, replay parity)
#   realscale_f32/_bf16   the GPU at the released widths (hidden 2816, head dims 256/512, 128 experts
#                         top-8, vocabulary 262,144, canvas 256, prompt 1100 > the 1024 window,
#                         3 layers) against the CPU's outputs carried in the folder, and a sampled
#                         generation's tokens against the CPU's
#   timing_*              one denoise step, one commit and a generation: dg_wide, a hidden-1024
#                         model, and the 26B-A4B shape with random weights made on the device, each
#                         next to the time it takes to stream every weight once from HBM
#
# RESULTS_DIR gets summary.json, rewritten after every step (a run killed at any point still
# reports), one log per step, env.txt, and each program's JSON. Exit status: 0 every step passed,
# 1 a step failed or timed out, 3 no GPU (refused before running anything), 2 bad usage or folder.
set -uo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 RESULTS_DIR" >&2
  exit 2
fi
mkdir -p "$1" || exit 2
results="$(cd "$1" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
if [ -n "${DG_GPU_BUNDLE:-}" ]; then
  bundle="$DG_GPU_BUNDLE"
elif [ -d "$here/bin" ]; then
  bundle="$here"
else
  bundle="$(cd "$here/.." && pwd)/build-gpu-bundle"
fi
deadline="${DG_GPU_CHECK_DEADLINE:-420}"
case "$deadline" in ''|*[!0-9]*) echo "DG_GPU_CHECK_DEADLINE must be whole seconds, got '$deadline'" >&2; exit 2 ;; esac
t0=$(date +%s)
state="running"
gpu_present="null"
steps=""    # JSON members "name": {...}, in run order
results_json=""  # JSON members "name": <program output>
failed=0

elapsed() { echo $(($(date +%s) - t0)); }
json_escape() { sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | tr -d '\n\r' | tr '\t' ' '; }

write_summary() {
  local tmp="$results/.summary.json.tmp"
  cat >"$tmp" <<JSON
{"state": "$state", "elapsed_seconds": $(elapsed), "deadline_seconds": $deadline, "gpu_present": $gpu_present,
 "failed": $failed, "bundle": "$(printf '%s' "$bundle" | json_escape)",
 "steps": {${steps}},
 "results": {${results_json}}}
JSON
  mv "$tmp" "$results/summary.json"
}

# record NAME STATUS EXIT SECONDS NOTE
record() {
  local note
  note="$(printf '%s' "$5" | json_escape)"
  steps="${steps}${steps:+, }\"$1\": {\"status\": \"$2\", \"exit\": $3, \"seconds\": $4, \"note\": \"$note\"}"
  echo "[$(elapsed)s] $1: $2 (exit $3, ${4}s)${5:+ - $5}"
  case "$2" in fail|timeout) failed=1 ;; esac
  write_summary
}

# step NAME LIMIT [--json FILE] COMMAND...: runs COMMAND under min(LIMIT, time left before the
# deadline), output to NAME.log. Exit 77 means the program found no CUDA device.
step() {
  local name="$1" limit="$2"
  shift 2
  local json=""
  if [ "$1" = "--json" ]; then json="$2"; shift 2; fi
  local left=$((deadline - $(elapsed) - 5))
  if [ "$left" -lt 10 ]; then
    record "$name" skipped 0 0 "the ${deadline}s deadline leaves no time"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local start=$(date +%s)
  echo "== $name: $* (limit ${limit}s)" >"$results/$name.log"
  timeout --kill-after=5 "$limit" "$@" >>"$results/$name.log" 2>&1
  local rc=$? secs=$(($(date +%s) - start)) status=pass note=""
  case $rc in
    0) ;;
    # Steps run only after nvidia-smi listed a GPU: a program that then finds no CUDA device
    # (a driver older than the CUDA 13 runtime, a hidden device) is a failure of this check.
    77) status=fail; note="nvidia-smi lists a GPU but the program finds no CUDA device: $(grep -m1 -i 'no CUDA device' "$results/$name.log" | head -c 200)" ;;
    124|137) status=timeout; note="stopped at ${limit}s" ;;
    *) status=fail; note="$(grep -E -m3 'FAILED|failed|error|Error|ERROR' "$results/$name.log" | head -c 300)" ;;
  esac
  # Some machines (gVisor sandboxes) run CUDA but refuse the sanitizer's instrumentation: that is
  # the machine's limit, not a finding, and is reported as such.
  case "$name" in memcheck*|racecheck*)
    if [ "$status" = fail ] && grep -q -E 'Device not supported|not supported on this (device|platform)' "$results/$name.log"; then
      status=unsupported; note="compute-sanitizer cannot instrument this machine's device"
    fi ;;
  esac
  if [ -n "$json" ] && [ -s "$json" ]; then
    results_json="${results_json}${results_json:+, }\"$name\": $(paste -sd, "$json")"
  fi
  record "$name" "$status" "$rc" "$secs" "$note"
  return 0
}

trap 'state="interrupted"; write_summary; exit 1' INT TERM
write_summary

# ---- what this machine has ----------------------------------------------------------------------
{
  echo "date: $(date -u)"
  uname -a
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  grep -m1 'model name' /proc/cpuinfo
  echo "bundle: $bundle"
  cat "$bundle/MANIFEST.json" 2>/dev/null || echo "no MANIFEST.json"
} >"$results/env.txt" 2>&1

bins="dg_cuda_tests dg_gpu_first_step dg_gpu_realscale"
for b in $bins; do
  if [ ! -x "$bundle/bin/$b" ]; then
    record bundle fail 2 0 "$bundle/bin/$b is missing: build the folder with scripts/gpu-build.sh"
    state="done"; write_summary; exit 2
  fi
done

# cuBLAS, when the binaries link it dynamically: the first folder that has both libraries.
if ldd "$bundle/bin/dg_gpu_realscale" 2>/dev/null | grep -q 'libcublas.*not found'; then
  found=""
  candidates="${DG_CUBLAS_DIR:-} /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib"
  for py in python3 /opt/torch/.venv/bin/python3; do
    d="$("$py" -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cu13", "cublas")))' 2>/dev/null)" &&
      candidates="$candidates $d"
  done
  for d in $candidates; do
    if [ -f "$d/libcublas.so.13" ] && [ -f "$d/libcublasLt.so.13" ]; then found="$d"; break; fi
  done
  if [ -z "$found" ]; then
    found="$(find / -xdev -name libcublasLt.so.13 -print -quit 2>/dev/null | xargs -r dirname)"
    [ -n "$found" ] && [ ! -f "$found/libcublas.so.13" ] && found=""
  fi
  if [ -n "$found" ]; then
    export LD_LIBRARY_PATH="$found${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    record libraries pass 0 0 "cuBLAS from $found"
  else
    record libraries fail 2 0 "libcublas.so.13 and libcublasLt.so.13 not found: set DG_CUBLAS_DIR"
    state="done"; write_summary; exit 2
  fi
elif ldd "$bundle/bin/dg_gpu_realscale" 2>/dev/null | grep -q 'libcublas'; then
  record libraries pass 0 0 "cuBLAS resolves to $(ldd "$bundle/bin/dg_gpu_realscale" | awk '/libcublas\.so/ {print $3}')"
else
  record libraries pass 0 0 "cuBLAS linked statically: nothing beyond the driver needed"
fi
for b in $bins; do  # each binary loads (its libraries resolve) before any GPU work
  if ldd "$bundle/bin/$b" | grep -q 'not found'; then
    record bundle fail 2 0 "$b: $(ldd "$bundle/bin/$b" | grep 'not found' | head -3 | tr '\n' ' ')"
    state="done"; write_summary; exit 2
  fi
done

# ---- is there a GPU? ----------------------------------------------------------------------------
if nvidia-smi -L >/dev/null 2>&1 && nvidia-smi -L | grep -q GPU; then
  gpu_present=true
  record gpu pass 0 0 "$(nvidia-smi -L | head -1)"
else
  gpu_present=false
  record gpu skipped 3 0 "no NVIDIA GPU or driver (nvidia-smi -L): nothing was run on a device"
  state="refused"; write_summary
  echo "gpu-check.sh: no GPU: refused; $results/summary.json says what was checked" >&2
  exit 3
fi
free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -dc '0-9')

export DG_TEST_FIXTURES="$bundle/fixtures"
export DG_TEST_VERBOSE=1
tests="$bundle/bin/dg_cuda_tests"

# ---- sanitizers on the small fixtures -----------------------------------------------------------
sanitizer="${DG_SANITIZER:-$(command -v compute-sanitizer || true)}"
for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer /opt/nvidia/compute-sanitizer; do
  [ -z "$sanitizer" ] && [ -x "$d/compute-sanitizer" ] && sanitizer="$d/compute-sanitizer"
done
if [ -n "$sanitizer" ]; then
  kernels='[kernel],[device],[sampler]'
  step memcheck 60 "$sanitizer" --tool memcheck --error-exitcode 1 --leak-check full "$tests" "$kernels"
  step racecheck 60 "$sanitizer" --tool racecheck --error-exitcode 1 "$tests" "$kernels"
  step memcheck_engine 60 "$sanitizer" --tool memcheck --error-exitcode 1 "$tests" \
    "bad inputs and impossible requests name what is wrong" "cuda::KvCache truncate re-runs a commit exactly" \
    "cuda::Engine encoder chunking is exact: 3-token passes" "cuda::Engine device passes check their ids on the device" \
    "cuda::Engine refuses a KV cache made for another model or dtype" \
    "a plain step after a longer batched step keeps the engine's state in bounds"
else
  for s in memcheck racecheck memcheck_engine; do
    record "$s" skipped 0 0 "compute-sanitizer not found (set DG_SANITIZER)"
  done
fi

# ---- every GPU test, then the real-scale comparison ---------------------------------------------
step tests 90 "$tests" --durations yes
ref="$bundle/realscale_reference.safetensors"
if [ -f "$ref" ]; then
  step realscale_f32 60 --json "$results/realscale_f32.json" \
    "$bundle/bin/dg_gpu_realscale" check --reference "$ref" --dtype f32 --json "$results/realscale_f32.json"
  step realscale_bf16 60 --json "$results/realscale_bf16.json" \
    "$bundle/bin/dg_gpu_realscale" check --reference "$ref" --dtype bf16 --json "$results/realscale_bf16.json"
else
  record realscale_f32 fail 2 0 "$ref missing: scripts/gpu-build.sh makes it"
fi

# ---- timing ------------------------------------------------------------------------------------
bench="$bundle/bin/dg_gpu_first_step"
step timing_dg_wide_bf16 30 --json "$results/timing_dg_wide_bf16.json" \
  "$bench" --fixture "$bundle/fixtures/dg_wide" --dtype bf16 --prompt 64 --json "$results/timing_dg_wide_bf16.json"
step timing_small_bf16 40 --json "$results/timing_small_bf16.json" \
  "$bench" --synthetic small --dtype bf16 --prompt 512 --json "$results/timing_small_bf16.json"
if [ "${DG_GPU_CHECK_REAL:-1}" != "0" ] && [ "${free_mib:-0}" -gt 70000 ]; then
  step timing_real_bf16 120 --json "$results/timing_real_bf16.json" \
    "$bench" --synthetic real --dtype bf16 --prompt 1024 --steps 5 --generate-steps 16 --json "$results/timing_real_bf16.json"
else
  record timing_real_bf16 skipped 0 0 "DG_GPU_CHECK_REAL=${DG_GPU_CHECK_REAL:-1}, ${free_mib:-?} MiB free (needs 70000)"
fi

state="done"
write_summary
cat "$results/summary.json"
exit $failed

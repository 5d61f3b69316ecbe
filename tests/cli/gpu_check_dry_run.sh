#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Dry run of scripts/gpu-check.sh on a machine without a GPU (CI): a folder laid out as
# scripts/gpu-build.sh lays it out, from this build's binaries, must be found and loaded, the
# missing GPU refused with exit 3, and summary.json written and saying so. A folder missing a
# binary must be refused with exit 2, naming it.
#   gpu_check_dry_run.sh SCRIPT WORK_DIR TESTS_BIN FIRST_STEP_BIN REALSCALE_BIN FIXTURES
set -euo pipefail
script="$1" work="$2" fixtures="$6"
if nvidia-smi -L >/dev/null 2>&1; then
  echo "a GPU is present: the dry run is for machines without one"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work/bundle/bin" "$work/bundle/fixtures"
cp "$3" "$4" "$5" "$work/bundle/bin/"
cp -r "$fixtures/dg_small" "$work/bundle/fixtures/"

field() {  # field FILE PYTHON_EXPRESSION_ON_s
  python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print($2)" "$1"
}

set +e
DG_GPU_BUNDLE="$work/bundle" bash "$script" "$work/results" >"$work/out.log" 2>&1
rc=$?
set -e
cat "$work/out.log"
[ "$rc" -eq 3 ] || { echo "expected exit 3 (no GPU), got $rc"; exit 1; }
summary="$work/results/summary.json"
[ -f "$summary" ] || { echo "no summary.json"; exit 1; }
[ "$(field "$summary" 's["state"]')" = refused ] || { echo "state is not 'refused'"; exit 1; }
[ "$(field "$summary" 's["gpu_present"]')" = False ] || { echo "gpu_present is not false"; exit 1; }
[ "$(field "$summary" 's["steps"]["libraries"]["status"]')" = pass ] || { echo "libraries did not resolve"; exit 1; }
[ "$(field "$summary" 's["steps"]["gpu"]["status"]')" = skipped ] || { echo "the gpu step is not recorded"; exit 1; }
[ "$(field "$summary" '"memcheck" in s["steps"]')" = False ] || { echo "a GPU step ran without a GPU"; exit 1; }
grep -q "nvidia-smi" "$work/results/env.txt" || { echo "env.txt lacks the nvidia-smi probe"; exit 1; }

rm "$work/bundle/bin/dg_gpu_realscale"
set +e
DG_GPU_BUNDLE="$work/bundle" bash "$script" "$work/results2" >"$work/out2.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "a folder without dg_gpu_realscale: expected exit 2, got $rc"; exit 1; }
field "$work/results2/summary.json" 's["steps"]["bundle"]["note"]' | grep -q dg_gpu_realscale ||
  { echo "the summary does not name the missing binary"; exit 1; }
echo "gpu-check.sh dry run: refused without a GPU, summary written"

# The whole sequence, with a stand-in nvidia-smi that reports a GPU the CUDA runtime cannot see
# (as with a driver older than the runtime): every step must run in order, each program's "no
# device" (exit 77) be recorded as a failure that says so, the real-shape timing be skipped for
# lack of memory, and the summary end in state "done" with exit 1.
cp "$5" "$work/bundle/bin/"
: >"$work/bundle/realscale_reference.safetensors"  # present; never read without a device
mkdir -p "$work/fake"
cat >"$work/fake/nvidia-smi" <<'SMI'
#!/bin/sh
case "$*" in
  *-L*) echo "GPU 0: Stand-in GPU (UUID: GPU-0)" ;;
  *memory.free*) echo 1000 ;;
  *) echo "stand-in nvidia-smi" ;;
esac
SMI
chmod +x "$work/fake/nvidia-smi"
set +e
PATH="$work/fake:$PATH" DG_SANITIZER="" DG_GPU_BUNDLE="$work/bundle" bash "$script" "$work/results3" >"$work/out3.log" 2>&1
rc=$?
set -e
cat "$work/out3.log"
s3="$work/results3/summary.json"
[ "$(field "$s3" 's["state"]')" = done ] || { echo "the full sequence did not finish"; exit 1; }
[ "$(field "$s3" 's["gpu_present"]')" = True ] || { echo "the stand-in GPU was not seen"; exit 1; }
for st in tests realscale_f32 realscale_bf16 timing_dg_wide_bf16 timing_small_bf16; do
  [ "$(field "$s3" "s['steps']['$st']['status']")" = fail ] || { echo "step $st: expected fail (no CUDA device)"; exit 1; }
  field "$s3" "s['steps']['$st']['note']" | grep -q "finds no CUDA device" || { echo "step $st: the note does not say why"; exit 1; }
done
[ "$(field "$s3" 's["steps"]["timing_real_bf16"]["note"]')" != "" ] || { echo "the real-shape timing's skip is not explained"; exit 1; }
[ "$(field "$s3" 'list(s["steps"])[-1]')" = timing_real_bf16 ] || { echo "steps out of order"; exit 1; }
[ "$rc" -eq 1 ] || { echo "failed steps: expected exit 1, got $rc"; exit 1; }

# A deadline too short for any step: each is recorded as skipped for the deadline, none runs.
set +e
PATH="$work/fake:$PATH" DG_SANITIZER="" DG_GPU_CHECK_DEADLINE=10 DG_GPU_BUNDLE="$work/bundle" \
  bash "$script" "$work/results4" >"$work/out4.log" 2>&1
set -e
field "$work/results4/summary.json" 's["steps"]["tests"]["note"]' | grep -q deadline ||
  { echo "a step ran past the deadline or was not recorded"; cat "$work/out4.log"; exit 1; }
echo "gpu-check.sh: full sequence and deadline handled"

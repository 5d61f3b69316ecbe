#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Exact match of the bundled model quantised by `dgemma quantize` with each scheme, next to the
# model as shipped, seeds 0-5, default sampler (48 steps), default precision. Writes
# benchmarks/quality/quantized/<scheme>/seed<N>.json; benchmarks/quality/quantized/table.py prints
# the table of docs/quantization.md.
#   benchmarks/quality/quantized/run.sh [BUILD_DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
build="${1:-$root/build}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
out="$root/benchmarks/quality/quantized"
declare -A flags=([w4a16]="--scheme w4a16 --group-size 64" [w8a16]="--scheme w8a16" [int8]="--scheme int8" [fp8]="--scheme fp8")
for scheme in original w4a16 w8a16 int8 fp8; do
  model="$root/models/dg-tiny-tasks"
  if [ "$scheme" != original ]; then
    model="$work/$scheme"
    # shellcheck disable=SC2086
    "$build/examples/dgemma" quantize --model "$root/models/dg-tiny-tasks" --out "$model" ${flags[$scheme]} 2>/dev/null
  fi
  mkdir -p "$out/$scheme"
  for seed in 0 1 2 3 4 5; do
    "$build/benchmarks/eval_quality" --model "$model" --data "$root/tools/train/data/test.jsonl" --steps 48 \
      --seed "$seed" --out "$out/$scheme/seed$seed.json" | grep "^\[eval\]" | sed "s/^/$scheme seed $seed: /"
  done
done

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The fast precision's int8 activations (AVX2 and AVX-512 CPUs without AMX; cpu/kernels/int8_products.hpp)
# against the exact precision, on the bundled model quantised to w4a16 (group 64), next to the
# model as shipped, seeds 0-5, default sampler (48 steps). Run it on an AVX2 machine (or with ISA
# avx512 on an AVX-512 one, where the other matrices take AVX512-BF16 dot products); it writes
# benchmarks/quality/quantized/<ISA>/<variant>/seed<N>.json, and
#   python3 benchmarks/quality/quantized/table.py --root benchmarks/quality/quantized/avx2
# prints the table and checks the targets (w4a16 within 5 points of the shipped model; the fast
# precision within 1 point of the exact one, the rule for making it the default).
#   benchmarks/quality/quantized/avx2_int8.sh [BUILD_DIR] [ISA: avx2 (default) or avx512]
set -euo pipefail
root="$(cd "$(dirname "$0")/../../.." && pwd)"
build="${1:-$root/build}"
isa="${2:-avx2}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
out="$root/benchmarks/quality/quantized/$isa"
"$build/examples/dgemma" quantize --model "$root/models/dg-tiny-tasks" --out "$work/w4a16" --scheme w4a16 --group-size 64 2>/dev/null
for variant in original w4a16-exact w4a16-fast; do
  model="$work/w4a16"
  precision="${variant#w4a16-}"
  if [ "$variant" = original ]; then model="$root/models/dg-tiny-tasks"; precision=fast; fi
  mkdir -p "$out/$variant"
  for seed in 0 1 2 3 4 5; do
    DG_CPU_ISA="$isa" "$build/benchmarks/eval_quality" --model "$model" --data "$root/tools/train/data/test.jsonl" --steps 48 \
      --seed "$seed" --precision "$precision" --out "$out/$variant/seed$seed.json" | grep "^\[eval\]" | sed "s/^/$variant seed $seed: /"
  done
done

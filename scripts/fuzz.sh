#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a bounded time on a
# copy of its committed seed corpus.
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [BUILD_DIR]
#   DG_FUZZ_RUNS=1000000 scripts/fuzz.sh 0    # the long run of docs/reliability.md: a fixed number of executions
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-20}"
build="${2:-$root/build-fuzz}"
cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDG_FUZZ=ON \
  -DDG_BUILD_TESTS=OFF -DDG_BUILD_EXAMPLES=OFF -DDG_BUILD_BENCHMARKS=OFF -DDG_INSTALL=OFF -DDG_CUDA=OFF >/dev/null
cmake --build "$build" -j"$(nproc)"
for target in "$build"/tests/fuzz/*_fuzz; do
  name="$(basename "$target" _fuzz)"
  work="$build/corpus/$name"
  mkdir -p "$work"
  cp -n "$root/tests/fuzz/corpus/$name/"* "$work/" 2>/dev/null || true
  echo "fuzzing $name (${DG_FUZZ_RUNS:-${seconds}s})"
  limit=(-max_total_time="$seconds")
  if [ -n "${DG_FUZZ_RUNS:-}" ]; then
    limit=(-runs="$DG_FUZZ_RUNS")
  fi
  log="$build/fuzz-$name.log"
  # libFuzzer exits non-zero on any crash, leak or sanitizer report; that status (not grep's) decides.
  set +e
  "$target" "${limit[@]}" -print_final_stats=1 -artifact_prefix="$build/crash-$name-" "$work" >"$log" 2>&1
  status=$?
  set -e
  grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|Done|==|SUMMARY|INFO: Seed)" "$log" || true
  if [ "$status" -ne 0 ]; then
    tail -n 40 "$log"
    echo "fuzz target $name failed (exit $status); full log: $log; reproducer: $build/crash-$name-*" >&2
    exit 1
  fi
done

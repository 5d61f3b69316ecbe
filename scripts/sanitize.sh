#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The reliability runs of docs/reliability.md, all failing on any report:
#   1. every CPU test under AddressSanitizer + UndefinedBehaviorSanitizer;
#   2. the concurrency test under ThreadSanitizer (decoders in several threads, each engine on
#      two or more threads of its own team: cpu/thread_team.hpp);
#   3. valgrind --leak-check=full on a whole `dgemma generate` (a build without -march=native:
#      valgrind does not decode AVX-512).
#   scripts/sanitize.sh [asan|tsan|valgrind|all]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
what="${1:-all}"
jobs="$(nproc)"
# -O1 -g1: the sanitizers' recommended optimisation with line tables only; builds 2.4x faster than
# -O2 -g (measured on tests/cpu/vocab_pass_test.cpp: 71 s against 170 s), which keeps CI within its hour.
common=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DDG_BUILD_BENCHMARKS=OFF -DDG_INSTALL=OFF -DDG_CUDA=OFF -DDG_HEADER_CHECK=OFF)

if [ "$what" = all ] || [ "$what" = asan ]; then
  b="$root/build-asan"
  cmake -S "$root" -B "$b" "${common[@]}" -DDG_SANITIZE=address,undefined >/dev/null
  cmake --build "$b" -j"$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$b" --output-on-failure -j"$jobs" -E "package"
fi
if [ "$what" = all ] || [ "$what" = tsan ]; then
  b="$root/build-tsan"
  cmake -S "$root" -B "$b" "${common[@]}" -DDG_SANITIZE=thread -DDG_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$b" -j"$jobs" --target dg_runtime_tests
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 "$b/tests/dg_runtime_tests" "[concurrency]"
fi
if [ "$what" = all ] || [ "$what" = valgrind ]; then
  command -v valgrind >/dev/null || "$root/scripts/install-deps.sh"
  b="$root/build-valgrind"
  cmake -S "$root" -B "$b" "${common[@]}" -DDG_NATIVE_ARCH=OFF -DDG_BUILD_TESTS=OFF >/dev/null
  cmake --build "$b" -j"$jobs" --target dgemma
  model="$b/valgrind_model"
  mkdir -p "$model"
  cp "$root"/tests/fixtures/dg_wide/{config.json,generation_config.json,model.safetensors} "$model/"
  cp "$root/tests/fixtures/tokenizers/gemma_bpe_300_unk.json" "$model/tokenizer.json"
  OMP_NUM_THREADS=2 valgrind --leak-check=full --errors-for-leak-kinds=definite,indirect --error-exitcode=3 \
    "$b/examples/dgemma" generate --model "$model" --chat --prompt "Hello there" --max-new-tokens 24 \
    --max-denoising-steps 6 --seed 3 --no-view 2>&1 | tail -n 14
fi

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's test command: installs what is missing, builds everything (CUDA translation units
# with nvcc where a CUDA toolkit is installed: compile only), runs every CPU test, runs them again
# under ASan + UBSan (and the concurrency test under TSan, and dgemma under valgrind), then a
# short fuzz of each libFuzzer target.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh"
if [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
build="${DG_BUILD_DIR:-$root/build}"
jobs="$(nproc)"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$jobs"
ctest --test-dir "$build" --output-on-failure -j"$jobs" -LE cuda
"$root/scripts/sanitize.sh" all
"$root/scripts/fuzz.sh" "${DG_FUZZ_SECONDS:-15}" "$root/build-fuzz"
echo "all tests passed"

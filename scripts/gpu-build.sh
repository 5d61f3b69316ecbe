#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds, on this machine (CUDA toolkit, no GPU needed), everything the GPU check runs, into one
# folder that can be carried to a machine with only the NVIDIA driver:
#
#   scripts/gpu-build.sh [--arch SM] [--out DIR] [--reuse-reference]
#
#   --arch SM            CUDA architecture (default 90: H100 / H200; e.g. 80 for A100, 89 for L4)
#   --out DIR            the folder (default build-gpu-bundle in the repository; replaced)
#   --reuse-reference    keep DIR's realscale reference if its scenario and format still match
#
# The folder (at most 60 MiB, checked) holds:
#   bin/dg_cuda_tests, bin/dg_gpu_first_step, bin/dg_gpu_realscale   the CUDA runtime linked in
#   fixtures/                       the test checkpoints and transformers' golden outputs they read
#   realscale_reference.safetensors the CPU back-end's outputs at real width (made here: minutes)
#   gpu-check.sh                    the check itself (scripts/gpu-check.sh)
#   MANIFEST.json                   commit, architecture, toolkit, sizes and what the target needs
#
# cuBLAS: linked statically where the toolkit ships libcublas_static.a. The toolkits this project
# is built with (CUDA 13 from NVIDIA's wheels) do not, and the shared libraries are 570 MB, far over
# the folder's limit: the binaries then need libcublas.so.13 and libcublasLt.so.13 on the target,
# which gpu-check.sh looks for (DG_CUBLAS_DIR, the CUDA toolkit, PyTorch's nvidia wheels) and names
# if it finds none. Host code is built for a generic x86-64 (-march=native would bake in this CPU's
# AVX-512 or AMX); the CPU back-end still picks its kernels at run time.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
arch=90
out="$root/build-gpu-bundle"
reuse=0
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="${2:?--arch needs a value}"; shift 2 ;;
    --out) out="${2:?--out needs a value}"; shift 2 ;;
    --reuse-reference) reuse=1; shift ;;
    -h|--help) sed -n '3,25p' "$0"; exit 0 ;;
    *) echo "gpu-build.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$arch" in *[!0-9a]*|"") echo "gpu-build.sh: --arch takes a number such as 90 or 90a, got '$arch'" >&2; exit 2 ;; esac
if [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
if ! command -v nvcc >/dev/null; then
  echo "gpu-build.sh: nvcc not found: this script needs the CUDA toolkit (not a GPU)" >&2
  exit 2
fi
"$root/scripts/install-deps.sh"
build="${DG_GPU_BUILD_DIR:-$root/build-gpubuild}"
jobs="$(nproc)"
t0=$(date +%s)
say() { echo "[gpu-build $(($(date +%s) - t0))s] $*"; }

say "configure $build for sm_$arch"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDG_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DDG_CUDA_STATIC_RUNTIME=ON -DDG_NATIVE_ARCH=OFF -DDG_BUILD_EXAMPLES=OFF -DDG_BUILD_BENCHMARKS=ON \
  -DDG_INSTALL=OFF >"$build.configure.log" 2>&1 || { cat "$build.configure.log" >&2; exit 1; }
say "build (about 6 minutes on 2 cores)"
cmake --build "$build" -j"$jobs" --target dg_cuda_tests dg_gpu_first_step dg_gpu_realscale

# The reference is kept only when asked and when it was made for the same scenario and format
# (dg_gpu_realscale check refuses a stale one anyway).
ref="$out/realscale_reference.safetensors"
keep=""
if [ "$reuse" = 1 ] && [ -f "$ref" ]; then
  keep="$(mktemp -d)"
  cp "$ref" "$out/realscale_reference.json" "$keep/" 2>/dev/null || true
fi
rm -rf "$out"
mkdir -p "$out/bin" "$out/fixtures"
for b in tests/cuda/dg_cuda_tests benchmarks/gpu/dg_gpu_first_step benchmarks/gpu/dg_gpu_realscale; do
  cp "$build/$b" "$out/bin/"
  strip --strip-unneeded "$out/bin/$(basename "$b")"
done
for f in dg_small dg_wide gemma4_dense; do cp -r "$root/tests/fixtures/$f" "$out/fixtures/"; done
cp "$root/scripts/gpu-check.sh" "$out/gpu-check.sh"

if [ -n "$keep" ] && [ -f "$keep/realscale_reference.safetensors" ]; then
  say "reference kept from the earlier folder"
  cp "$keep"/* "$out/"
  rm -rf "$keep"
else
  say "realscale reference: the CPU back-end at real width (a few minutes)"
  "$out/bin/dg_gpu_realscale" reference --out "$ref" >"$out/realscale_reference.json"
  cat "$out/realscale_reference.json"
fi

bytes=$(du -sb "$out" | cut -f1)
needs="$(ldd "$out/bin/dg_gpu_realscale" | awk '/libcublas|libcudart/ {print $1}' | sort -u | paste -sd, -)"
cat >"$out/MANIFEST.json" <<JSON
{"commit": "$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet 2>/dev/null || echo "+changes")",
 "built": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "arch": "sm_$arch",
 "nvcc": "$(nvcc --version | tail -1)", "host_cpu": "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')",
 "bytes": $bytes, "shared_cuda_libraries_needed": "$needs"}
JSON
limit=$((60 * 1024 * 1024))
say "folder $out: $((bytes / 1048576)) MiB (limit 60 MiB); the target needs: ${needs:-nothing beyond the driver}"
if [ "$bytes" -gt "$limit" ]; then
  echo "gpu-build.sh: $out is $bytes bytes, over the 60 MiB a carried folder may take" >&2
  exit 1
fi

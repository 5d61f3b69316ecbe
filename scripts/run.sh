#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's main command: installs what is missing, builds dgemma, and generates with the
# bundled model, showing the canvas denoise live. Extra arguments go to `dgemma generate`
# (for example --chat --prompt "..."); the model is always the bundled one (for another, run
# build/examples/dgemma generate --model DIR).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh"
build="${DG_BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target dgemma
model="$root/models/dg-tiny-tasks"
if [ "$#" -eq 0 ]; then
  # A task the bundled model was trained on; the view delay makes its fast denoising watchable.
  set -- --chat --prompt "Sort ascending: 93 44 60 89 20" --view-delay 120
fi
exec "$build/examples/dgemma" generate --model "$model" "$@"

#!/usr/bin/env bash
# Creates tools/reference/.venv with the pinned reference packages (PyPI only).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ ! -x "$here/.venv/bin/python" ]; then
  python3 -m venv "$here/.venv"
fi
"$here/.venv/bin/pip" install -q -r "$here/requirements.txt"
echo "reference environment ready: $here/.venv"

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs tests/serve/openai_test.py (the official openai client against `dgemma serve`) in its own
# small virtual environment, created and filled from tests/serve/requirements.txt on first use.
# Exits 77 (ctest: skipped) with the reason when Python, venv or PyPI are not available.
#   run_openai_test.sh DGEMMA MODEL_DIR VENV_DIR
set -uo pipefail
dgemma="$1" model="$2" venv="$3"
here="$(cd "$(dirname "$0")" && pwd)"
skip() { echo "SKIPPED: $*"; exit 77; }
command -v python3 >/dev/null || skip "python3 is not installed"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >/dev/null 2>&1 || { rm -rf "$venv"; skip "python3 -m venv failed (Debian: apt-get install python3-venv)"; }
fi
if ! "$venv/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$(sed -n 's/^openai==//p' "$here/requirements.txt")')" 2>/dev/null; then
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt" >"$venv.pip.log" 2>&1 ||
    skip "could not install tests/serve/requirements.txt from PyPI (see $venv.pip.log)"
fi
log="$(mktemp)"
"$dgemma" serve --model "$model" --host 127.0.0.1 --port 0 --threads 1 --api-key sk-openai-test 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
port=""
for _ in $(seq 1 600); do
  port="$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log")"
  [ -n "$port" ] && break
  kill -0 $pid 2>/dev/null || { cat "$log"; echo "dgemma serve exited at start"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { cat "$log"; echo "dgemma serve did not start"; exit 1; }
"$venv/bin/python" "$here/openai_test.py" "http://127.0.0.1:$port/v1" sk-openai-test "$(basename "$model")"
rc=$?
kill -TERM $pid
wait $pid
src=$?
trap - EXIT
rm -f "$log"
[ $src -eq 0 ] || { echo "dgemma serve exited with $src after SIGTERM"; exit 1; }
exit $rc

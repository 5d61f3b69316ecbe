#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian packages the build and tests need, if they are missing. Idempotent; uses
# sudo when not root. The CUDA toolkit is not installed here: nvcc is used when /usr/local/cuda has it.
set -euo pipefail
packages=(build-essential cmake git pkgconf libeigen3-dev nlohmann-json3-dev libcpp-httplib-dev catch2 clang libclang-rt-14-dev libomp-14-dev valgrind)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing: ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"

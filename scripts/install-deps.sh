#!/usr/bin/env bash
# Installs the Debian packages packpipe builds and tests with; installs only what is missing.
set -euo pipefail
pkgs=(cmake make g++ clang libclang-rt-14-dev pkg-config
      libtbb-dev libzstd-dev zstd libxxhash-dev pybind11-dev catch2 libbenchmark-dev
      nlohmann-json3-dev libcli11-dev libfmt-dev python3-dev python3-numpy python3-pytest python3-torch python3-matplotlib)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

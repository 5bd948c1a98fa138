#!/usr/bin/env bash
# Builds packpipe on the lent GPU machine, which has CUDA, CMake, Python with torch and pybind11 but
# no network and none of packpipe's Debian libraries. Here (with network): download the Debian
# packages into .device/debs (ignored by git; carried to the machine with the run). There: unpack
# them into a prefix with dpkg -x (never over /) and build against it with CUDA and NCCL on.
#
#   scripts/gpu-prefix.sh download              # here: .device/debs/*.deb
#   scripts/gpu-prefix.sh build [BUILD_DIR]     # there: .device/prefix, then the device check's build step
#   scripts/gpu-prefix.sh env                   # there: the LD_LIBRARY_PATH line for running the build
#
# The build is the device check's (scripts/device_check.py, step 'build'): it unpacks the packages,
# finds nvcc, NCCL (the nvidia-nccl wheel beside torch first) and pybind11, and configures Release
# with CUDA (sm_90) and NCCL on. scripts/device-check.sh runs it and everything after it (DEVICE.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/.device"
debs="$dir/debs"
prefix="$dir/prefix"
# Headers and CMake packages packpipe builds with, and the shared libraries they pull in: TBB's CMake
# package checks that every library it names exists (tbbbind too); pkgconf for xxhash's .pc file on a
# machine without pkg-config.
pkgs=(libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 libzstd-dev libzstd1 libxxhash-dev libxxhash0 catch2
      libbenchmark-dev libbenchmark1debian nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9 pkgconf-bin libpkgconf3)

ignore_device_dir() {
  local exclude
  exclude=$(cd "$root" && git rev-parse --git-path info/exclude 2> /dev/null) || return 0
  [[ $exclude = /* ]] || exclude="$root/$exclude"
  mkdir -p "$(dirname "$exclude")"
  grep -qsx '/.device/' "$exclude" || echo '/.device/' >> "$exclude"
}

case "${1:-}" in
  download)
    ignore_device_dir
    mkdir -p "$debs"
    (cd "$debs" && apt-get download "${pkgs[@]}" 2> >(grep -v '^W: Download is performed unsandboxed' >&2))
    echo "gpu-prefix: $(ls "$debs" | wc -l) packages in $debs ($(du -sh "$debs" | cut -f1)); carry .device with the run"
    ;;
  build)
    [[ -d $debs ]] || { echo "gpu-prefix: $debs missing (run 'scripts/gpu-prefix.sh download' with network)" >&2; exit 1; }
    exec "$root/scripts/device-check.sh" --steps environment,build --build-dir "$root/${2:-build-device}"
    ;;
  env)
    echo "export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    ;;
  *)
    sed -n '2,13p' "$0" >&2
    exit 2
    ;;
esac

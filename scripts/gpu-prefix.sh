#!/usr/bin/env bash
# Builds packpipe on the lent GPU machine, which has CUDA, CMake, Python with torch and pybind11 but
# no network and none of packpipe's Debian libraries. Here (with network): download the Debian
# packages into .device/debs (ignored by git; carried to the machine with the run). There: unpack
# them into a prefix with dpkg -x (never over /) and build against it with CUDA and NCCL on.
#
#   scripts/gpu-prefix.sh download              # here: .device/debs/*.deb
#   scripts/gpu-prefix.sh build [BUILD_DIR]     # there: .device/prefix, then cmake with CUDA/NCCL ON
#   scripts/gpu-prefix.sh env                   # there: the LD_LIBRARY_PATH line for running the build
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/.device"
debs="$dir/debs"
prefix="$dir/prefix"
# Headers and CMake packages packpipe builds with, and the shared libraries they pull in.
pkgs=(libtbb-dev libtbb12 libtbbmalloc2 libzstd-dev libzstd1 libxxhash-dev libxxhash0 catch2 libbenchmark-dev
      libbenchmark1debian nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9)

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
    build=${2:-build-gpu}
    [[ -d $debs ]] || { echo "gpu-prefix: $debs missing (run 'scripts/gpu-prefix.sh download' with network)" >&2; exit 1; }
    mkdir -p "$prefix"
    for d in "$debs"/*.deb; do dpkg -x "$d" "$prefix"; done
    py=$(command -v python3)
    extra=()
    if pybind_dir=$("$py" -m pybind11 --cmakedir 2> /dev/null); then extra+=("-Dpybind11_DIR=$pybind_dir"); fi
    export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    cmake -S "$root" -B "$root/$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix/usr" \
      -DPACKPIPE_PYTHON_EXECUTABLE="$py" -DPACKPIPE_WITH_CUDA=ON -DPACKPIPE_WITH_NCCL=ON "${extra[@]}"
    cmake --build "$root/$build" -j"$(nproc)"
    ;;
  env)
    echo "export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    ;;
  *)
    sed -n '2,9p' "$0" >&2
    exit 2
    ;;
esac

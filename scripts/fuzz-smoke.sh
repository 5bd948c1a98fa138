#!/usr/bin/env bash
# Runs every fuzz target of a fuzzer build for a short time, seeded from tests/fuzz/corpus/<name>.
set -euo pipefail
build=${1:-build-sanitize}
seconds=${2:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
shopt -s nullglob
targets=("$build"/fuzz_*)
if ((${#targets[@]} == 0)); then
  echo "fuzz-smoke: no fuzz targets in $build" >&2
  exit 1
fi
for t in "${targets[@]}"; do
  name=$(basename "$t")
  work=$(mktemp -d)
  seeds="$root/tests/fuzz/corpus/${name#fuzz_}"
  [[ -d $seeds ]] && cp -r "$seeds"/. "$work"/
  echo "fuzz-smoke: $name for ${seconds}s"
  "$t" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 "$work" 2>&1 | tail -n 12
  rm -rf "$work"
done
echo "fuzz-smoke: ${#targets[@]} passed, 0 failed"

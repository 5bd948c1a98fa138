#!/usr/bin/env bash
# The demo: the embedded multi-task dataset (data/demo) inspected, verified and sampled into
# global batches with the built CLI.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
pp="$build/packpipe"
manifest="$root/data/demo/manifest.json"
[[ -x $pp ]] || { echo "demo: $pp not built (run 'make build')" >&2; exit 1; }
[[ -f $manifest ]] || { echo "demo: $manifest missing (rebuild with scripts/demo-data/build.sh)" >&2; exit 1; }

echo "== packpipe demo: embedded multi-task dataset =="
"$pp" dataset info "$manifest"
echo
echo "== consistency check of every dataset =="
"$pp" dataset verify "$manifest"
echo
echo "== first global batches (64K-token budget, seed 1234, 4 data-parallel ranks) =="
"$pp" dataset sample "$manifest" --global-batch-tokens 65536 --batches 4 --dp 4

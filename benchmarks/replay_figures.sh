#!/usr/bin/env bash
# Replay of the demo's plans on threads (packpipe run --replay): the measured makespan against the
# simulated one at several time scales, the median of R runs each, and the executor's overhead per
# instruction. Scale 1 is real duration (ops of tens to hundreds of ms, a few iterations); smaller
# scales shorten every op, so per-message latencies weigh more.
#   benchmarks/replay_figures.sh [build] [runs]
set -euo pipefail
build=${1:-build}
runs=${2:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
pp="$build/packpipe"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$pp" plan --manifest "$root/data/demo/manifest.json" --model gpt-6.7b --device A100-40GB --stages 4 \
  --layers-per-stage 4 --global-batch-tokens 65536 --seed 1234 --no-baselines --out "$tmp/demo.plan" --json > /dev/null
printf '%-7s %10s %6s %12s %12s %10s %12s\n' scale iterations runs measured_s simulated_s ratio_p50 overhead_us
for spec in "1:3" "0.1:8" "0.01:0"; do
  scale=${spec%%:*}
  iters=${spec##*:}
  args=(--replay --time-scale "$scale" --json)
  [[ $iters -gt 0 ]] && args+=(--iterations "$iters")
  for ((k = 0; k < runs; ++k)); do
    "$pp" run "$tmp/demo.plan" "${args[@]}" > "$tmp/run$k.json"
  done
  /usr/bin/python3 - "$tmp" "$runs" "$scale" <<'PY'
import json, statistics, sys
d, n, scale = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rs = [json.load(open(f"{d}/run{k}.json")) for k in range(n)]
ratio = statistics.median(r["measured_ms"] / r["simulated_ms"] for r in rs)
m = statistics.median(r["measured_ms"] for r in rs) / 1e3
s = rs[0]["simulated_ms"] / 1e3
o = statistics.median(r["overhead_ns_per_instruction"] for r in rs) / 1e3
print(f"{scale:7s} {rs[0]['iterations']:10d} {n:6d} {m:12.3f} {s:12.3f} {ratio:10.4f} {o:12.3f}")
PY
done

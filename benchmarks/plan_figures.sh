#!/usr/bin/env bash
# Simulated speed-up of packpipe's plans over the fixed and packing baselines, and planning time
# per iteration, with DynaPipe's profiled GPT-6.7B and T5-11B cost models at 4 and 8 stages, on
# the embedded multi-task data (64K-token global batches). Planning time is measured with one
# planning thread (the work of one iteration; more threads plan more iterations at once but share
# the cores, which inflates each one's wall time).
#   benchmarks/plan_figures.sh [build] [iterations]
set -euo pipefail
build=${1:-build}
iters=${2:-0}
root=$(cd "$(dirname "$0")/.." && pwd)
fx=$(cd "$root/../shared/fixtures/dynapipe/derived_from_cost_models_pkl" && pwd)
pp="$build/packpipe"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--manifest "$root/data/demo/manifest.json" --global-batch-tokens 65536 --device A100-40GB --memory-mb 36000
      --seed 1234 --json --threads 1)
[[ $iters -gt 0 ]] && args+=(--iterations "$iters")
printf '%-9s %6s %10s %10s %10s %9s %9s %12s %12s\n' model stages packpipe_s fixed_s packing_s vs_fixed vs_pack \
  plan_ms_p50 plan_ms_p90
for model in gpt t5; do
  for stages in 4 8; do
    if [[ $model == gpt ]]; then
      m=(--model gpt-6.7b --profile "$fx/gpt_6.7b_timing.csv" --profile "$fx/gpt_6.7b_activation.csv"
         --layers-per-stage $((16 / stages)))
    else
      m=(--model t5-11b --profile "$fx/t5_11b_timing.csv" --profile "$fx/t5_11b_activation.csv"
         --layers-per-stage $((24 / stages)))
    fi
    "$pp" plan "${args[@]}" "${m[@]}" --stages "$stages" > "$tmp/r.json"
    /usr/bin/python3 - "$tmp/r.json" "$model" "$stages" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); t = j["total"]
def s(k): return t[k]["time_s"] if "time_s" in t.get(k, {}) else float("nan")
def x(k): return t[k]["speedup_of_packpipe"] if "speedup_of_packpipe" in t.get(k, {}) else float("nan")
print(f"{sys.argv[2]:9s} {sys.argv[3]:>6s} {s('packpipe'):10.2f} {s('fixed'):10.2f} {s('packing'):10.2f} "
      f"{x('fixed'):8.2f}x {x('packing'):8.2f}x {t['planning_ms']['median']:12.2f} {t['planning_ms']['p90']:12.2f}")
PY
  done
done

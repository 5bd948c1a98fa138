#!/usr/bin/env bash
# Simulated speed-up of packpipe's plans over the best baseline (each family at its best setting for
# the run), over varlen packing and over DynaPipe's dense packing, and planning time per iteration
# (with the baselines' report), with DynaPipe's profiled GPT-6.7B and T5-11B cost models at 4 and 8 stages, on
# the embedded multi-task data (64K-token global batches). Planning time is measured with one
# planning thread (the work of one iteration; more threads plan more iterations at once but share
# the cores, which inflates each one's wall time). The baselines are reported as their systems run
# them (1F1B over their order); extra arguments go to `packpipe plan`, e.g. --baseline-schedule
# search for the report under packpipe's schedule search.
#   benchmarks/plan_figures.sh [build] [iterations] [plan arguments...]
set -euo pipefail
build=${1:-build}
iters=${2:-0}
extra=("${@:3}")
root=$(cd "$(dirname "$0")/.." && pwd)
fx=$(cd "$root/../shared/fixtures/dynapipe/derived_from_cost_models_pkl" && pwd)
pp="$build/packpipe"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--manifest "$root/data/demo/manifest.json" --global-batch-tokens 65536 --device A100-40GB --memory-mb 36000
      --seed 1234 --json --threads 1)
[[ $iters -gt 0 ]] && args+=(--iterations "$iters")
printf '%-9s %6s %10s %-38s %8s %8s %8s %12s %12s\n' model stages packpipe_s best_baseline vs_best vs_varlen \
  vs_dense plan_ms_p50 plan_ms_p90
for model in gpt t5; do
  for stages in 4 8; do
    if [[ $model == gpt ]]; then
      m=(--model gpt-6.7b --profile "$fx/gpt_6.7b_timing.csv" --profile "$fx/gpt_6.7b_activation.csv"
         --layers-per-stage $((16 / stages)))
    else
      m=(--model t5-11b --profile "$fx/t5_11b_timing.csv" --profile "$fx/t5_11b_activation.csv"
         --layers-per-stage $((24 / stages)))
    fi
    "$pp" plan "${args[@]}" "${m[@]}" --stages "$stages" "${extra[@]}" > "$tmp/r.json"
    /usr/bin/python3 - "$tmp/r.json" "$model" "$stages" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); t = j["total"]; b = t.get("baselines", {})
def x(k): return b[k]["speedup_of_packpipe"] if b.get(k, {}).get("feasible") else float("nan")
best = t.get("best_baseline", {})
print(f"{sys.argv[2]:9s} {sys.argv[3]:>6s} {t['packpipe']['time_s']:10.2f} {best.get('setting', '-'):38s} "
      f"{best.get('speedup_of_packpipe', float('nan')):7.3f}x {x('packing'):7.3f}x {x('packing-mask'):7.3f}x "
      f"{t['planning_ms']['median']:12.2f} {t['planning_ms']['p90']:12.2f}")
PY
  done
done

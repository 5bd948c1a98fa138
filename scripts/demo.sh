#!/usr/bin/env bash
# The demo: plan every iteration of the embedded multi-task dataset (data/demo) with the default
# analytic cost model, and show the report, the plan file and the trace of iteration 0.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
pp="$build/packpipe"
manifest="$root/data/demo/manifest.json"
out="$build/demo"
[[ -x $pp ]] || { echo "demo: $pp not built (run 'make build')" >&2; exit 1; }
[[ -f $manifest ]] || { echo "demo: $manifest missing (rebuild with scripts/demo-data/build.sh)" >&2; exit 1; }
mkdir -p "$out"

echo "== the embedded multi-task dataset =="
"$pp" dataset info "$manifest"
"$pp" dataset verify "$manifest" > /dev/null && echo "  (every dataset verified)"
echo
echo "== packpipe plan: GPT-6.7B (16 layers) on 4 x A100-40GB stages, 64K-token global batches =="
"$pp" plan --manifest "$manifest" --model gpt-6.7b --device A100-40GB --stages 4 --layers-per-stage 4 \
  --global-batch-tokens 65536 --seed 1234 --out "$out/demo.plan" --report "$out/report.json" \
  --chrome-trace "$out/trace.json"
echo
echo "  report (JSON): $out/report.json"
echo "  inspect a plan: $pp plan inspect $out/demo.plan --iteration 0 --rank 0"
echo
echo "== long-context mixture: the short tasks beside whole manual pages (data/demo/long.json, 257 to 8,190 tokens) =="
# packpipe may cut a long page into slices that pipeline with exact attention (each slice attends to
# the earlier ones' kept keys and values), packed beside short samples; the baselines include
# Seq1F1B-like fixed-length slicing and varlen packing at the context length.
"$pp" plan --manifest "$root/data/demo/long.json" --model gpt-6.7b --device A100-40GB --stages 4 \
  --layers-per-stage 4 --global-batch-tokens 65536 --seed 1234 --iterations 16 --out "$out/long.plan" \
  --report "$out/long-report.json" | sed -n '/simulated time of/,$p'
echo
echo "== packpipe run --replay: execute the plans with no model (ops at 1/100 of their planned duration) =="
"$pp" run "$out/demo.plan" --replay --time-scale 0.01 --trace "$out/replay-trace.json"
echo
echo "== packpipe.torch: train a small GPT for real on CPU, 2 pipeline ranks over gloo, packpipe's plans =="
# Each rank plans every iteration with packpipe (the same plans on both), loads its tensors and runs
# its rank of the plan on the executor; the last rank prints loss, tokens/s, measured and predicted time.
if /usr/bin/python3 -c 'import torch' 2> /dev/null; then
  PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 -m packpipe.torch.run --nproc-per-node 2 \
    --timeout 300 "$root/examples/train_gpt.py" --manifest "$manifest" --pp 2 --dp 1 --iterations 16 \
    --global-batch-tokens 2048
else
  echo "demo: torch is missing (scripts/install-deps.sh installs python3-torch)" >&2
  exit 1
fi

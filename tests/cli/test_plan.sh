#!/usr/bin/env bash
# End-to-end test of the planning job: `packpipe plan` on the embedded demo data, then the plan
# file read back, validated and exported.
# Usage: test_plan.sh PACKPIPE_BINARY FIXTURES_DIR
set -euo pipefail
pp=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
py=/usr/bin/python3

"$pp" plan --help | grep "global-batch-tokens" > /dev/null || fail "plan --help"

# Plan 3 iterations of the demo manifest with 2 data-parallel replicas; validate every plan.
"$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 32768 --iterations 3 \
  --stages 4 --dp 2 --layers-per-stage 4 --validate --out "$tmp/demo.plan" --chrome-trace "$tmp/trace.json" \
  --baseline-mbs 1 4 --json > "$tmp/report.json"
$py - "$tmp/report.json" "$tmp/trace.json" <<'PY' || fail "report or trace"
import json, sys
r = json.load(open(sys.argv[1]))
assert len(r["iterations"]) == 3, r["iterations"]
t = r["total"]
assert t["iterations"] == 3 and t["samples"] == sum(i["samples"] for i in r["iterations"])
for it in r["iterations"]:
    p = it["packpipe"]
    assert p["feasible"] and p["iteration_ms"] > 0 and 0 < p["efficiency"] <= 1, p
    assert len(p["peak_mb"]) == 4
    assert it["planning_ms"] >= it["partition_ms"]
for b in ("fixed", "packing"):
    assert t[b]["mbs"] in (1, 4), t[b]
    assert abs(t[b]["speedup_of_packpipe"] - t[b]["time_s"] / t["packpipe"]["time_s"]) < 1e-9
tr = json.load(open(sys.argv[2]))
events = [e for e in tr["traceEvents"] if e.get("ph") == "X"]
assert events and all("ts" in e and "dur" in e for e in events)
assert {e["tid"] for e in events} == {0, 1, 2, 3}
PY

# The plan file: 3 iterations x 2 replicas, valid; inspect one rank; exports.
"$pp" plan validate "$tmp/demo.plan" > /dev/null || fail "plan validate"
"$pp" plan inspect "$tmp/demo.plan" --iteration 1 --rank 2 --json > "$tmp/inspect.json"
$py -c "import json,sys; json.load(open(sys.argv[1]))" "$tmp/inspect.json" || fail "inspect json"
"$pp" plan inspect "$tmp/demo.plan" --iteration 2 --replica 1 --json > "$tmp/inspect1.json"
$py -c "import json,sys; j=json.load(open(sys.argv[1])); assert (j['iteration'], j['replica']) == (2, 1), j" \
  "$tmp/inspect1.json" || fail "inspect replica 1"
"$pp" plan export "$tmp/demo.plan" --iteration 0 --chrome-trace "$tmp/t2.json" > /dev/null || fail "export trace"

# Same inputs, same plans: byte-identical files.
"$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 32768 --iterations 3 \
  --stages 4 --dp 2 --layers-per-stage 4 --out "$tmp/again.plan" --no-baselines --threads 1 > /dev/null
cmp "$tmp/demo.plan" "$tmp/again.plan" || fail "plans differ between runs"

# Bad input: a sample that no micro-batch can hold names itself; a missing manifest.
if "$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 65536 --iterations 1 \
     --memory-mb 20000 --layers-per-stage 8 2> "$tmp/err.txt" > /dev/null; then
  fail "an impossible memory limit was accepted"
fi
grep "sample" "$tmp/err.txt" > /dev/null || fail "no sample named: $(cat "$tmp/err.txt")"
if "$pp" plan --manifest "$tmp/nope.json" --global-batch-tokens 1000 2> /dev/null; then fail "missing manifest accepted"; fi
echo "cli plan tests: ok"

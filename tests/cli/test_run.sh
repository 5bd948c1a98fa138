#!/usr/bin/env bash
# packpipe run PLANFILE --replay: plans of the demo data executed on threads with no model, every
# payload checked; the report and trace; errors name what is wrong, and outputs never clobber inputs.
# Usage: test_run.sh PACKPIPE_BINARY FIXTURES_DIR
set -euo pipefail
pp=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
py=/usr/bin/python3
err() {  # err PATTERN ARGS...: the command fails with a message matching PATTERN, no crash
  local pat=$1; shift
  if "$pp" "$@" > "$tmp/out" 2> "$tmp/err"; then fail "expected an error: $*"; fi
  local rc=$?
  [[ $rc -lt 128 ]] || fail "crashed ($rc): $*"
  grep -E -q -- "$pat" "$tmp/err" || { cat "$tmp/err" >&2; fail "expected /$pat/: $*"; }
}

"$pp" run --help | grep -q -- "--replay" || fail "run --help"

# Two data-parallel replicas and two schedules: every plan runs to its end.
for sched in search zero-bubble; do
  "$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 16384 --iterations 3 --stages 4 --dp 2 \
    --layers-per-stage 4 --schedule "$sched" --no-baselines --out "$tmp/$sched.plan" > /dev/null
  "$pp" run "$tmp/$sched.plan" --replay --time-scale 0 --payload-bytes 512 --trace "$tmp/$sched.trace.json" --json \
    > "$tmp/$sched.run.json"
  $py - "$tmp/$sched.run.json" "$tmp/$sched.trace.json" <<'PY' || fail "run report or trace ($sched)"
import json, sys
r = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2]))
assert r["iterations"] == 3 and r["ranks"] == 4 and r["dp"] == 2, r
assert len(r["plans"]) == 6 and {p["replica"] for p in r["plans"]} == {0, 1}
assert r["instructions"] > 0 and r["measured_ms"] > 0
# time scale 0: nothing simulated to compare with, so no ratio (the per-plan median read 0.0)
assert r["measured_over_simulated"] is None and r["median_ratio_per_plan"] is None, r
names = {e["args"]["name"] for e in t["traceEvents"] if e["name"] == "process_name"}
assert names == {"measured", "planned (simulated)"}, names
ops = [e for e in t["traceEvents"] if e.get("ph") == "X" and e["pid"] == 0 and e["cat"] in "FBIW"]
planned = [e for e in t["traceEvents"] if e.get("ph") == "X" and e["pid"] == 1]
assert len(ops) == len(planned) > 0, (len(ops), len(planned))
PY
done

# Timed replay: the measured makespan is at least the simulated one (ops wait their planned time).
"$pp" run "$tmp/search.plan" --replay --time-scale 0.002 --iterations 1 --json > "$tmp/timed.json"
$py -c "
import json; r = json.load(open('$tmp/timed.json'))
assert r['simulated_ms'] > 0 and r['measured_ms'] >= 0.95 * r['simulated_ms'], r
assert set(r['compute_ops']) <= set('FBIW') and r['compute_ops'], r
" || fail "timed replay"
"$pp" run "$tmp/search.plan" --replay --time-scale 0 --iterations 1 | grep -q "executor overhead" || fail "text report"

# Errors.
err "needs --replay" run "$tmp/search.plan"
err "transport: .*not in" run "$tmp/search.plan" --replay --transport carrier-pigeon
err "time-scale" run "$tmp/search.plan" --replay --time-scale -1
err "no plan at or after iteration 99" run "$tmp/search.plan" --replay --first-iteration 99
err "needs --rank|--rank" run "$tmp/search.plan" --replay --transport nccl
# An invalid plan is refused once, naming the file, the iteration and its violations, before any rank starts
# (each rank's executor refused it too: the violations were listed once per rank)
"$pp" plan inspect "$tmp/search.plan" --iteration 0 --replica 0 --json > "$tmp/it0.json"
$py -c "import json,sys; j=json.load(open(sys.argv[1])); j['global_tokens']=0; json.dump(j, open(sys.argv[2],'w'))" \
  "$tmp/it0.json" "$tmp/bad0.json"
err "bad0.json: iteration 0, replica 0: refusing to run an invalid plan" run "$tmp/bad0.json" --replay --time-scale 0
[[ $(grep -c "global_tokens" "$tmp/err") -eq 1 ]] || fail "violations listed more than once: $(cat "$tmp/err")"
# nccl's options under another transport, which runs every rank and replica: refused, not ignored
err "--rank is for --transport nccl" run "$tmp/search.plan" --replay --rank 7
err "--replica is for --transport nccl" run "$tmp/search.plan" --replay --replica 5
err "CUDA|cuda" run "$tmp/search.plan" --replay --transport cuda --device 7
cp "$tmp/search.plan" "$tmp/copy.plan"
err "is one of (its|the) inputs|input" run "$tmp/copy.plan" --replay --trace "$tmp/copy.plan"
cmp -s "$tmp/search.plan" "$tmp/copy.plan" || fail "the plan file was clobbered by --trace"
head -c 200 "$tmp/search.plan" > "$tmp/cut.plan"
err "cut.plan" run "$tmp/cut.plan" --replay

# Floating options are range-checked as doubles: never cast to an integer first (1e300), never
# rounded into range (-0.5).
err "--timeout: must be in \[0, 1000000000\] \(0: forever\), found 1e300" run "$tmp/search.plan" --replay --timeout 1e300
err "--timeout: must be in .*found -0.5" run "$tmp/search.plan" --replay --timeout -0.5
err "--time-scale: must be in .*found 1e7" run "$tmp/search.plan" --replay --time-scale 1e7
err "--timeout" run "$tmp/search.plan" --replay --timeout 12abc
# A rank times out while another replays an op scaled to hours: the abort reaches the sleeping op, and every
# rank ends soon after the timeout (it slept to the op's end: killed after 60 s), naming the first failure.
start=$(date +%s)
rc=0
timeout 120 "$pp" run "$tmp/search.plan" --replay --time-scale 100000 --timeout 1 > /dev/null 2> "$tmp/err" || rc=$?
[[ $rc -ne 0 ]] || fail "a run past its timeout succeeded"
[[ $rc -ne 124 ]] || fail "run --timeout 1 hung in a scaled op (killed after 120 s)"
(( $(date +%s) - start < 60 )) || fail "run --timeout 1 took $(( $(date +%s) - start )) s to end"
grep -q "stopped: the pipeline was aborted: .* timed out after 1 s" "$tmp/err" || fail "abort: $(cat "$tmp/err")"

echo OK

#!/usr/bin/env bash
# End-to-end tests of `packpipe plan inspect|validate|export` on plan files written through the
# Python module (synthetic plans).
# Usage: test_plan_file.sh PACKPIPE_BINARY FIXTURES_DIR
set -euo pipefail
pp=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
py=/usr/bin/python3
export PYTHONPATH="$(dirname "$pp")/python${PYTHONPATH:+:$PYTHONPATH}"

for sub in inspect validate export; do
  "$pp" plan "$sub" --help > "$tmp/out" || fail "plan $sub --help"
  grep -q "Usage" "$tmp/out" || fail "plan $sub --help"
done

# Write a plan file of 4 iterations, one JSON plan, one plan with one shape, one broken plan.
$py - "$tmp" <<'PY' || fail "writing plan files"
import json, sys
import packpipe, packpipe._testing
d = sys.argv[1]
with packpipe.PlanFileWriter(f"{d}/e.plans", compress=True) as w:
    for s in range(4):
        w.append(packpipe._testing.synthetic_plan("zero-bubble", ranks=4, chunks=2, microbatches=8, seed=10 + s))
open(f"{d}/one.json", "w").write(packpipe._testing.synthetic_plan("gpipe", ranks=2, microbatches=3, seed=1).to_json())
with packpipe.PlanFileWriter(f"{d}/same.plans") as w:
    w.append(packpipe._testing.synthetic_plan("1f1b", ranks=4, microbatches=8, seed=5, same_shape=True))
j = json.loads(packpipe._testing.synthetic_plan("1f1b", ranks=2, microbatches=3, seed=2).to_json())
s = j["streams"][1]
del s[next(i for i, x in enumerate(s) if x["op"] == "RECV_ACT_START")]
open(f"{d}/bad.json", "w").write(json.dumps(j))
PY

# inspect: text and JSON, by iteration and rank
"$pp" plan inspect "$tmp/e.plans" --iteration 12 > "$tmp/out" || fail "inspect text"
grep -q "schedule zero-bubble, 4 ranks, 8 virtual stages" "$tmp/out" || fail "inspect text"
"$pp" plan inspect "$tmp/e.plans" --iteration 12 --rank 2 > "$tmp/out" || fail "inspect --rank"
grep -q "rank 2: " "$tmp/out" || fail "inspect --rank"
"$pp" plan inspect "$tmp/e.plans" --iteration 13 --json > "$tmp/i.json"
"$pp" plan inspect "$tmp/e.plans" --iteration 13 --rank 1 --json > "$tmp/r.json"
$py - "$tmp" <<'PY' || fail "inspect --json"
import json, sys
d = sys.argv[1]
j = json.load(open(f"{d}/i.json"))
assert j["iteration"] == 13 and j["ranks"] == 4 and len(j["streams"]) == 4, j.keys()
r = json.load(open(f"{d}/r.json"))
assert r["rank"] == 1 and r["stream"] == j["streams"][1]
PY
if "$pp" plan inspect "$tmp/e.plans" --iteration 99 2> "$tmp/err"; then fail "missing iteration accepted"; fi
grep -q "no plan for iteration 99" "$tmp/err" || fail "missing iteration message"

# validate: every plan; JSON; exit 1 with the violations listed
"$pp" plan validate "$tmp/e.plans" > "$tmp/out" || fail "validate ok"
grep -q "4 plans checked, 0 invalid" "$tmp/out" || fail "validate ok"
"$pp" plan validate "$tmp/one.json" --json > "$tmp/v.json"
$py -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['valid'] and j['plans'] == 1" "$tmp/v.json" || fail "validate --json"
set +e
"$pp" plan validate "$tmp/bad.json" > "$tmp/bad.txt"; rc=$?
set -e
[ "$rc" = 1 ] || fail "validate of a broken plan exits $rc, expected 1"
grep -q "\[channel\]" "$tmp/bad.txt" || fail "channel violation listed"
grep -q "rank 1" "$tmp/bad.txt" || fail "violation names the rank"

# export: PyTorch CSV for one shape; refusal otherwise
"$pp" plan export "$tmp/same.plans" --pytorch-csv "$tmp/s.csv" > "$tmp/out" || fail "export csv"
grep -q "wrote" "$tmp/out" || fail "export csv"
$py - "$tmp/s.csv" <<'PY' || fail "csv grammar"
import re, sys
rows = [l.split(",") for l in open(sys.argv[1]).read().splitlines()]
assert len(rows) == 4
for r, row in enumerate(rows):
    for cell in row:
        m = re.fullmatch(r"(\d+)(F|I|B|W)(\d+)", cell.strip())
        assert m, cell
        assert int(m.group(1)) % 4 == r
PY
if "$pp" plan export "$tmp/e.plans" --iteration 10 --pytorch-csv "$tmp/x.csv" 2> "$tmp/err"; then fail "export of varying shapes accepted"; fi
grep -q "one shape" "$tmp/err" || fail "refusal names the reason"
if "$pp" plan export "$tmp/e.plans" 2> "$tmp/err"; then fail "export without output accepted"; fi

# export: Chrome trace of the simulated timeline
"$pp" plan export "$tmp/e.plans" --iteration 11 --chrome-trace "$tmp/t.json" > "$tmp/out" || fail "export trace"
"$pp" plan export "$tmp/e.plans" --iteration 11 --chrome-trace "$tmp/t2.json" --json > "$tmp/export.json" \
  || fail "export --json"
$py -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['iteration'] == 11 and j['chrome_trace'].endswith('t2.json'), j" \
  "$tmp/export.json" || fail "export --json: $(cat "$tmp/export.json")"
# an index typed negative or past int64 is refused by name (-1 read as 'not given'; 10^20 clamped)
for bad in "inspect $tmp/e.plans --iteration -1" "validate $tmp/e.plans --iteration 99999999999999999999" \
           "inspect $tmp/e.plans --rank -1" "export $tmp/e.plans --iteration -2 --chrome-trace $tmp/t3.json"; do
  if "$pp" plan $bad > /dev/null 2> "$tmp/err"; then fail "plan $bad accepted"; fi
  grep -q "expected an integer in \[0, 2^63), found '" "$tmp/err" || fail "plan $bad: $(cat "$tmp/err")"
done
$py - "$tmp/t.json" <<'PY' || fail "trace is Chrome trace JSON with one track per rank"
import json, sys
j = json.load(open(sys.argv[1]))
ev = [e for e in j["traceEvents"] if e.get("ph") == "X"]
assert ev and all(e["dur"] >= 0 and "ts" in e for e in ev)
assert {e["tid"] for e in ev} == {0, 1, 2, 3}
PY

# replicas of one iteration: checked against each other, --iteration checks every replica
$py - "$tmp" <<'PY' || fail "writing replica files"
import json, sys
import packpipe, packpipe._testing
d = sys.argv[1]
def replicas(dup):
    js = [json.loads(packpipe._testing.synthetic_plan("1f1b", ranks=2, microbatches=3, seed=20 + k).to_json()) for k in range(2)]
    nxt, tokens, loss = 0, 0, 0
    for k, j in enumerate(js):
        j["iteration"], j["dp"], j["replica"] = 0, 2, k
        for mb in j["microbatches"]:
            mb["samples"] = list(range(nxt, nxt + len(mb["samples"])))
            mb.pop("refs", None)
            nxt += len(mb["samples"])
            tokens += mb["tokens"]
            loss += mb["loss_tokens"]
    if dup:
        js[1]["microbatches"][0]["samples"][0] = js[0]["microbatches"][0]["samples"][0]
    for j in js:
        j["global_tokens"], j["global_loss_tokens"] = tokens, loss
        for mb in j["microbatches"]:
            mb["loss_weight"] = mb["loss_tokens"] / loss
    return [packpipe.Plan.from_json(json.dumps(j)) for j in js]
for name, dup in (("dp.plans", False), ("dup.plans", True)):
    with packpipe.PlanFileWriter(f"{d}/{name}") as w:
        for p in replicas(dup):
            w.append(p)
PY
"$pp" plan validate "$tmp/dp.plans" > "$tmp/out" || fail "validate of two consistent replicas"
"$pp" plan validate "$tmp/dp.plans" --iteration 0 > "$tmp/out" || fail "validate --iteration of two replicas"
grep -q "2 plans checked" "$tmp/out" || fail "validate --iteration checks every replica: $(cat "$tmp/out")"
set +e
"$pp" plan validate "$tmp/dup.plans" --iteration 0 > "$tmp/out"; rc=$?
set -e
[ "$rc" = 1 ] || fail "a sample in two replicas: validate exits $rc, expected 1"
grep -q "\[replicas\].*also in replica 0" "$tmp/out" || fail "replica violation listed: $(cat "$tmp/out")"
# inspect --replica never shows another iteration's plan
if "$pp" plan inspect "$tmp/e.plans" --replica 1 > "$tmp/out" 2> "$tmp/err"; then fail "inspect --replica 1 of a dp 1 file accepted"; fi
grep -q "no plan for iteration 10 replica 1" "$tmp/err" || fail "inspect --replica message: $(cat "$tmp/err")"

# export refuses a plan that decodes but is inconsistent (here: timeline ops of missing micro-batches)
$py - "$tmp/badtl.json" <<'PY' || fail "writing an inconsistent timeline"
import json, sys
import packpipe, packpipe._testing
j = json.loads(packpipe._testing.synthetic_plan("1f1b", ranks=2, microbatches=3, seed=2).to_json())
j["timeline"][0][0][1] = 1000
open(sys.argv[1], "w").write(json.dumps(j))
PY
if "$pp" plan export "$tmp/badtl.json" --chrome-trace "$tmp/bt.json" 2> "$tmp/err"; then fail "export of an inconsistent plan accepted"; fi
grep -q "rank 0, timeline op 0" "$tmp/err" || fail "export refusal names the violation: $(cat "$tmp/err")"
[ ! -e "$tmp/bt.json" ] || fail "export of an inconsistent plan left a file"

# An incomplete plan file (its planning run stopped early) is trained only when asked for; a writer
# refuses at once plans that no reader could open.
$py - "$tmp" <<'PY' || fail "writing an incomplete plan file"
import sys
import packpipe, packpipe._testing
d = sys.argv[1]
with packpipe.PlanFileWriter(f"{d}/part.plans") as w:
    w.expect_iterations(10, 4)
    for s in (10, 11):
        w.append(packpipe._testing.synthetic_plan("1f1b", ranks=2, microbatches=3, seed=s))
    for skip in (11, 13):  # a repeated or a skipped iteration
        try:
            w.append(packpipe._testing.synthetic_plan("1f1b", ranks=2, microbatches=3, seed=skip))
        except ValueError as e:
            assert "appended after iteration 11" in str(e) or "replica 0 after its replica 0" in str(e), e
        else:
            raise AssertionError(f"iteration {skip} accepted after 11")
assert packpipe.PlanFileReader(f"{d}/part.plans").complete is False
PY
if "$pp" run "$tmp/part.plans" --replay --time-scale 0 2> "$tmp/err" > /dev/null; then fail "run of an incomplete file"; fi
grep -q "part.plans: incomplete plan file: it holds 2 of the 4 iterations its writer declared (iterations 10..11" \
  "$tmp/err" || fail "incomplete file message: $(cat "$tmp/err")"
grep -q "pass --allow-incomplete" "$tmp/err" || fail "the message says how to run the prefix: $(cat "$tmp/err")"
"$pp" run "$tmp/part.plans" --replay --time-scale 0 --allow-incomplete --json > "$tmp/part.json" || fail "--allow-incomplete"
$py -c "import json, sys; assert json.load(open(sys.argv[1]))['iterations'] == 2" "$tmp/part.json" || fail "ran the prefix"

# corrupt files: clear error, exit 1
head -c 100 "$tmp/e.plans" > "$tmp/cut.plans"
if "$pp" plan validate "$tmp/cut.plans" 2> "$tmp/err"; then fail "truncated file accepted"; fi
grep -q "cut.plans" "$tmp/err" || fail "error names the file"
echo "ok"

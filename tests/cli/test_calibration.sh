#!/usr/bin/env bash
# Calibration end to end: `packpipe run --measurements` records a replay slowed by a known factor,
# `costmodel calibrate` fits it (deterministically, written atomically), `costmodel validate
# --measured` compares models with it, and `--calibration` changes every command that builds a
# cost model. Bad files are refused naming the file, line and field; outputs never clobber inputs.
# Usage: test_calibration.sh PACKPIPE_BINARY FIXTURES_DIR
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

"$pp" costmodel calibrate --help | grep -q -- "--measured" || fail "calibrate --help"
"$pp" costmodel validate --help | grep -q -- "--plot-data" || fail "validate --help"
"$pp" run --help | grep -q -- "--measurements" || fail "run --help"

# A replay at 5% of the planned durations: the measured ops are 0.05 x the model.
"$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 16384 --iterations 3 --stages 4 \
  --layers-per-stage 4 --no-baselines --out "$tmp/a.plan" > /dev/null
"$pp" run "$tmp/a.plan" --replay --time-scale 0.05 --measurements "$tmp/m.jsonl" --model gpt-6.7b \
  --device-name A100-40GB --json > "$tmp/run.json"
$py - "$tmp/run.json" "$tmp/m.jsonl" <<'PY' || fail "run --measurements"
import json, sys
r = json.load(open(sys.argv[1]))
lines = [json.loads(l) for l in open(sys.argv[2])]
h = lines[0]
assert h["format"] == "packpipe-measurements" and h["version"] == 1 and h["model"] == "gpt-6.7b", h
ops = [l for l in lines[1:] if l["op"] != "iteration"]
its = [l for l in lines[1:] if l["op"] == "iteration"]
assert r["measurements"]["ops"] == len(ops) > 0, r["measurements"]
assert len(its) == 3 and all(i["measured_ms"] > 0 and i["predicted_ms"] > 0 for i in its), its
assert {o["op"] for o in ops} >= {"F", "send", "recv"}, {o["op"] for o in ops}
# each iteration line names its plan's schedule kind (what the schedule factors are fitted by)
kinds = {"gpipe", "1f1b", "interleaved-1f1b", "cyclic", "wait-free-cyclic", "zero-bubble"}
assert all(i.get("schedule") in kinds for i in its), its
PY

# calibrate: the slope is the replay's scale, errors fall, the file is written
"$pp" costmodel calibrate --measured "$tmp/m.jsonl" -o "$tmp/cal.json" --json > "$tmp/cal.report.json" \
  2> "$tmp/cal.err"
# a replay at a scale other than 1 is said to scale the model by it (the README's recipe at 0.01 fitted a
# model 100x too fast without a word)
grep -q "records a replay at --time-scale 0.05: .* scales the model by about 0.05" "$tmp/cal.err" \
  || fail "no warning on a scaled replay: $(cat "$tmp/cal.err")"
$py - "$tmp/cal.report.json" "$tmp/cal.json" <<'PY' || fail "calibrate report"
import json, sys
r = json.load(open(sys.argv[1])); c = json.load(open(sys.argv[2]))
assert c["format"] == "packpipe-calibration" and c["version"] == (2 if c["schedules"] else 1), c.keys()
assert r["base"]["fingerprint"] == c["base"]["fingerprint"] and r["base"]["model"] == "gpt-6.7b"
f = {o["op"]: o for o in r["ops"]}
# A replay's sleeps are never short, and on a busy machine they end late (woken after a core frees),
# a delay the fit may take as an intercept with a lower slope: the slope is positive and far below the
# model's 1, and the calibrated times fit (errors below). (The fit's exactness on known data is the
# C++ tests' test_calibration.cpp, which load cannot disturb.)
assert 0 < f["F"]["a"] < 0.25, f["F"]
for k in "FIW":
    if k in f:
        # the base model is off by about 1 / 0.05 - 1; calibrated, a fraction of that whatever the load
        assert 3 < f[k]["error_before"] and f[k]["error_after"] < f[k]["error_before"] / 5, f[k]
# schedule factors: a kind of at least 3 measured iterations is fitted, in range; the file holds them
lines = [json.loads(l) for l in open(sys.argv[1].replace("cal.report.json", "m.jsonl"))]
count = {}
for l in lines[1:]:
    if l["op"] == "iteration":
        count[l["schedule"]] = count.get(l["schedule"], 0) + 1
# (A kind whose measured / re-simulated median passes 2 is left out as the op fits' error, not the
# schedule's overhead: a replay's late wake-ups on a busy machine can do that, so only what load
# cannot change is asserted here; test_calibration.cpp checks the fit on known data.)
assert {x["schedule"] for x in r["schedules"]} <= {k for k, n in count.items() if n >= 3}, (r["schedules"], count)
assert all(x["iterations"] == count[x["schedule"]] and 1 <= x["factor"] <= 2 for x in r["schedules"]), r["schedules"]
assert c["schedules"] == r["schedules"]
PY
"$pp" costmodel calibrate --measured "$tmp/m.jsonl" -o "$tmp/cal.txt.json" | grep -q "error before" || fail "calibrate text"
# a measurement file given twice (here through a hard link) is refused by calibrate and validate: every op counted twice
ln "$tmp/m.jsonl" "$tmp/m.link.jsonl"
for cmd in "calibrate -o $tmp/cal.twice.json" "validate"; do
  if "$pp" costmodel $cmd --measured "$tmp/m.jsonl" "$tmp/m.link.jsonl" > /dev/null 2> "$tmp/err.txt"; then
    fail "$cmd: a file given twice accepted"
  fi
  grep -q "m.link.jsonl' are the same file" "$tmp/err.txt" || fail "$cmd twice: $(cat "$tmp/err.txt")"
done
[ ! -e "$tmp/cal.twice.json" ] || fail "calibrate wrote from a file given twice"
# An iteration line over ops of some ranks only (a merged or hand-cut file): the op fits are made,
# and the report says why the schedule factors were not.
$py - "$tmp/m.jsonl" "$tmp/partial.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
keep = [lines[0]] + [l for l in lines[1:] if not (l["op"] in "FBIW" and l["iteration"] == 0 and l["rank"] == 0)]
open(sys.argv[2], "w").write("".join(json.dumps(l) + "\n" for l in keep))
PY
"$pp" costmodel calibrate --measured "$tmp/partial.jsonl" -o "$tmp/cal.partial.json" --json > "$tmp/partial.report.json" \
  || fail "calibrate over a partly recorded iteration"
$py -c "import json, sys; r = json.load(open(sys.argv[1])); assert 'incomplete' in r['schedules_not_fitted'] and r['schedules'] == [], r.get('schedules_not_fitted')" \
  "$tmp/partial.report.json" || fail "calibrate: schedule factors not fitted, said"
# any order of the measurements: the same bytes
$py - "$tmp/m.jsonl" "$tmp/shuffled.jsonl" <<'PY'
import random, sys
lines = open(sys.argv[1]).read().splitlines()
body = lines[1:]
random.Random(5).shuffle(body)
open(sys.argv[2], "w").write("\n".join([lines[0]] + body) + "\n")
PY
"$pp" costmodel calibrate --measured "$tmp/shuffled.jsonl" -o "$tmp/cal2.json" > /dev/null
cmp -s "$tmp/cal.json" "$tmp/cal2.json" || fail "calibration depends on the order of the measurements"

# validate --measured: per-op and per-iteration errors, before and after calibration, plot data
"$pp" costmodel validate --measured "$tmp/m.jsonl" --json > "$tmp/v0.json"
"$pp" costmodel validate --measured "$tmp/m.jsonl" --calibration "$tmp/cal.json" --plot-data "$tmp/plot.json" \
  --json > "$tmp/v1.json"
$py - "$tmp/v0.json" "$tmp/v1.json" "$tmp/plot.json" <<'PY' || fail "validate --measured"
import json, sys
v0, v1, p = (json.load(open(f)) for f in sys.argv[1:4])
assert v0["iterations_compared"] == 3 and len(v1["iterations"]) == 3, v1
# 20x too slow before; after, within the jitter of a short replay (threads woken late on a busy machine)
assert v0["iteration_median_abs"] > 3, v0["iteration_median_abs"]
assert v1["iteration_median_abs"] < 0.2 * v0["iteration_median_abs"], (v0["iteration_median_abs"], v1["iteration_median_abs"])
assert "calibrated by" in v1["cost_model"] and "calibrated" not in v0["cost_model"]
assert {o["op"] for o in v1["ops"]} >= {"F", "send", "recv"}
assert p["format"] == "packpipe-validation-plot" and p["version"] == 1
for o in p["ops"]:
    assert len(o["tokens"]) == len(o["predicted_ms"]) == len(o["measured_ms"]) > 0, o["op"]
assert len(p["iterations"]) == 3 and p["iterations"][0]["measured_ms"] > 0
PY
"$pp" costmodel validate --measured "$tmp/m.jsonl" | grep -q "median |e|" || fail "validate --measured text"
# --plot: the picture (python3 -m packpipe.plots); a build without the Python module says so instead.
if "$pp" costmodel validate --measured "$tmp/m.jsonl" --calibration "$tmp/cal.json" --plot "$tmp/v.png" --json \
    > "$tmp/vp.json" 2> "$tmp/vp.err"; then
  head -c 8 "$tmp/v.png" | od -An -c | grep -q "P   N   G" || fail "--plot wrote no PNG"
  $py -c "import json; j = json.load(open('$tmp/vp.json')); assert j['plot'] == '$tmp/v.png', j" || fail "--plot --json"
  ! ls "$tmp" | grep -q "plot-data" || fail "--plot left its temporary data"
else
  grep -q "built without the Python module" "$tmp/vp.err" || { cat "$tmp/vp.err" >&2; fail "--plot"; }
  [[ ! -e "$tmp/v.png" ]] || fail "a failed --plot left a file"
fi
err "--plot: .*is an input|same file" costmodel validate --measured "$tmp/m.jsonl" --plot "$tmp/m.jsonl"
mkdir "$tmp/dir.png"
err "is a directory" costmodel validate --measured "$tmp/m.jsonl" --plot "$tmp/dir.png"
err "no-such-folder/v.png" costmodel validate --measured "$tmp/m.jsonl" --plot "$tmp/no-such-folder/v.png"

# --calibration everywhere a cost model is built
"$pp" costmodel show --calibration "$tmp/cal.json" | grep -q "calibrated by" || fail "show --calibration"
# a large op: a replay woken late under load adds a fixed delay, which a small op would not hide
"$pp" costmodel query --mbs 4 --seq 4096 --calibration "$tmp/cal.json" --json > "$tmp/q.json"
$py -c "import json; j = json.load(open('$tmp/q.json')); assert 'calibrated by' in j['cost_model'] and j['calibrated']['forward_ms'] < 0.3 * j['forward_ms'], j" \
  || fail "query --calibration"
printf "2 512\n4 256\n1 1024\n" > "$tmp/mbs.txt"
"$pp" schedule "$tmp/mbs.txt" --stages 4 --layers-per-stage 4 --json > "$tmp/s0.json"
"$pp" schedule "$tmp/mbs.txt" --stages 4 --layers-per-stage 4 --calibration "$tmp/cal.json" --json > "$tmp/s1.json"
"$pp" partition --manifest "$root/data/demo/manifest.json" --global-batch-tokens 16384 --stages 4 \
  --layers-per-stage 4 --calibration "$tmp/cal.json" --json > "$tmp/p1.json"
$py - "$tmp/s0.json" "$tmp/s1.json" "$tmp/p1.json" <<'PY' || fail "schedule / partition --calibration"
import json, sys
s0, s1, p1 = (json.load(open(f)) for f in sys.argv[1:4])
assert s1["makespan_ms"] < 0.3 * s0["makespan_ms"], (s0["makespan_ms"], s1["makespan_ms"])
assert "calibrated by" in s1["cost_model"] and "calibrated by" in p1["cost_model"]
PY
"$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 16384 --iterations 1 --stages 4 \
  --layers-per-stage 4 --no-baselines --calibration "$tmp/cal.json" --out "$tmp/c.plan" > "$tmp/plan.txt" \
  || fail "plan --calibration"
grep -q "calibrated by" "$tmp/plan.txt" || { cat "$tmp/plan.txt" >&2; fail "plan names the calibrated model"; }

# Errors: bad measurement files name the file, the line and the field; the output is untouched.
echo KEEP > "$tmp/out.json"
printf '{"format":"packpipe-profile","version":1}\n' > "$tmp/bad1.jsonl"
err "bad1.jsonl line 1: field 'format': expected \"packpipe-measurements\", found \"packpipe-profile\"" \
  costmodel calibrate --measured "$tmp/bad1.jsonl" -o "$tmp/out.json"
{ head -n 3 "$tmp/m.jsonl"; echo '{"op":"F","rows":'; } > "$tmp/bad2.jsonl"
err "bad2.jsonl line 4" costmodel calibrate --measured "$tmp/m.jsonl" "$tmp/bad2.jsonl" -o "$tmp/out.json"
{ head -n 1 "$tmp/m.jsonl"; sed -n 2p "$tmp/m.jsonl" | sed 's/"ms":[0-9.e-]*/"ms":-2/'; } > "$tmp/bad3.jsonl"
err "bad3.jsonl line 2 .*ms must be positive for a compute op, found -2" \
  costmodel calibrate --measured "$tmp/bad3.jsonl" -o "$tmp/out.json"
{ head -n 1 "$tmp/m.jsonl"; grep -m1 '"op":"send"' "$tmp/m.jsonl" | sed 's/"bytes":[0-9]*/"bytes":0/'; } > "$tmp/bad4.jsonl"
err "bad4.jsonl line 2 .*bytes must be in \[1, 2\^50\] for a transfer, found 0" \
  costmodel calibrate --measured "$tmp/bad4.jsonl" -o "$tmp/out.json"
{ head -n 1 "$tmp/m.jsonl"; sed -n 2p "$tmp/m.jsonl" | sed 's/"op":"F"/"op":"Z"/'; } > "$tmp/bad5.jsonl"
err "bad5.jsonl line 2: field 'op': unknown op 'Z'" costmodel calibrate --measured "$tmp/bad5.jsonl" -o "$tmp/out.json"
err "refuses its shape" costmodel calibrate --measured "$tmp/m.jsonl" --model t5-770m -o "$tmp/out.json"
err "no such file|nonexistent" costmodel calibrate --measured "$tmp/nonexistent.jsonl" -o "$tmp/out.json"
[[ $(cat "$tmp/out.json") == KEEP ]] || fail "a failed calibrate clobbered its output"
cp "$tmp/m.jsonl" "$tmp/m.copy.jsonl"
err "input" costmodel calibrate --measured "$tmp/m.copy.jsonl" -o "$tmp/m.copy.jsonl"
cmp -s "$tmp/m.jsonl" "$tmp/m.copy.jsonl" || fail "calibrate clobbered its measurements"
err "input" costmodel validate --measured "$tmp/m.copy.jsonl" --plot-data "$tmp/m.copy.jsonl"
cmp -s "$tmp/m.jsonl" "$tmp/m.copy.jsonl" || fail "validate clobbered its measurements"

# Bad calibration files, and one fitted over another model, name the file and both models.
err "fitted over gpt-6.7b on A100-40GB .* this cost model is gpt-1.3b on A100-40GB" \
  schedule "$tmp/mbs.txt" --stages 4 --layers-per-stage 4 --model gpt-1.3b --calibration "$tmp/cal.json"
err "nonexistent.json" costmodel show --calibration "$tmp/nonexistent.json"
sed -E 's/"version": [12]/"version": 9/' "$tmp/cal.json" > "$tmp/cal9.json"
grep -q '"version": 9' "$tmp/cal9.json" || fail "cal9.json: the version was not replaced"
err "cal9.json: /version: expected 1 to 2, found 9" partition --manifest "$root/data/demo/manifest.json" \
  --global-batch-tokens 16384 --stages 4 --layers-per-stage 4 --calibration "$tmp/cal9.json"
err "--profile .* or --measured" costmodel validate
err "do not combine with --measured" costmodel validate --measured "$tmp/m.jsonl" --leave-one-out
err "go with --measured" costmodel validate --profile "$tmp/m.jsonl" --plot-data "$tmp/x.json"
cp "$tmp/a.plan" "$tmp/copy.plan"
err "input" run "$tmp/copy.plan" --replay --time-scale 0 --measurements "$tmp/copy.plan"
cmp -s "$tmp/a.plan" "$tmp/copy.plan" || fail "run --measurements clobbered the plan file"
err "same file" run "$tmp/a.plan" --replay --time-scale 0 --measurements "$tmp/t.json" --trace "$tmp/t.json"

# The model and device the measurements will name are checked when the options are parsed, before
# any replay: a calibrate that fails later on them would waste the run.
err "--model: .*unknown model 'nope'|--model: .*nope" run "$tmp/a.plan" --replay --measurements "$tmp/n.jsonl" --model nope
err "--device-name: .*nope" run "$tmp/a.plan" --replay --measurements "$tmp/n.jsonl" --device-name nope
err "--model: .*missing-model.json" run "$tmp/a.plan" --replay --measurements "$tmp/n.jsonl" --model "$tmp/missing-model.json"
[[ ! -e $tmp/n.jsonl ]] || fail "a refused run wrote measurements"
err "--model and --device-name describe the measurements" run "$tmp/a.plan" --replay --model gpt-6.7b
err "--model: .*nope" costmodel query --model nope
err "--device: .*nope" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 16384 --device nope

# validate --measured on a file with no op measurements is an error, not an empty report.
head -n 1 "$tmp/m.jsonl" > "$tmp/header-only.jsonl"
err "header-only.jsonl: no op measurements" costmodel validate --measured "$tmp/header-only.jsonl"
{ head -n 1 "$tmp/m.jsonl"; grep '"op":"iteration"' "$tmp/m.jsonl"; } > "$tmp/iterations-only.jsonl"
err "no op measurements .*3 iteration lines" costmodel validate --measured "$tmp/iterations-only.jsonl"

# Every file a command writes is distinct: --plot's temporary data beside the PNG is an output too.
err "same file" costmodel validate --measured "$tmp/m.jsonl" --plot "$tmp/w.png" --plot-data "$tmp/w.png.plot-data-0.json"
cp "$tmp/m.jsonl" "$tmp/w.png.plot-data-0.json"
err "input" costmodel validate --measured "$tmp/w.png.plot-data-0.json" --plot "$tmp/w.png"
cmp -s "$tmp/m.jsonl" "$tmp/w.png.plot-data-0.json" || fail "--plot's temporary overwrote a measurement file"
# An input named as an output's lock file is never taken (and removed) as the lock.
cp "$tmp/m.jsonl" "$tmp/lk.json.lock"
err "lock file" costmodel calibrate --measured "$tmp/lk.json.lock" -o "$tmp/lk.json"
cmp -s "$tmp/m.jsonl" "$tmp/lk.json.lock" || fail "calibrate took an input as its lock file"
echo "ok"

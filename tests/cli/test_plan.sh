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
b = t["baselines"]
assert set(b) == {"fixed", "fixed-packed", "tokens", "packing", "wlb", "slicing", "packing-mask"}, b.keys()
assert b["fixed"]["setting"] in ("fixed (mbs 1)", "fixed (mbs 4)"), b["fixed"]
for name, f in b.items():
    if f["feasible"] and name != "packing-mask":  # packed-mask rows are not among --layouts: listed only
        # never slower than a baseline: a faster baseline's plan would have been the plan
        assert f["speedup_of_packpipe"] >= 1 - 1e-12, (name, f)
        assert abs(f["speedup_of_packpipe"] - f["time_s"] / t["packpipe"]["time_s"]) < 1e-9
best = min((f for n, f in b.items() if f["feasible"]), key=lambda f: f["time_s"])
assert t["best_baseline"]["setting"] == best["setting"], t["best_baseline"]
for it in r["iterations"]:
    for name, f in it.get("baselines", {}).items():
        if f["feasible"] and name != "packing-mask":
            assert it["packpipe"]["iteration_ms"] <= f["iteration_ms"], (it["iteration"], name)
tr = json.load(open(sys.argv[2]))
events = [e for e in tr["traceEvents"] if e.get("ph") == "X"]
assert events and all("ts" in e and "dur" in e for e in events)
assert {e["tid"] for e in events} == {0, 1, 2, 3}
PY

# The report is written an iteration at a time (from a spill file): --report and --json are the same
# bytes; each iteration's baseline entry is its family's setting for the run, whose total is their
# sum; the text form shows the first and last 6 iterations.
"$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 16384 --iterations 14 \
  --stages 4 --layers-per-stage 4 --baseline-mbs 1 4 --threads 1 --report "$tmp/r14.json" --json > "$tmp/j14.json"
cmp -s "$tmp/r14.json" "$tmp/j14.json" || fail "--report and --json differ"
$py - "$tmp/r14.json" <<'PY' || fail "streamed report"
import json, sys
r = json.load(open(sys.argv[1]))
its, t = r["iterations"], r["total"]
assert [i["iteration"] for i in its] == list(range(14)) and t["iterations"] == 14
for name, f in t["baselines"].items():
    if not f["feasible"]:
        continue
    assert all(i["baselines"][name]["setting"] == f["setting"] for i in its), name
    total = sum(i["baselines"][name]["iteration_ms"] for i in its) / 1e3
    assert abs(total - f["time_s"]) <= 1e-9 * total, (name, total, f["time_s"])
    grid = {g["setting"]: g["time_s"] for g in f["grid"]}
    assert min(v for v in grid.values() if v is not None) == grid[f["setting"]], (name, grid)
PY
"$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 16384 --iterations 14 \
  --stages 4 --layers-per-stage 4 --baseline-mbs 1 4 --threads 1 > "$tmp/t14.txt"
rows=$(awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ {print $1}' "$tmp/t14.txt" | tr '\n' ' ')
[ "$rows" = "0 1 2 3 4 5 8 9 10 11 12 13 " ] || fail "text report rows: '$rows'"
grep -q "^ *\.\.\.$" "$tmp/t14.txt" || fail "text report: no elision line"

# The plan file: 3 iterations x 2 replicas, valid; inspect one rank; exports.
# A baseline is a candidate only in a layout --layouts lists. Padded only: packing-mask is reported
# (and may be faster), flagged so in the JSON and the text; with packed-mask listed its plans are
# candidates, and packpipe is never slower than any baseline. A layout listed twice is refused.
for layouts in padded padded,packed-mask; do
  "$pp" plan --manifest "$root/data/demo/short.json" --global-batch-tokens 32768 --iterations 3 --layouts $layouts \
    --validate --out "$tmp/mask.plan" --json > "$tmp/mask.$layouts.json" || fail "plan --layouts $layouts"
  "$pp" plan --manifest "$root/data/demo/short.json" --global-batch-tokens 32768 --iterations 3 --layouts $layouts \
    > "$tmp/mask.$layouts.txt" || fail "plan --layouts $layouts (text)"
done
$py - "$tmp/mask.padded.json" "$tmp/mask.padded,packed-mask.json" <<'PY' || fail "baselines reported only, or candidates"
import json, sys
only, both = (json.load(open(f))["total"] for f in sys.argv[1:])
assert only["baselines"]["packing-mask"]["candidate"] is False, only["baselines"]["packing-mask"]
assert all(f["candidate"] for n, f in only["baselines"].items() if n != "packing-mask"), only["baselines"]
assert only["best_baseline"]["family"] == "packing-mask" and not only["best_baseline"]["candidate"], only["best_baseline"]
assert only["best_baseline"]["speedup_of_packpipe"] < 1, only["best_baseline"]  # (why the flag matters)
assert all(f["candidate"] for f in both["baselines"].values()), both["baselines"]
for name, f in both["baselines"].items():
    assert not f["feasible"] or f["speedup_of_packpipe"] >= 1 - 1e-12, (name, f)
PY
grep -q "reported only: its layout packed-mask is not among --layouts" "$tmp/mask.padded.txt" || fail "text: reported only"
grep -q "reported only" "$tmp/mask.padded,packed-mask.txt" && fail "text: reported only with packed-mask listed"
if "$pp" plan --manifest "$root/data/demo/short.json" --global-batch-tokens 32768 --iterations 1 \
    --layouts padded,padded > /dev/null 2> "$tmp/twice.err"; then fail "a layout listed twice was accepted"; fi
grep -q "'padded' is listed twice" "$tmp/twice.err" || fail "layout listed twice: $(cat "$tmp/twice.err")"
if "$pp" plan --manifest "$root/data/demo/short.json" --global-batch-tokens 32768 --iterations 1 \
    --layouts packed-mask > /dev/null 2> "$tmp/maskonly.err"; then fail "packed-mask alone was accepted"; fi
grep -q "one or both of padded and packed" "$tmp/maskonly.err" || fail "packed-mask alone: $(cat "$tmp/maskonly.err")"

# Plans over the memory limit are written as asked, with a warning on stderr naming the first
# iteration and why (the report marks them infeasible); a plan that fits warns of nothing.
"$pp" plan --manifest "$root/data/demo/manifest.json" --stages 4 --layers-per-stage 4 --schedule gpipe \
  --global-batch-tokens 262144 --iterations 1 --out "$tmp/over.plan" --json > "$tmp/over.json" 2> "$tmp/over.err" \
  || fail "an infeasible plan failed"
grep -q "warning: 1 of 1 iterations have no plan within the memory limit (first: iteration 0: rank [0-9] peaks at" \
  "$tmp/over.err" || fail "no warning for a plan over the limit: $(cat "$tmp/over.err")"
$py -c "import json,sys; assert not json.load(open(sys.argv[1]))['total']['packpipe']['feasible']" "$tmp/over.json" \
  || fail "the report calls a plan over the limit feasible"
"$pp" plan --manifest "$root/data/demo/short.json" --global-batch-tokens 16384 --iterations 1 --json > /dev/null \
  2> "$tmp/fits.err" || fail "plan"
[ ! -s "$tmp/fits.err" ] || fail "a plan that fits warned: $(cat "$tmp/fits.err")"

"$pp" plan validate "$tmp/demo.plan" > /dev/null || fail "plan validate"
"$pp" plan inspect "$tmp/demo.plan" --iteration 1 --rank 2 --json > "$tmp/inspect.json"
$py -c "import json,sys; json.load(open(sys.argv[1]))" "$tmp/inspect.json" || fail "inspect json"
"$pp" plan inspect "$tmp/demo.plan" --iteration 2 --replica 1 --json > "$tmp/inspect1.json"
$py -c "import json,sys; j=json.load(open(sys.argv[1])); assert (j['iteration'], j['replica']) == (2, 1), j" \
  "$tmp/inspect1.json" || fail "inspect replica 1"
"$pp" plan export "$tmp/demo.plan" --iteration 0 --chrome-trace "$tmp/t2.json" > /dev/null || fail "export trace"

# Same inputs, same plans: byte-identical files.
"$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 32768 --iterations 3 \
  --stages 4 --dp 2 --layers-per-stage 4 --out "$tmp/again.plan" --no-baselines --threads 1 --baseline-mbs 1 4 > /dev/null
cmp "$tmp/demo.plan" "$tmp/again.plan" || fail "plans differ between runs"

# The file records the dataset it was planned from (loaders refuse another): its fingerprint and
# tasks, which do not depend on where the data lies.
"$pp" plan inspect "$tmp/demo.plan" > "$tmp/inspect.txt"
grep -Eq "^dataset: fingerprint [0-9a-f]{16}, tasks define \([0-9]+ samples\), synonyms \([0-9]+ samples\), translate" \
  "$tmp/inspect.txt" || fail "inspect does not show the dataset"
grep -q "man_text ([0-9]* samples)$" "$tmp/inspect.txt" || fail "inspect does not show every task"
"$pp" plan inspect "$tmp/demo.plan" --json > "$tmp/inspect.json"
grep -Eq '"dataset": "[0-9a-f]{16}"' "$tmp/inspect.json" || fail "inspect --json: no dataset"
cp -r "$root/data/demo" "$tmp/moved"
"$pp" plan --manifest "$tmp/moved/manifest.json" --global-batch-tokens 32768 --iterations 3 \
  --stages 4 --dp 2 --layers-per-stage 4 --out "$tmp/moved.plan" --no-baselines --threads 1 --baseline-mbs 1 4 > /dev/null
cmp "$tmp/demo.plan" "$tmp/moved.plan" || fail "the same data elsewhere gives other plans"
$py - "$tmp/moved/manifest.json" <<'PY' || fail "reordered manifest"
import json, sys
m = json.load(open(sys.argv[1]))
m["tasks"][0], m["tasks"][1] = m["tasks"][1], m["tasks"][0]
json.dump(m, open(sys.argv[1], "w"))
PY
"$pp" plan --manifest "$tmp/moved/manifest.json" --global-batch-tokens 32768 --iterations 3 \
  --stages 4 --dp 2 --layers-per-stage 4 --out "$tmp/reordered.plan" --no-baselines --threads 1 > /dev/null
"$pp" plan inspect "$tmp/reordered.plan" > "$tmp/reordered.txt"
grep -q "^dataset: fingerprint .*, tasks synonyms (" "$tmp/reordered.txt" || fail "a reordered manifest's plans name its order"
[[ "$(grep "^dataset:" "$tmp/inspect.txt" | cut -d, -f1)" != "$(grep "^dataset:" "$tmp/reordered.txt" | cut -d, -f1)" ]] \
  || fail "a reordered manifest has the same fingerprint"

# Bad input: a sample that no micro-batch can hold names itself as the user knows it (iteration,
# task, index in the dataset) and the option that handles it; a model state over the memory limit
# says that no sample can fit.
shape=(--stages 4 --layers-per-stage 4 --no-baselines --iterations 2)
if "$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 65536 "${shape[@]}" --memory-mb 17000 \
     2> "$tmp/err.txt" > /dev/null; then
  fail "a sample over the memory limit was accepted"
fi
grep -q "iteration [01], task '[a-z_]*', dataset sample [0-9]* (length [0-9]*) does not fit in 17000 MB" "$tmp/err.txt" \
  || fail "no dataset sample named: $(cat "$tmp/err.txt")"
grep -q -- "--oversize truncate or drop" "$tmp/err.txt" || fail "no --oversize named: $(cat "$tmp/err.txt")"
if "$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 65536 --iterations 1 \
     --memory-mb 20000 --layers-per-stage 8 2> "$tmp/err.txt" > /dev/null; then
  fail "an impossible memory limit was accepted"
fi
grep -q "model state of rank 0 .* more than the 20000 MB memory limit" "$tmp/err.txt" || fail "model state: $(cat "$tmp/err.txt")"
# --oversize drop / truncate: the epoch is planned, the plans validate, the report counts them, and
# tokens are what is trained.
for pol in drop truncate; do
  "$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 65536 "${shape[@]}" --memory-mb 17000 \
    --oversize $pol --validate --out "$tmp/$pol.plan" --json > "$tmp/$pol.json" || fail "--oversize $pol"
  "$pp" plan validate "$tmp/$pol.plan" > /dev/null || fail "--oversize $pol plans do not validate"
  $py - "$tmp/$pol.json" $pol <<'PY' || fail "--oversize $pol report"
import json, sys
j, pol = json.load(open(sys.argv[1])), sys.argv[2]
t = j["total"]
assert t[{"drop": "dropped", "truncate": "truncated"}[pol]] > 0, t
assert t["tokens"] == sum(i["tokens"] for i in j["iterations"]) > 0
PY
done
"$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 65536 "${shape[@]}" --memory-mb 17000 \
  --oversize drop > "$tmp/text.txt" || fail "--oversize drop text"
grep -q "oversize samples: 0 truncated, [1-9][0-9]* dropped" "$tmp/text.txt" || fail "text report: $(cat "$tmp/text.txt")"

# --max-seq-len: every policy plans the demo (samples up to ~3,000 tokens) within the context length:
# the plans record it and validate, every sample's length is within it, the report counts what it
# did; split keeps every token (chunks named by their offsets); the same run twice gives the same file.
plain=(--manifest "$root/data/demo/manifest.json" --global-batch-tokens 32768 --iterations 3 --stages 4
       --layers-per-stage 4 --no-baselines)
ctx=("${plain[@]}" --max-seq-len 1024)
"$pp" plan "${plain[@]}" --json > "$tmp/ctx_none.json" || fail "no context length"
"$pp" plan "${ctx[@]}" --json | $py -c 'import json, sys; assert json.load(sys.stdin)["config"]["seq_policy"] == "truncate"' \
  || fail "truncate is not the default --seq-policy"
for pol in truncate drop split; do
  "$pp" plan "${ctx[@]}" --seq-policy $pol --validate --out "$tmp/ctx_$pol.plan" --json > "$tmp/ctx_$pol.json" \
    || fail "--seq-policy $pol"
  "$pp" plan validate "$tmp/ctx_$pol.plan" > /dev/null || fail "--seq-policy $pol plans do not validate"
  for i in 0 1 2; do
    "$pp" plan inspect "$tmp/ctx_$pol.plan" --iteration $i --json > "$tmp/ctx_${pol}_$i.json" || fail "inspect $pol"
  done
  $py - "$tmp/ctx_$pol.json" $pol "$tmp/ctx_none.json" "$tmp"/ctx_${pol}_?.json <<'PY' || fail "--seq-policy $pol report"
import json, sys
j, pol, plain = json.load(open(sys.argv[1])), sys.argv[2], json.load(open(sys.argv[3]))
c, t = j["config"], j["total"]
assert (c["max_seq_len"], c["seq_policy"]) == (1024, pol), c
assert "max_target_len" not in c  # decoder-only
counts = {k: t["seq_" + k] for k in ("truncated", "dropped", "split")}
key = {"truncate": "truncated", "drop": "dropped", "split": "split"}[pol]
assert counts[key] > 0 and sum(counts.values()) == counts[key], counts
assert (t["seq_chunks"] > t["seq_split"]) == (pol == "split")
assert all(sum(i["seq_" + k] for i in j["iterations"]) == counts[k] for k in counts)
assert "max_seq_len" not in plain["config"] and "seq_truncated" not in plain["total"]
assert all(not k.startswith("seq_") for i in plain["iterations"] for k in i)
# split keeps every token of the same batches; truncate and drop train fewer
assert (t["tokens"] == plain["total"]["tokens"]) == (pol == "split"), (t["tokens"], plain["total"]["tokens"])
offsets = 0
for path in sys.argv[4:]:
    p = json.load(open(path))
    assert p["max_seq_len"] == 1024 and p["version"] >= 4
    for mb in p["microbatches"]:
        assert max(mb["lengths"]) <= 1024, mb["lengths"]
        offsets += sum(1 for r in mb["refs"] if len(r) == 3)
assert (offsets > 0) == (pol == "split"), offsets
PY
done
"$pp" plan "${ctx[@]}" --seq-policy split --out "$tmp/ctx_again.plan" > "$tmp/ctx.txt" || fail "split again"
cmp "$tmp/ctx_split.plan" "$tmp/ctx_again.plan" || fail "split plans differ between runs"
grep -q "context length 1024 (split): 0 samples truncated, 0 dropped, [1-9][0-9]* split into [1-9][0-9]* chunks" \
  "$tmp/ctx.txt" || fail "context text report: $(cat "$tmp/ctx.txt")"
"$pp" plan inspect "$tmp/ctx_again.plan" --iteration 0 > "$tmp/inspect.txt" || fail "inspect text"
grep -q "^context length: 1024 tokens$" "$tmp/inspect.txt" || fail "inspect text: $(head -3 "$tmp/inspect.txt")"
# Encoder-decoder: the decoder side's limit; split is refused naming the option, before any output.
"$pp" plan --manifest "$root/data/demo/manifest.json" --model t5-770m --global-batch-tokens 16384 --iterations 1 \
  --stages 2 --no-baselines --max-seq-len 1024 --max-target-len 64 --seq-policy drop --validate --json \
  > "$tmp/t5ctx.json" || fail "t5 context length"
$py -c '
import json, sys
j = json.load(open(sys.argv[1]))
assert (j["config"]["max_seq_len"], j["config"]["max_target_len"]) == (1024, 64) and j["total"]["seq_dropped"] > 0
' "$tmp/t5ctx.json" || fail "t5 context report"

# Option ranges: refused with the option named, before anything is planned or written.
bad() {  # bad PATTERN ARGS...
  local pat=$1; shift
  if "$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 16384 --iterations 1 "$@" \
       --out "$tmp/bad.plan" > /dev/null 2> "$tmp/err.txt"; then fail "accepted: $*"; fi
  grep -q -- "$pat" "$tmp/err.txt" || fail "message for $*: $(cat "$tmp/err.txt")"
  [[ ! -e $tmp/bad.plan ]] || fail "a refused run wrote $tmp/bad.plan"
}
bad "--threads must be in \[0, 1024\]" --threads -3
bad "--threads must be in \[0, 1024\]" --threads 2147483647
bad "--baseline-mbs must be in \[1, 1048576\]" --baseline-mbs -1
bad "--baseline-mbs must be in \[1, 1048576\]" --baseline-mbs 1 0
bad "--stages must be in \[1, 65536\], found 2147483647" --stages 2147483647
bad "= 4000 layers, more than the 32 layers of 'gpt-6.7b'" --stages 4 --layers-per-stage 1000
bad "--round-multiple must be in" --round-multiple 0
bad "--oversize: squash not in" --oversize squash
bad "--seq-policy: cut not in" --max-seq-len 64 --seq-policy cut
bad "--max-seq-len must be in \[0, 4294967295\]" --max-seq-len 4294967296
bad "--max-target-len 64 is for encoder-decoder models" --max-seq-len 1024 --max-target-len 64
bad "--seq-policy 'split' is for decoder-only models" --model t5-770m --stages 2 --max-seq-len 512 --seq-policy split
bad "--min-gain: must be in \[0, " --min-gain 1
bad "--min-gain: must be in \[0, " --min-gain -0.1
bad "--min-gain" --min-gain nan
# --min-gain: packpipe's own partition only when that much faster than the best baseline (0: the least makespan).
for g in 0 0.5; do
  "$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 16384 --iterations 4 --min-gain $g \
    --json > "$tmp/gain_$g.json" || fail "--min-gain $g"
done
$py - "$tmp/gain_0.json" "$tmp/gain_0.5.json" <<'PY' || fail "--min-gain report"
import json, sys
free, cautious = (json.load(open(p)) for p in sys.argv[1:])
assert free["config"]["min_gain"] == 0 and cautious["config"]["min_gain"] == 0.5
n = len(free["iterations"])
assert cautious["total"]["packpipe"]["iterations_from_baselines"] == n, cautious["total"]["packpipe"]
assert free["total"]["packpipe"]["iterations_from_baselines"] < n
PY
# --baseline-schedule: the report's baselines as their systems run them (1F1B over their order) or
# under packpipe's search; the plans are byte-identical with either report or none.
bad "--baseline-schedule: 1f1b not in" --baseline-schedule 1f1b
for bs in as-run search; do
  "$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 16384 --iterations 4 \
    --baseline-schedule $bs --out "$tmp/bs_$bs.plan" --json > "$tmp/bs_$bs.json" || fail "--baseline-schedule $bs"
done
"$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 16384 --iterations 4 --no-baselines \
  --out "$tmp/bs_none.plan" > /dev/null || fail "--no-baselines"
cmp "$tmp/bs_as-run.plan" "$tmp/bs_search.plan" || fail "the baseline schedule changed the plans"
cmp "$tmp/bs_as-run.plan" "$tmp/bs_none.plan" || fail "the report changed the plans"
$py - "$tmp/bs_as-run.json" "$tmp/bs_search.json" <<'PY' || fail "--baseline-schedule report"
import json, sys
run, searched = (json.load(open(p)) for p in sys.argv[1:])
assert run["config"]["baseline_schedule"] == "as-run" and searched["config"]["baseline_schedule"] == "search"
for a, b in zip(run["iterations"], searched["iterations"]):
    assert a["packpipe"] == b["packpipe"], (a["packpipe"], b["packpipe"])
    for fam, f in a["baselines"].items():
        assert f["schedule"] == "1f1b", (fam, f)
        assert f["iteration_ms"] >= a["packpipe"]["iteration_ms"], (fam, f)
    for fam, f in b["baselines"].items():
        assert f["iteration_ms"] >= a["packpipe"]["iteration_ms"], (fam, f)
# Each family's setting as run is at least as slow as under the search (which tries 1F1B first).
for fam, g in run["total"]["baselines"].items():
    for x, y in zip(g["grid"], searched["total"]["baselines"][fam]["grid"]):
        assert x["setting"] == y["setting"]
        if x["time_s"] is not None and y["time_s"] is not None:
            assert x["time_s"] >= y["time_s"] * (1 - 1e-12), (fam, x, y)
PY
"$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 16384 --iterations 2 \
  | grep -q "under the schedule its system runs" || fail "the text report does not say what the baselines run"
# Two outputs on one file (the report would overwrite the plans), and a --model file as an output.
bad "--out '$tmp/bad.plan' and --report '$tmp/./bad.plan' are the same file" --report "$tmp/./bad.plan"
echo '{"name": "m", "num_layers": 4, "hidden": 256, "heads": 4, "ffn_hidden": 1024, "vocab": 1000}' > "$tmp/model.json"
bad "destroy the input" --model "$tmp/model.json" --report "$tmp/model.json"
grep -q '"name": "m"' "$tmp/model.json" || fail "the model file was overwritten"
if "$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens -1 2> "$tmp/err.txt"; then
  fail "negative --global-batch-tokens accepted"
fi
if "$pp" plan --manifest "$tmp/nope.json" --global-batch-tokens 1000 2> /dev/null; then fail "missing manifest accepted"; fi
# A weighted manifest draws some samples more than once (each draw its own sample of the batch),
# and slices long ones: the plans of make demo's long-context run validate.
"$pp" plan --manifest "$root/data/demo/long.json" --model gpt-6.7b --device A100-40GB --stages 4 --layers-per-stage 4 \
  --global-batch-tokens 65536 --iterations 6 --out "$tmp/long.plan" > /dev/null || fail "long plan"
"$pp" plan validate "$tmp/long.plan" > "$tmp/long.out" || fail "long-context plans invalid: $(tail -5 "$tmp/long.out")"
grep -q "6 plans checked, 0 invalid" "$tmp/long.out" || fail "long validate: $(tail -2 "$tmp/long.out")"
# inspect shows each later slice: its sample, where it starts and the micro-batch before it
"$pp" plan inspect "$tmp/long.plan" --iteration 0 > "$tmp/long.txt"
grep -q "; slices: sample [0-9]* from token [0-9]* (after micro-batch [0-9]*)" "$tmp/long.txt" \
  || fail "inspect shows no slices: $(grep ' mb ' "$tmp/long.txt" | head -3)"
echo "cli plan tests: ok"

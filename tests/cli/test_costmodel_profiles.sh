#!/usr/bin/env bash
# End-to-end tests of `packpipe costmodel validate|import` on the DynaPipe and Aceso fixtures.
# Usage: test_costmodel_profiles.sh PACKPIPE_BINARY FIXTURES_DIR
set -euo pipefail
pp=$1
dyn=$2/dynapipe/derived_from_cost_models_pkl
aceso=$2/aceso/profiler
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
py=/usr/bin/python3

for sub in validate import; do
  "$pp" costmodel "$sub" --help | grep "Usage" > /dev/null || fail "costmodel $sub --help"
done

# validate --leave-one-out --json: documented keys, finite figures, ours below linear (time and stored memory)
check_loo() {
  $py - "$1" "$2" <<'PY' || fail "leave-one-out JSON for $2"
import json, math, sys
j = json.load(open(sys.argv[1]))
for k in ("points", "time_mape", "memory_mape", "linear_time_mape", "linear_memory_mape", "by_stage_rc", "model"):
    assert k in j, k
assert j["model"] == sys.argv[2], j["model"]
assert j["points"] > 0
for k in ("time_mape", "memory_mape", "linear_time_mape", "linear_memory_mape"):
    assert math.isfinite(j[k]), k
assert j["time_mape"] < j["linear_time_mape"], (j["time_mape"], j["linear_time_mape"])
assert j["memory_mape"] < j["linear_memory_mape"], (j["memory_mape"], j["linear_memory_mape"])
assert all({"stage", "rc", "points", "time_mape"} <= set(b) for b in j["by_stage_rc"])
PY
}
"$pp" costmodel validate --profile "$dyn/gpt_6.7b_timing.csv" "$dyn/gpt_6.7b_activation.csv" --leave-one-out --json \
  > "$tmp/gpt.json" || fail "validate gpt"
check_loo "$tmp/gpt.json" gpt-6.7b
"$pp" costmodel validate --profile "$dyn/t5_11b_timing.csv" --profile "$dyn/t5_11b_activation.csv" --leave-one-out \
  --json > "$tmp/t5.json" || fail "validate t5"
check_loo "$tmp/t5.json" t5-11b

# Aceso: mbs 2 and 4 from their neighbours, ours below linear too; the text report for people
"$pp" costmodel validate --profile "$aceso/profiled-time-eurosys" --leave-one-out --json > "$tmp/aceso.json" \
  || fail "validate aceso json"
check_loo "$tmp/aceso.json" gpt-13b
"$pp" costmodel validate --profile "$aceso/profiled-time-eurosys" --leave-one-out > "$tmp/aceso.txt" || fail "validate aceso"
grep -q "model gpt-13b" "$tmp/aceso.txt" || fail "aceso text names the model"
grep -q "^  all " "$tmp/aceso.txt" || fail "aceso text has the total line"

# import: one packpipe profile file that validate (and the cost model) read back
"$pp" costmodel import "$dyn/gpt_6.7b_timing.csv" "$dyn/gpt_6.7b_activation.csv" "$dyn/gpt_6.7b_model_state.csv" \
  --out "$tmp/gpt_profile.json" --device A100-40GB --json > "$tmp/import.json" || fail "import"
$py - "$tmp/import.json" "$tmp/gpt_profile.json" <<'PY' || fail "import output"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["points"] == 4096 + 1024 and s["params"] == 24, s
p = json.load(open(sys.argv[2]))
assert p["format"] == "packpipe-profile" and p["units"] == {"time": "ms", "memory": "bytes"}, p["units"]
assert p["device"] == "A100-40GB" and len(p["points"]) == 5120
PY
"$pp" costmodel validate --profile "$tmp/gpt_profile.json" --leave-one-out --json > "$tmp/gpt2.json" || fail "validate imported"
# import never writes onto a profile it reads (through a link too)
cp "$tmp/gpt_profile.json" "$tmp/keep.json"
ln -s "$tmp/gpt_profile.json" "$tmp/link.json"
if "$pp" costmodel import "$tmp/gpt_profile.json" --out "$tmp/link.json" 2> "$tmp/err"; then fail "import onto its input"; fi
grep -q "destroy the input" "$tmp/err" || fail "import onto its input: $(cat "$tmp/err")"
cmp "$tmp/gpt_profile.json" "$tmp/keep.json" || fail "import changed its input"
check_loo "$tmp/gpt2.json" gpt-6.7b

# bad input: a missing column names the file, the line and the column; exit status 1
sed '1s/,mbs,/,mb,/' "$dyn/gpt_6.7b_timing.csv" > "$tmp/gpt_bad_timing.csv"
if "$pp" costmodel validate --profile "$tmp/gpt_bad_timing.csv" --model gpt-6.7b 2> "$tmp/err.txt"; then
  fail "missing column accepted"
fi
grep -q "gpt_bad_timing.csv line 1: missing column 'mbs'" "$tmp/err.txt" || fail "missing column message: $(cat "$tmp/err.txt")"
# mixing two models' grids is refused
if "$pp" costmodel import "$aceso/profiled-time-miniset" --out "$tmp/mixed.json" 2> "$tmp/err2.txt"; then
  fail "mixed models accepted"
fi
grep -q "load one model at a time" "$tmp/err2.txt" || fail "mixed models message"

# --profile-interpolation linear: DynaPipe's rule, linear in mbs between the profiled 2 and 4 (forward
# 2.52 and 4.69 ms at seq 512); the same option on the planning commands; a bad name is refused
"$pp" costmodel query --model gpt-6.7b --profile "$dyn/gpt_6.7b_timing.csv" --profile-interpolation linear \
  --mbs 3 --seq 512 --json > "$tmp/lin.json" || fail "query linear"
$py -c "import json,sys; j=json.load(open(sys.argv[1])); assert abs(j['forward_ms'] - 3.605) < 1e-9, j" "$tmp/lin.json" \
  || fail "linear interpolation between mbs 2 and 4"
printf '300\n200\n900\n' > "$tmp/lens.txt"
"$pp" partition "$tmp/lens.txt" --model gpt-6.7b --profile "$dyn/gpt_6.7b_timing.csv" --profile "$dyn/gpt_6.7b_activation.csv" \
  --profile-interpolation linear --cost-basis dynapipe --stages 4 --layers-per-stage 4 --memory-mb 36000 > /dev/null || fail "partition on DynaPipe's interpolation"
if "$pp" partition "$tmp/lens.txt" --profile "$dyn/gpt_6.7b_timing.csv" --profile-interpolation cubic 2> "$tmp/err3.txt"; then
  fail "unknown interpolation accepted"
fi
grep -q "fit" "$tmp/err3.txt" || fail "unknown interpolation message: $(cat "$tmp/err3.txt")"
echo "ok"

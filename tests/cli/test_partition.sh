#!/usr/bin/env bash
# packpipe partition: lengths file, sampled batch, --compare, --json, oversize policies, errors.
# Usage: bash test_partition.sh PACKPIPE_BINARY FIXTURES_DIR
set -euo pipefail
BIN="$1"
FIX="$2"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY=/usr/bin/python3
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

for i in $(seq 1 60); do echo $(( (i * 7919) % 1500 + 1 )); done > "$T/gpt.txt"
for i in $(seq 1 40); do echo "$(( (i * 7919) % 900 + 1 )) $(( (i * 104729) % 300 + 1 ))"; done > "$T/t5.txt"
SHAPE="--stages 4 --layers-per-stage 4 --memory-mb 36000"

# JSON: every sample once, required fields.
"$BIN" partition "$T/gpt.txt" $SHAPE --json > "$T/a.json"
$PY - "$T/a.json" 60 <<'PYEOF' || fail "dp json"
import json, sys
j = json.load(open(sys.argv[1])); n = int(sys.argv[2])
s = sorted(x for mb in j["microbatches"] for x in mb["samples"])
assert s == list(range(n)), s
for mb in j["microbatches"]:
    assert mb["padded_len"] % 8 == 0 and mb["time_ms"] > 0 and mb["recompute"] in ("none", "selective", "full")
assert j["objective_ms"] > 0 and 0 < j["efficiency"] <= 1
PYEOF

# Deterministic.
"$BIN" partition "$T/gpt.txt" $SHAPE --json > "$T/b.json"
cmp -s "$T/a.json" "$T/b.json" || fail "not deterministic"

# Encoder-decoder with padded_dec_len; every method in --compare.
"$BIN" partition "$T/t5.txt" --model t5-11b --stages 4 --layers-per-stage 6 --memory-mb 36000 --compare --json > "$T/c.json"
$PY - "$T/c.json" <<'PYEOF' || fail "t5 compare"
import json, sys
j = json.load(open(sys.argv[1]))
assert all("padded_dec_len" in mb for mb in j["microbatches"])
methods = {r["method"]: r for r in j["compare"]}
assert set(methods) == {"dp", "dynapipe", "fixed", "tokens", "packing"}, methods.keys()
assert methods["dp"]["feasible"]
PYEOF
"$BIN" partition "$T/gpt.txt" $SHAPE --compare | grep "^dynapipe" > /dev/null || fail "compare table"

# Baselines with their parameters.
for m in "fixed --mbs 2" "tokens --tokens 4096" "packing --mbs 1" "dynapipe"; do
  "$BIN" partition "$T/gpt.txt" $SHAPE --method $m --json > "$T/m.json" || fail "method $m"
done

# Encoder-decoder order and table builders: --order sorted is DynaPipe's order (auto is never
# worse); one or two table builders print the same bytes.
for i in $(seq 1 150); do echo "$(( (i * 7919) % 900 + 1 )) $(( (i * 104729) % 300 + 1 ))"; done > "$T/t5big.txt"
T5SHAPE="--model t5-11b --stages 4 --layers-per-stage 6 --memory-mb 36000"
"$BIN" partition "$T/t5big.txt" $T5SHAPE --order sorted --json > "$T/sorted.json"
"$BIN" partition "$T/t5big.txt" $T5SHAPE --order auto --threads 1 --json > "$T/auto1.json"
"$BIN" partition "$T/t5big.txt" $T5SHAPE --order auto --threads 2 --json > "$T/auto2.json"
cmp -s "$T/auto1.json" "$T/auto2.json" || fail "--threads 1 and 2 differ"
$PY - "$T/sorted.json" "$T/auto1.json" "$T/t5big.txt" <<'PYEOF' || fail "order"
import json, sys
s, a = (json.load(open(p)) for p in sys.argv[1:3])
lens = [tuple(map(int, l.split())) for l in open(sys.argv[3])]
order = [x for mb in s["microbatches"] for x in mb["samples"]]
assert [lens[x] for x in order] == sorted(lens, reverse=True), "sorted order is not (input, target) descending"
assert a["objective_ms"] <= s["objective_ms"], (a["objective_ms"], s["objective_ms"])
PYEOF
if "$BIN" partition "$T/t5big.txt" $T5SHAPE --order tsp 2> "$T/err.txt"; then fail "bad order accepted"; fi
grep -q "unknown encoder-decoder order 'tsp'" "$T/err.txt" || fail "order message: $(cat "$T/err.txt")"
if "$BIN" partition "$T/gpt.txt" $SHAPE --threads -1 2> "$T/err.txt"; then fail "negative threads accepted"; fi

# Sampled batch from the embedded demo manifest.
"$BIN" partition --manifest "$ROOT/data/demo/manifest.json" --global-batch-tokens 16384 --batch-index 1 $SHAPE --json > "$T/d.json"
$PY -c "import json,sys; j=json.load(open('$T/d.json')); assert j['samples'] > 0 and len(j['microbatches']) > 0" || fail "manifest"

# Oversize: error names the sample and its length; drop and truncate count it.
printf "100\n1000000\n50\n" > "$T/big.txt"
if "$BIN" partition "$T/big.txt" $SHAPE 2> "$T/err.txt"; then fail "oversize accepted"; fi
grep -q "sample 1 (length 1000000)" "$T/err.txt" || fail "oversize message: $(cat "$T/err.txt")"
"$BIN" partition "$T/big.txt" $SHAPE --oversize drop --json | $PY -c "import json,sys; assert json.load(sys.stdin)['dropped'] == [1]" || fail "drop"
"$BIN" partition "$T/big.txt" $SHAPE --oversize truncate --json | $PY -c "import json,sys; assert json.load(sys.stdin)['truncated'] == [1]" || fail "truncate"

# Bad inputs.
echo "12 x" > "$T/bad.txt"
if "$BIN" partition "$T/bad.txt" $SHAPE 2> "$T/err.txt"; then fail "bad file accepted"; fi
grep -q "bad.txt:1" "$T/err.txt" || fail "bad file message"
if "$BIN" partition "$T/gpt.txt" $SHAPE --method fixed 2> "$T/err.txt"; then fail "fixed without --mbs"; fi
grep -q "microbatch_size" "$T/err.txt" || fail "fixed message"
echo OK

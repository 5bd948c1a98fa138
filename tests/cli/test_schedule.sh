#!/usr/bin/env bash
# End-to-end tests of `packpipe schedule`.
# Usage: test_schedule.sh PACKPIPE_BINARY FIXTURES_DIR
set -euo pipefail
pp=$1
fx=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
py=/usr/bin/python3

"$pp" schedule --help | grep "Usage" > /dev/null || fail "schedule --help"

cat > "$tmp/mbs.txt" <<'MB'
# rows padded_len [padded_dec_len] [recompute]
4 512
2 1024
16 128   # short rows
1 2048 selective
8 256
4 512
2 1024
8 256
MB

# search: JSON with the documented keys, memory within the limit, a valid Chrome trace
"$pp" schedule "$tmp/mbs.txt" --model gpt-1.3b --stages 4 --memory-mb 30000 --seed 3 --reference --json \
    --chrome-trace "$tmp/trace.json" > "$tmp/search.json"
$py - "$tmp/search.json" "$tmp/trace.json" <<'PY' || fail "search --json"
import json, sys
j = json.load(open(sys.argv[1]))
for k in ("schedule", "makespan_ms", "bubble_fraction", "peak_memory_mb", "utilization", "order", "search_ms",
          "feasible", "lower_bound_ms", "reference"):
    assert k in j, k
assert len(j["peak_memory_mb"]) == 4 and len(j["utilization"]) == 4
assert sorted(j["order"]) == list(range(8)), j["order"]
assert j["feasible"] and max(j["peak_memory_mb"]) <= 30000
assert j["makespan_ms"] <= j["reference"]["makespan_ms"] + 1e-9, (j["makespan_ms"], j["reference"])
assert j["makespan_ms"] >= j["lower_bound_ms"] * (1 - 1e-12)
assert 0 <= j["bubble_fraction"] < 1
t = json.load(open(sys.argv[2]))
ev = [e for e in t["traceEvents"] if e["ph"] == "X"]
assert len(ev) > 0
tracks = {}
for e in ev:
    for k in ("name", "ts", "dur", "pid", "tid", "args"):
        assert k in e, k
    tracks.setdefault(e["tid"], []).append((e["ts"], e["dur"]))
assert sorted(tracks) == [0, 1, 2, 3]
for tid, xs in tracks.items():
    xs.sort()
    for (a, da), (b, db) in zip(xs, xs[1:]):
        assert b >= a + da - 1e-6, (tid, a, da, b)
end = max(e["ts"] + e["dur"] for e in ev)
assert abs(end / 1000 - j["makespan_ms"]) < 1e-6 * j["makespan_ms"], (end, j["makespan_ms"])
PY

# same seed, same answer
"$pp" schedule "$tmp/mbs.txt" --model gpt-1.3b --stages 4 --memory-mb 30000 --seed 3 --json > "$tmp/again.json"
$py - "$tmp/search.json" "$tmp/again.json" <<'PY' || fail "determinism"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for k in ("schedule", "makespan_ms", "order", "peak_memory_mb"):
    assert a[k] == b[k], k
PY

# all: one row per schedule, 1F1B and GPipe bubbles as expected for identical micro-batches
printf '4 512\n4 512\n4 512\n4 512\n4 512\n4 512\n4 512\n4 512\n' > "$tmp/same.txt"
"$pp" schedule "$tmp/same.txt" --model gpt-1.3b --stages 4 --schedule all --json > "$tmp/all.json"
$py - "$tmp/all.json" <<'PY' || fail "all --json"
import json, sys
j = json.load(open(sys.argv[1]))
rows = {r["schedule"]: r for r in j["schedules"]}
assert set(rows) == {"gpipe", "1f1b", "interleaved-1f1b", "cyclic", "wait-free-cyclic", "zero-bubble"}, rows.keys()
assert rows["interleaved-1f1b"]["supported"] is False
assert rows["gpipe"]["makespan_ms"] >= rows["1f1b"]["makespan_ms"] * 0.999
assert rows["zero-bubble"]["makespan_ms"] <= rows["1f1b"]["makespan_ms"] * 1.0001
assert j["makespan_ms"] <= min(r["makespan_ms"] for r in rows.values() if r["supported"] and r["fits_memory"]) + 1e-9
PY
"$pp" schedule "$tmp/same.txt" --model gpt-1.3b --stages 4 --schedule all | grep "wait-free-cyclic" > /dev/null || fail "all table"
"$pp" schedule "$tmp/same.txt" --model gpt-1.3b --stages 2 --chunks 2 --schedule interleaved-1f1b --json > "$tmp/il.json"
$py -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['schedule']=='interleaved-1f1b' and len(j['peak_memory_mb'])==2" "$tmp/il.json" \
  || fail "interleaved"
cat "$tmp/same.txt" | "$pp" schedule - --model gpt-1.3b --stages 4 --schedule 1f1b | grep "1f1b" > /dev/null || fail "stdin"

# bad input: non-zero exit and a message naming the problem
expect_error() {
  local pattern=$1; shift
  if "$pp" "$@" > "$tmp/out" 2> "$tmp/err"; then fail "expected failure: $*"; fi
  grep -q -- "$pattern" "$tmp/err" || { cat "$tmp/err" >&2; fail "message for: $*"; }
}
printf '4 512\nfour 512\n' > "$tmp/bad.txt"
expect_error "bad.txt:2: rows must be a non-negative integer" schedule "$tmp/bad.txt"
printf '4 512 none extra\n' > "$tmp/bad2.txt"
expect_error "bad2.txt:1: unexpected field 'extra'" schedule "$tmp/bad2.txt"
printf '4 512 fast\n' > "$tmp/bad3.txt"
expect_error "recompute must be one of none, selective, full" schedule "$tmp/bad3.txt"
printf '# nothing\n' > "$tmp/empty.txt"
expect_error "no micro-batches" schedule "$tmp/empty.txt"
expect_error "cannot open" schedule "$tmp/missing.txt"
expect_error "unknown schedule 'pipedream'" schedule "$tmp/same.txt" --model gpt-1.3b --schedule pipedream
expect_error "1f1b needs one virtual stage per rank" schedule "$tmp/same.txt" --model gpt-1.3b --stages 2 --chunks 2 --schedule 1f1b
# The micro-batch file: overflow, sizes beyond the limits, a FIFO or a directory are errors at once.
printf '4 99999999999999999999\n' > "$tmp/ovf.txt"
expect_error "ovf.txt:1: padded_len 99999999999999999999 is too large" schedule "$tmp/ovf.txt"
printf '4294967296 512\n' > "$tmp/rows.txt"
expect_error "rows.txt:1: rows 4294967296 is too large; the largest accepted is 1048576" schedule "$tmp/rows.txt"
printf -- '-4 512\n' > "$tmp/neg.txt"
expect_error "neg.txt:1: rows must not be negative" schedule "$tmp/neg.txt"
printf '4 512 128\n' > "$tmp/dec.txt"  # a decoder length for a decoder-only model: refused, not dropped
expect_error "dec.txt:1: padded_dec_len 128 for gpt-1.3b, a decoder-only model" schedule "$tmp/dec.txt" --model gpt-1.3b
"$pp" schedule "$tmp/dec.txt" --model t5-770m --stages 2 > /dev/null || fail "a decoder length for T5"
printf '4 0\n' > "$tmp/zero.txt"
expect_error "zero.txt:1: padded_len must be at least 1" schedule "$tmp/zero.txt"
expect_error "is a directory; expected a regular file" schedule "$tmp"
mkfifo "$tmp/fifo"
if timeout 10 "$pp" schedule "$tmp/fifo" > /dev/null 2> "$tmp/err"; then fail "FIFO accepted"; fi
grep -q "is a FIFO" "$tmp/err" || fail "FIFO: $(cat "$tmp/err")"
# Shape options: bounded before anything is allocated from them.
expect_error "--stages must be in \[1, 65536\], found 2147483647" schedule "$tmp/same.txt" --stages 2147483647
expect_error "more than the 24 layers of 'gpt-1.3b'" schedule "$tmp/same.txt" --model gpt-1.3b --stages 4 --layers-per-stage 7
# an empty field of --layer-split is named as empty (it said "must not be negative, found ''")
expect_error "layers of a stage is empty (a comma too many?)" schedule "$tmp/same.txt" --model gpt-1.3b --stages 2 --layer-split 12,12,
# --chrome-trace never overwrites an input (the micro-batch file, through a link too) and is written
# atomically (no temporary left, the file complete).
cp "$tmp/same.txt" "$tmp/in.txt"
ln -s "$tmp/in.txt" "$tmp/link.txt"
expect_error "destroy the input" schedule "$tmp/in.txt" --model gpt-1.3b --chrome-trace "$tmp/in.txt"
expect_error "destroy the input" schedule "$tmp/in.txt" --model gpt-1.3b --chrome-trace "$tmp/link.txt"
cmp -s "$tmp/same.txt" "$tmp/in.txt" || fail "the micro-batch file was changed"
"$pp" schedule "$tmp/in.txt" --model gpt-1.3b --chrome-trace "$tmp/trace.json" > /dev/null || fail "trace"
$py -c "import json,sys; assert json.load(open(sys.argv[1]))['traceEvents']" "$tmp/trace.json" || fail "trace JSON"
ls "$tmp" | grep -q "trace.json.tmp" && fail "a temporary was left"
# ... nor a file of a profile folder (read recursively), nor a --model file.
dyn=$(cd "$2" && pwd)/dynapipe/derived_from_cost_models_pkl
if [ -d "$dyn" ]; then
  mkdir -p "$tmp/prof/sub"
  cp "$dyn"/gpt_6.7b_*.csv "$tmp/prof/sub/"
  sha=$(cat "$tmp"/prof/sub/*.csv | sha256sum)
  expect_error "destroy the input" schedule "$tmp/in.txt" --profile "$tmp/prof" --chrome-trace "$tmp/prof/sub/gpt_6.7b_timing.csv"
  [[ $(cat "$tmp"/prof/sub/*.csv | sha256sum) == "$sha" ]] || fail "a profile was changed"
fi
echo '{"name": "m", "num_layers": 4, "hidden": 256, "heads": 4, "ffn_hidden": 1024, "vocab": 1000}' > "$tmp/model.json"
expect_error "destroy the input" schedule "$tmp/in.txt" --model "$tmp/model.json" --chrome-trace "$tmp/model.json"
echo "cli schedule: ok"

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

"$pp" schedule --help | grep -q "Usage" || fail "schedule --help"

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
"$pp" schedule "$tmp/same.txt" --model gpt-1.3b --stages 4 --schedule all | grep -q "wait-free-cyclic" || fail "all table"
"$pp" schedule "$tmp/same.txt" --model gpt-1.3b --stages 2 --chunks 2 --schedule interleaved-1f1b --json > "$tmp/il.json"
$py -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['schedule']=='interleaved-1f1b' and len(j['peak_memory_mb'])==2" "$tmp/il.json" \
  || fail "interleaved"
cat "$tmp/same.txt" | "$pp" schedule - --model gpt-1.3b --stages 4 --schedule 1f1b | grep -q "1f1b" || fail "stdin"

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
expect_error "recompute must be none, selective or full" schedule "$tmp/bad3.txt"
printf '# nothing\n' > "$tmp/empty.txt"
expect_error "no micro-batches" schedule "$tmp/empty.txt"
expect_error "cannot open" schedule "$tmp/missing.txt"
expect_error "unknown schedule 'pipedream'" schedule "$tmp/same.txt" --model gpt-1.3b --schedule pipedream
expect_error "1f1b needs one virtual stage per rank" schedule "$tmp/same.txt" --model gpt-1.3b --stages 2 --chunks 2 --schedule 1f1b
echo "cli schedule: ok"

#!/usr/bin/env bash
# End-to-end tests of `packpipe pack`.
# Usage: test_pack.sh PACKPIPE_BINARY FIXTURES_DIR
set -euo pipefail
pp=$1
fx=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
py=/usr/bin/python3

"$pp" pack --help | grep "Usage" > /dev/null || fail "pack --help"

# lengths: 3000 log-normal-ish samples (deterministic), and the real lengths of a Megatron fixture
$py - "$tmp" <<'PY'
import random, sys
r = random.Random(5)
with open(f"{sys.argv[1]}/one.txt", "w") as f:
    f.write("# input lengths\n")
    for _ in range(3000):
        f.write(f"{min(2048, max(1, int(r.lognormvariate(5.0, 1.0))))}\n")
with open(f"{sys.argv[1]}/two.txt", "w") as f:
    for _ in range(2000):
        f.write(f"{r.randint(1, 900)} {r.randint(0, 200)}\n")
PY

# JSON keys and the packing properties, for every algorithm
for alg in ffd bfd histogram; do
  "$pp" pack "$tmp/one.txt" --capacity 2048 --algorithm $alg --json --rows > "$tmp/$alg.json"
done
$py - "$tmp" <<'PY' || fail "pack --json one dimension"
import json, sys
d = sys.argv[1]
lengths = [int(l) for l in open(f"{d}/one.txt") if l.strip() and not l.startswith("#")]
for alg in ("ffd", "bfd", "histogram"):
    j = json.load(open(f"{d}/{alg}.json"))
    for k in ("rows", "efficiency", "algorithm", "capacity", "samples", "tokens", "seconds", "lower_bound_rows",
              "row_list"):
        assert k in j, (alg, k)
    assert j["algorithm"] == alg and j["capacity"] == 2048 and j["samples"] == len(lengths)
    assert j["rows"] == len(j["row_list"]) >= j["lower_bound_rows"] == -(-sum(lengths) // 2048)
    seen = sorted(i for row in j["row_list"] for i in row["samples"])
    assert seen == list(range(len(lengths))), alg
    for row in j["row_list"]:
        assert row["tokens"] == sum(lengths[i] for i in row["samples"]) <= 2048
    assert abs(j["efficiency"] - sum(lengths) / (j["rows"] * 2048)) < 1e-9
PY

# two dimensions from stdin
"$pp" pack - --capacity 2048 --target-capacity 256 --json --rows < "$tmp/two.txt" > "$tmp/two.json"
$py - "$tmp" <<'PY' || fail "pack --json two dimensions"
import json, sys
d = sys.argv[1]
pairs = [tuple(map(int, l.split())) for l in open(f"{d}/two.txt")]
j = json.load(open(f"{d}/two.json"))
assert j["algorithm"] == "bfd" and j["target_capacity"] == 256
assert sorted(i for r in j["row_list"] for i in r["samples"]) == list(range(len(pairs)))
for r in j["row_list"]:
    assert r["tokens"] == sum(pairs[i][0] for i in r["samples"]) <= 2048
    assert r["target_tokens"] == sum(pairs[i][1] for i in r["samples"]) <= 256
PY

# human text, deterministic output, a real length distribution (Megatron fixture records)
"$pp" pack "$tmp/one.txt" --capacity 2048 | grep "efficiency" > /dev/null || fail "text output"
"$pp" pack "$tmp/one.txt" --capacity 2048 --rows | grep "^  row 0: " > /dev/null || fail "text rows"
cmp <("$pp" pack "$tmp/one.txt" --capacity 2048 --json --rows | grep -v seconds) \
    <("$pp" pack "$tmp/one.txt" --capacity 2048 --json --rows | grep -v seconds) > /dev/null || fail "deterministic"
if [ -f "$fx/megatron-small/records.jsonl" ]; then
  $py - "$fx/megatron-small/records.jsonl" > "$tmp/real.txt" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.strip():
        r = json.loads(line)
        print(len(r.get("input_ids", [])), len(r.get("target_ids", [])))
PY
  "$pp" pack "$tmp/real.txt" --capacity 512 --target-capacity 128 --algorithm ffd --json > "$tmp/real.json"
  $py -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['rows'] >= j['lower_bound_rows'] > 0" \
      "$tmp/real.json" || fail "fixture lengths"
fi

# bad input: non-zero exit and a message naming the problem
expect_error() {
  local pattern=$1; shift
  if "$pp" "$@" > "$tmp/out" 2> "$tmp/err"; then fail "expected failure: $*"; fi
  grep -q -- "$pattern" "$tmp/err" || { cat "$tmp/err" >&2; fail "message for: $*"; }
}
printf '5\n3\nabc\n' > "$tmp/bad.txt"
expect_error "bad.txt:3: input length must be a non-negative integer" pack "$tmp/bad.txt" --capacity 10
printf '5 1\n3\n' > "$tmp/mixed.txt"
expect_error "mixed.txt:2: expected 2 column(s) like line 1, found 1" pack "$tmp/mixed.txt" --capacity 10 \
  --target-capacity 4
printf '5 1 2\n' > "$tmp/three.txt"
expect_error "three.txt:1: expected 'input_len \[target_len\]', found 3 fields" pack "$tmp/three.txt" --capacity 10
printf '5\n30\n' > "$tmp/long.txt"
expect_error "long.txt:2: sample 1 has 30 tokens, more than the capacity 10" pack "$tmp/long.txt" --capacity 10
expect_error "capacity must be positive" pack "$tmp/long.txt" --capacity 0
expect_error "pass --target-capacity" pack "$tmp/two.txt" --capacity 2048
expect_error "has no target lengths" pack "$tmp/one.txt" --capacity 2048 --target-capacity 5
expect_error "one-dimensional" pack "$tmp/two.txt" --capacity 2048 --target-capacity 256 --algorithm histogram
expect_error "cannot open" pack "$tmp/missing.txt" --capacity 10
expect_error "algorithm" pack "$tmp/one.txt" --capacity 10 --algorithm wfd
# The one lengths reader: a line that overflows, is negative, has trailing junk or a third column is
# an error at its line (never dropped or wrapped); a directory, a FIFO and an empty file are errors
# at once (no sample silently lost, nothing blocks).
printf '5\n99999999999999999999\n7\n' > "$tmp/ovf.txt"
expect_error "ovf.txt:2: input length 99999999999999999999 is too large" pack "$tmp/ovf.txt" --capacity 10
printf '5\n4294967296\n' > "$tmp/ovf32.txt"
expect_error "ovf32.txt:2: input length 4294967296 is too large; the largest accepted is 4294967295" \
  pack "$tmp/ovf32.txt" --capacity 10
printf '5\n-3\n' > "$tmp/neg.txt"
expect_error "neg.txt:2: input length must not be negative, found '-3'" pack "$tmp/neg.txt" --capacity 10
printf '5\n3x\n' > "$tmp/junk.txt"
expect_error "junk.txt:2: input length must be a non-negative integer (decimal digits only), found '3x'" \
  pack "$tmp/junk.txt" --capacity 10
printf '5 1\n3 -1\n' > "$tmp/negt.txt"
expect_error "negt.txt:2: target length must not be negative" pack "$tmp/negt.txt" --capacity 10 --target-capacity 5
printf '' > "$tmp/empty.txt"
expect_error "empty.txt: no lengths found (the file is empty)" pack "$tmp/empty.txt" --capacity 10
printf '# only a comment\n\n' > "$tmp/comments.txt"
expect_error "comments.txt: no lengths found (only blank lines and comments)" pack "$tmp/comments.txt" --capacity 10
expect_error "is a directory; expected a regular file" pack "$tmp" --capacity 10
mkfifo "$tmp/fifo"
if timeout 10 "$pp" pack "$tmp/fifo" --capacity 10 > /dev/null 2> "$tmp/err"; then fail "a FIFO was accepted"; fi
grep -q "is a FIFO; expected a regular file" "$tmp/err" || fail "FIFO: $(cat "$tmp/err")"
printf '5\r\n3 # comment\n' | "$pp" pack - --capacity 10 --json | $py -c \
  "import json,sys; j=json.load(sys.stdin); assert j['samples'] == 2 and j['tokens'] == 8, j" || fail "CRLF, comments, stdin"
# Option ranges: no wrap-around of negatives, no capacity beyond 32-bit lengths.
expect_error "expected a value >= 0, found -1" pack "$tmp/one.txt" --capacity -1
expect_error "capacity must be in \[1, 4294967295\]" pack "$tmp/one.txt" --capacity 4294967296
expect_error "target-capacity must be in \[0, 4294967295\]" pack "$tmp/two.txt" --capacity 2048 \
  --target-capacity 99999999999
# Past 64 bits, an integer option is refused with what was typed (the parser saturated it to 2^64 - 1), in
# every subcommand (one check over every integer option).
expect_error "--seed: expected a value <= 18446744073709551615, found 18446744073709551616" schedule --seed \
  18446744073709551616 --stages 2
expect_error "--capacity: expected a value <= 18446744073709551615, found 99999999999999999999999" pack "$tmp/one.txt" \
  --capacity 99999999999999999999999
echo "ok"

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
    assert mb["time_ms"] > 0 and mb["recompute"] in ("none", "selective", "full")
    assert mb["layout"] in ("padded", "packed"), mb
    assert mb["padded_len"] % 8 == 0 if mb["layout"] == "padded" else mb["rows"] == 1 and "attention" in mb
assert j["objective_ms"] > 0 and 0 < j["efficiency"] <= 1
PYEOF

# Slices are shown as slices: every token of every sample exactly once across the entries, each
# slice linked to the micro-batch holding the one before it, and counted in the summary (a sample in
# several micro-batches is a sliced sample, never a duplicate).
for i in $(seq 1 30); do echo $(( (i * 7919) % 700 + 1 )); done > "$T/sl.txt"
echo 2900 >> "$T/sl.txt"
"$BIN" partition "$T/sl.txt" $SHAPE --method slicing --capacity 512 --json > "$T/sl.json"
$PY - "$T/sl.json" "$T/sl.txt" <<'PYEOF' || fail "slices json"
import json, sys
j = json.load(open(sys.argv[1])); lengths = [int(x) for x in open(sys.argv[2])]
covered = {s: [] for s in range(len(lengths))}
sliced, slices = set(), 0
for m, mb in enumerate(j["microbatches"]):
    if "spans" not in mb:
        for s in mb["samples"]:
            covered[s].append((0, lengths[s], m, None))
        continue
    assert len(mb["spans"]) == len(mb["prev"]) == len(mb["sliced"]) == len(mb["samples"]), mb
    for s, (b, n), prev, cut in zip(mb["samples"], mb["spans"], mb["prev"], mb["sliced"]):
        covered[s].append((b, n, m, prev))
        assert cut == (not (b == 0 and n == lengths[s])), (s, b, n)
        if cut:
            sliced.add(s); slices += 1
for s, pieces in covered.items():
    pieces.sort()
    at = 0
    for k, (b, n, m, prev) in enumerate(pieces):
        assert b == at and n >= 1, (s, pieces)
        assert prev == (pieces[k - 1][2] if k > 0 else None), (s, pieces)
        at += n
    assert at == lengths[s], (s, pieces)
assert j["sliced_samples"] == len(sliced) >= 1 and j["slices"] == slices > len(sliced), (j["sliced_samples"], j["slices"])
# a micro-batch with later slices prices their kept prefixes: the attention sums say so
for mb in j["microbatches"]:
    pre = sum(b for b, n in mb.get("spans", [])) if any(mb.get("sliced", [])) else 0
    if pre:
        assert mb["attention"]["prefix_tokens"] == pre, mb
        assert mb["attention"]["prefix"] == sum(b * n for b, n in mb["spans"]), mb
    else:
        assert "prefix" not in mb.get("attention", {}), mb
PYEOF
"$BIN" partition "$T/sl.txt" $SHAPE --method slicing --capacity 512 > "$T/sl.txt.out"
grep -q "samples cut into [0-9]* slices (shown as sample\[begin:end) tokens)" "$T/sl.txt.out" || fail "slices summary: $(head -2 "$T/sl.txt.out")"
grep -q " 30\[512:1024)" "$T/sl.txt.out" || fail "slice entry text: $(cat "$T/sl.txt.out")"

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
# (slicing cuts decoder-only samples: a T5 batch does not list it)
assert set(methods) == {"dp", "dynapipe", "fixed", "fixed-packed", "tokens", "packing", "wlb", "packing-mask"}, methods.keys()
assert methods["dp"]["feasible"]
assert "best_baseline" in j and j["best_baseline"]["speedup_of_dp"] > 0, j.get("best_baseline")
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
"$BIN" partition "$T/t5big.txt" $T5SHAPE --layouts padded --order sorted --json > "$T/sorted.json"
"$BIN" partition "$T/t5big.txt" $T5SHAPE --layouts padded --order auto --threads 1 --json > "$T/auto1.json"
"$BIN" partition "$T/t5big.txt" $T5SHAPE --layouts padded --order auto --threads 2 --json > "$T/auto2.json"
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

# One rule from a global batch to lengths: partition --manifest counts the tokens `plan` plans for
# the same batch (decoder-only and encoder-decoder, whose decoder-only tasks get a one-token target).
for model in "gpt-6.7b --stages 4" "t5-11b --stages 8 --device A100-80GB"; do
  "$BIN" plan --manifest "$ROOT/data/demo/manifest.json" --model $model --global-batch-samples 96 --seed 9 \
    --iterations 3 --no-baselines --json > "$T/plan.json"
  for i in 0 2; do
    "$BIN" partition --manifest "$ROOT/data/demo/manifest.json" --model $model --global-batch-samples 96 --seed 9 \
      --batch-index $i --json > "$T/part.json"
    $PY - "$T/plan.json" "$T/part.json" $i <<'PYEOF' || fail "partition --manifest and plan disagree on batch $i ($model)"
import json, sys
plan = json.load(open(sys.argv[1])); part = json.load(open(sys.argv[2])); i = int(sys.argv[3])
it = plan["iterations"][i]
tokens = sum(mb["tokens"] for mb in part["microbatches"])
assert it["tokens"] == tokens, (it["tokens"], tokens)
assert it["samples"] == part["samples"], (it["samples"], part["samples"])
PYEOF
  done
done

# The context length: partition --manifest sees the batch `plan` plans for the same options (chunks
# named by their first token in messages); a lengths file refuses it.
for pol in truncate drop split; do
  ctx="--max-seq-len 512 --seq-policy $pol"
  "$BIN" plan --manifest "$ROOT/data/demo/manifest.json" --global-batch-tokens 16384 --seed 4 --iterations 2 \
    --no-baselines $SHAPE $ctx --json > "$T/plan.json"
  "$BIN" partition --manifest "$ROOT/data/demo/manifest.json" --global-batch-tokens 16384 --seed 4 --batch-index 1 \
    $SHAPE $ctx --json > "$T/part.json"
  $PY - "$T/plan.json" "$T/part.json" $pol <<'PYEOF' || fail "partition --manifest and plan disagree under --seq-policy $pol"
import json, sys
plan, part, pol = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
it = plan["iterations"][1]
assert sum(mb["tokens"] for mb in part["microbatches"]) == it["tokens"]
assert part["samples"] == it["samples"]
assert (part["max_seq_len"], part["seq_policy"]) == (512, pol)
for k in ("seq_truncated", "seq_dropped", "seq_split", "seq_chunks"):
    assert part[k] == it[k], (k, part[k], it[k])
assert part[{"truncate": "seq_truncated", "drop": "seq_dropped", "split": "seq_split"}[pol]] > 0, part
assert all(mb["padded_len"] <= 512 for mb in part["microbatches"] if mb["layout"] == "padded")
PYEOF
done
"$BIN" partition --manifest "$ROOT/data/demo/manifest.json" --global-batch-tokens 16384 --seed 4 $SHAPE \
  --max-seq-len 512 --seq-policy split > "$T/part.txt"
grep -q "^context length 512 (split): 0 samples truncated, 0 dropped, [1-9][0-9]* split into" "$T/part.txt" \
  || fail "partition context text: $(cat "$T/part.txt")"
if "$BIN" partition "$T/gpt.txt" $SHAPE --max-seq-len 512 2> "$T/err.txt"; then fail "--max-seq-len on a lengths file"; fi
grep -q "apply to a batch sampled from a dataset" "$T/err.txt" || fail "lengths file message: $(cat "$T/err.txt")"
if "$BIN" partition --manifest "$ROOT/data/demo/manifest.json" --global-batch-tokens 16384 --model t5-11b \
     --stages 8 --device A100-80GB --max-seq-len 512 --seq-policy split 2> "$T/err.txt"; then fail "t5 split accepted"; fi
grep -q -- "--seq-policy 'split' is for decoder-only models" "$T/err.txt" || fail "t5 split message: $(cat "$T/err.txt")"

# Oversize: error names the sample and its length; drop and truncate count it.
printf "100\n1000000\n50\n" > "$T/big.txt"
if "$BIN" partition "$T/big.txt" $SHAPE 2> "$T/err.txt"; then fail "oversize accepted"; fi
grep -q "sample 1 at $T/big.txt:2 (length 1000000)" "$T/err.txt" || fail "oversize message: $(cat "$T/err.txt")"
# a decoder-only sample that cannot fit alone is cut into slices by default; here even slices cannot fit
grep -q -- "nor when cut into slices of at least 64 tokens.*--oversize truncate or drop" "$T/err.txt" \
  || fail "oversize message names no option: $(cat "$T/err.txt")"
# without slicing the message offers it
if "$BIN" partition "$T/big.txt" $SHAPE --slicing off 2> "$T/err.txt"; then fail "oversize accepted, slicing off"; fi
grep -q -- "even alone.*--oversize truncate, drop or slice" "$T/err.txt" || fail "slicing off message: $(cat "$T/err.txt")"
"$BIN" partition "$T/big.txt" $SHAPE --oversize drop --json | $PY -c "import json,sys; assert json.load(sys.stdin)['dropped'] == [1]" || fail "drop"
"$BIN" partition "$T/big.txt" $SHAPE --oversize truncate --json | $PY -c "import json,sys; assert json.load(sys.stdin)['truncated'] == [1]" || fail "truncate"

# Bad inputs.
echo "12 x" > "$T/bad.txt"
if "$BIN" partition "$T/bad.txt" $SHAPE 2> "$T/err.txt"; then fail "bad file accepted"; fi
grep -q "bad.txt:1" "$T/err.txt" || fail "bad file message"
if "$BIN" partition "$T/gpt.txt" $SHAPE --method fixed 2> "$T/err.txt"; then fail "fixed without --mbs"; fi
grep -q -- "needs a micro-batch size (mbs / --mbs)" "$T/err.txt" || fail "fixed message"
# Lengths files (item 7): the shared reader refuses what it cannot read, at its line; nothing is
# dropped silently (3 lines with one overflowing used to give 2 samples and rc 0).
err() {  # err PATTERN ARGS...: the command fails and its message has PATTERN
  local pat=$1; shift
  if "$BIN" "$@" > "$T/out.txt" 2> "$T/err.txt"; then fail "accepted: $*"; fi
  grep -q -- "$pat" "$T/err.txt" || fail "message for $*: $(cat "$T/err.txt")"
}
printf "100\n99999999999999999999\n50\n" > "$T/ovf.txt"
err "ovf.txt:2: input length 99999999999999999999 is too large" partition "$T/ovf.txt" $SHAPE
printf "100\n4294967296\n" > "$T/ovf32.txt"
err "ovf32.txt:2: input length 4294967296 is too large" partition "$T/ovf32.txt" $SHAPE
printf "100\n-7\n" > "$T/neg.txt"
err "neg.txt:2: input length must not be negative" partition "$T/neg.txt" $SHAPE
printf "100\n1e3\n" > "$T/float.txt"
err "float.txt:2: input length must be a non-negative integer" partition "$T/float.txt" $SHAPE
printf "100 5 6\n" > "$T/three.txt"
err "three.txt:1: expected 'input_len \[target_len\]', found 3 fields" partition "$T/three.txt" $SHAPE
printf "" > "$T/empty.txt"
err "no lengths found" partition "$T/empty.txt" $SHAPE
err "is a directory; expected a regular file" partition "$T" $SHAPE
mkfifo "$T/fifo"
if timeout 10 "$BIN" partition "$T/fifo" $SHAPE > /dev/null 2> "$T/err.txt"; then fail "FIFO accepted"; fi
grep -q "is a FIFO" "$T/err.txt" || fail "FIFO message: $(cat "$T/err.txt")"
printf "100\n0\n" > "$T/zero.txt"
err "sample 1 at $T/zero.txt:2 has input length 0" partition "$T/zero.txt" $SHAPE
printf "4000000000 4000000000\n" > "$T/sum.txt"
err "sum.txt:1: input 4000000000 + target 4000000000 = 8000000000 tokens" partition "$T/sum.txt" $SHAPE
# Every sample of a 3-line file is there (ids 0..2).
printf "100\n200\n50\n" > "$T/three_ok.txt"
"$BIN" partition "$T/three_ok.txt" $SHAPE --json | $PY -c \
  "import json,sys; j=json.load(sys.stdin); assert j['samples']==3 and sorted(x for m in j['microbatches'] for x in m['samples'])==[0,1,2], j" \
  || fail "3 samples"

# Option ranges (item 14): no huge allocation, no model with more layers than the real one, no tp
# that does not divide the heads, no memory limit that overflows a byte count.
err "--stages must be in \[1, 65536\], found 2147483647" partition "$T/three_ok.txt" --stages 2147483647
err "--chunks must be in \[1, 65536\]" partition "$T/three_ok.txt" --chunks 9999999999
err "--dp must be in \[1, 65536\]" partition "$T/three_ok.txt" --dp 4294967296
err "--tp must be in \[1, 65536\]" partition "$T/three_ok.txt" --tp 100000
err "layers_per_stage (--layers-per-stage) 1000 x 4 virtual stages (stages 4 x chunks 1) = 4000 layers, more than the 32 layers" \
  partition "$T/three_ok.txt" --stages 4 --layers-per-stage 1000
err "use layers_per_stage at most 8" partition "$T/three_ok.txt" --stages 4 --layers-per-stage 9
err "64 virtual stages exceed the 32 layers" partition "$T/three_ok.txt" --stages 64
err "layers_per_stage (--layers-per-stage) 13 x 2 stages per side = 26 layers" \
  partition "$T/t5.txt" --model t5-11b --stages 4 --layers-per-stage 13
err "tp 3 must divide the attention heads (32)" partition "$T/three_ok.txt" --tp 3 --memory-mb 1000000
err "--memory-mb: must be in \[0, 1000000000\]" partition "$T/three_ok.txt" --memory-mb 1e12
# A limit over the device's memory would call plans feasible that cannot run (plan and partition).
err "of 50000 MB is above the 40000 MB of the device (A100-40GB)" partition "$T/three_ok.txt" --memory-mb 50000
err "of 50000 MB is above the 40000 MB of the device (A100-40GB)" plan --manifest "$ROOT/data/demo/manifest.json" \
  --global-batch-tokens 16384 --iterations 1 --memory-mb 50000
err "--round-multiple must be in \[1, 65536\]" partition "$T/three_ok.txt" $SHAPE --round-multiple 0
err "--round-multiple must be in \[1, 65536\]" partition "$T/three_ok.txt" $SHAPE --round-multiple 4611686018427387904
err "--threads must be in \[0, 1024\]" partition "$T/three_ok.txt" $SHAPE --threads 100000
err "expected a value >= 0, found -1" partition --manifest "$ROOT/data/demo/manifest.json" --global-batch-tokens -1 $SHAPE
err "--global-batch-tokens must be in \[0, 1099511627776\]" partition --manifest "$ROOT/data/demo/manifest.json" \
  --global-batch-tokens 18446744073709551615 $SHAPE
err "--global-batch-samples must be in \[0, 2147483647\]" partition --manifest "$ROOT/data/demo/manifest.json" \
  --global-batch-samples 4294967296 $SHAPE
# A model state over the memory limit: the message says so (no sample can fit; truncate or drop
# cannot help), whatever the oversize policy (drop used to give 0 micro-batches and rc 0).
for pol in error truncate drop; do
  err "the model state of rank 0 .* needs [0-9]* MB, more than the 100 MB memory limit" \
    partition "$T/three_ok.txt" --stages 4 --memory-mb 100 --oversize $pol
done
grep -q "cannot help" "$T/err.txt" || fail "model state message: $(cat "$T/err.txt")"
# A sampled batch names the dataset sample (task and index), not its place in the batch.
err "global batch 0, task '[a-z_]*', dataset sample [0-9]* (length" partition --manifest "$ROOT/data/demo/manifest.json" \
  --global-batch-tokens 65536 --stages 4 --layers-per-stage 4 --memory-mb 17000
echo OK

#!/usr/bin/env bash
# Hostile inputs across the CLI: each ends in a clear error (file, line or field; what was expected)
# with exit status 1 or 2, never a crash (status >= 128), a hang, or a silent success.
# Usage: test_robustness.sh PACKPIPE_BINARY FIXTURES_DIR
set -uo pipefail
pp=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
py=/usr/bin/python3

# expect_error WHAT PATTERN CMD...: fails unless CMD exits 1..127 within 60 s and stderr matches.
expect_error() {
  local what=$1 pattern=$2; shift 2
  timeout 60 "$pp" "$@" > "$tmp/out" 2> "$tmp/err"
  local rc=$?
  ((rc == 124)) && fail "$what: hung"
  ((rc == 0)) && fail "$what: accepted"
  ((rc >= 128)) && fail "$what: crashed with status $rc: $(tail -3 "$tmp/err")"
  grep -q -- "$pattern" "$tmp/err" || fail "$what: expected /$pattern/ in: $(cat "$tmp/err")"
}

# JSON: nesting bounded (no stack overflow), duplicate keys refused, in every reader.
$py -c "print('{\"version\": 1, \"tasks\": ' + '[' * 200000 + ']' * 200000 + '}')" > "$tmp/deep.json"
expect_error "deep manifest" "deeper than 64" dataset sample "$tmp/deep.json" --global-batch-tokens 100
cat > "$tmp/dup.json" <<JSON
{"version": 1, "tasks": [{"name": "a", "dataset": "$root/data/demo/demo_define_inputs_document"}], "tasks": []}
JSON
expect_error "duplicate tasks key" 'duplicate key "tasks"' dataset sample "$tmp/dup.json" --global-batch-tokens 100
expect_error "deep plan JSON" "deeper than 64" plan inspect "$tmp/deep.json"
echo '{"model": "x", "model": "y"}' > "$tmp/dupmodel.json"
expect_error "duplicate key in a model file" 'duplicate key "model"' costmodel query --model "$tmp/dupmodel.json" --seq 128

# A plan that decodes but is inconsistent: inspect lists the violations instead of crashing.
"$pp" plan --manifest "$root/data/demo/manifest.json" --global-batch-tokens 16384 --iterations 1 --stages 2 \
  --layers-per-stage 4 --no-baselines --out "$tmp/good.plan" > /dev/null || fail "planning"
"$pp" plan inspect "$tmp/good.plan" --json > "$tmp/good.json" || fail "inspect --json"
$py - "$tmp" <<'PY' || fail "making the inconsistent plan"
import json, sys
j = json.load(open(sys.argv[1] + "/good.json"))
j["stage_rank"] = [0] * len(j["stage_rank"])  # rank 1 runs no stage: the validator stops early
open(sys.argv[1] + "/bad_plan.json", "w").write(json.dumps(j))
PY
timeout 60 "$pp" plan inspect "$tmp/bad_plan.json" > "$tmp/out" 2> "$tmp/err"
rc=$?
((rc < 128)) || fail "plan inspect crashed on an inconsistent plan (status $rc)"
grep -q "violation" "$tmp/out" "$tmp/err" || fail "plan inspect: no violation named: $(cat "$tmp/out" "$tmp/err")"
if "$pp" plan validate "$tmp/bad_plan.json" > /dev/null 2>&1; then fail "an inconsistent plan validated"; fi

# dataset build: type errors and names at their line; collisions before anything is written.
printf '{"input_ids": [1, 2]}\n{"task": 7, "input_ids": [3]}\n' > "$tmp/num.jsonl"
expect_error "numeric task name" "num.jsonl:2: 'task' must be a string" dataset build --input "$tmp/num.jsonl" \
  --output-prefix "$tmp/o1" --split-by-task
printf '{"task": "a", "input_ids": [1]}\n{"task": "", "input_ids": [3]}\n' > "$tmp/empty.jsonl"
expect_error "empty task name" "empty.jsonl:2: empty task name" dataset build --input "$tmp/empty.jsonl" \
  --output-prefix "$tmp/o2" --split-by-task
printf '{"task": "a/b", "input_ids": [1]}\n{"task": "a_b", "input_ids": [3]}\n' > "$tmp/coll.jsonl"
expect_error "sanitised names collide" "both become the output prefix" dataset build --input "$tmp/coll.jsonl" \
  --output-prefix "$tmp/o3" --split-by-task
ls "$tmp" | grep -q "^o3" && fail "a refused build left files: $(ls "$tmp" | grep '^o3')"
printf '{"input_ids": [1, 9223372036854775808]}\n' > "$tmp/big.jsonl"
expect_error "token 2^63" "token id 9223372036854775808 is too large" dataset build --input "$tmp/big.jsonl" \
  --output-prefix "$tmp/o4"
printf '{"input_ids": [1], "input_ids": [2]}\n' > "$tmp/dupkey.jsonl"
expect_error "duplicate key in JSON lines" 'dupkey.jsonl:1: duplicate key "input_ids"' dataset build \
  --input "$tmp/dupkey.jsonl" --output-prefix "$tmp/o5"

# Lengths files: a FIFO or a directory is refused at once; an overflowing line is not dropped.
mkfifo "$tmp/fifo"
expect_error "FIFO lengths file" "FIFO" partition "$tmp/fifo" --stages 2
expect_error "directory lengths file" "directory" partition "$tmp" --stages 2
printf '100\n99999999999999999999\n300\n' > "$tmp/over.txt"
expect_error "overflowing length" "over.txt:2" partition "$tmp/over.txt" --stages 2
mkfifo "$tmp/fifo.idx"
: > "$tmp/fifo.bin"
expect_error "FIFO .idx" "FIFO" dataset info "$tmp/fifo"

# Datasets: a corrupt size is refused at open by every command that reads it.
cp "$root/data/demo/demo_define_inputs_document".{idx,bin} "$tmp/"
$py - "$tmp/demo_define_inputs_document.idx" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
struct.pack_into("<i", b, 34 + 4 * 3, 2**31 - 1)   # the 4th size
open(sys.argv[1], "wb").write(b)
PY
for cmd in "dataset info" "dataset sample --global-batch-tokens 1000"; do
  # shellcheck disable=SC2086
  expect_error "corrupt size: $cmd" "the index is corrupt" ${cmd%% *} ${cmd#* } "$tmp/demo_define_inputs_document"
done
if "$pp" dataset verify "$tmp/demo_define_inputs_document" > /dev/null 2>&1; then fail "verify passed a corrupt size"; fi
echo "cli robustness tests: ok"

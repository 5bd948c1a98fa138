#!/usr/bin/env bash
# Outputs never destroy inputs: every command that writes refuses an output that resolves to one of
# its inputs (same path, "./", a symbolic or a hard link), writes atomically (nothing at the path
# after a failure), and refuses a second concurrent writer of the same output.
# Usage: test_outputs.sh PACKPIPE_BINARY FIXTURES_DIR
set -uo pipefail
pp=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cp -r "$root/data/demo" "$tmp/demo"
sums() { (cd "$tmp/demo" && sha256sum ./*.idx ./*.bin manifest.json); }
sums > "$tmp/before"
d=$tmp/demo
m=$d/manifest.json
task=$d/demo_define_inputs_document
ln -s "$task.idx" "$tmp/sym.idx"
ln "$task.bin" "$tmp/hard.bin"
plan=(plan --manifest "$m" --global-batch-tokens 16384 --iterations 2 --stages 2 --layers-per-stage 4 --no-baselines)

# refused: the command must fail, name the output, and say why
refused() {
  local what=$1; shift
  if "$pp" "$@" > "$tmp/out" 2> "$tmp/err"; then fail "$what: accepted: $*"; fi
  grep -q "destroy the input" "$tmp/err" || fail "$what: unclear message: $(cat "$tmp/err")"
}
refused "plan --out a dataset .idx" "${plan[@]}" --out "$task.idx"
refused "plan --out a dataset .bin" "${plan[@]}" --out "$task.bin"
refused "plan --out via ./" "${plan[@]}" --out "$d/./demo_define_inputs_document.idx"
refused "plan --out a symlink to an input" "${plan[@]}" --out "$tmp/sym.idx"
refused "plan --out a hard link to an input" "${plan[@]}" --out "$tmp/hard.bin"
refused "plan --report the manifest" "${plan[@]}" --report "$m"
refused "plan --chrome-trace a target dataset" "${plan[@]}" --chrome-trace "$d/demo_define_targets_document.bin"
(cd "$d" && refused "plan --out relative" "${plan[@]}" --out demo_define_inputs_document.idx) || exit 1
refused "merge into the first input" dataset merge "$task" "$d/demo_synonyms_inputs_document" --output-prefix "$task"
refused "merge into the second input" dataset merge "$d/demo_synonyms_inputs_document" "$task" --output-prefix "$task"
(cd "$d" && refused "merge into ./A" dataset merge ./demo_define_inputs_document demo_synonyms_inputs_document \
  --output-prefix ./demo_define_inputs_document) || exit 1
refused "merge into a symlink of an input" dataset merge "$task" --output-prefix "$tmp/sym"

# The plan file an export reads is not its output.
"$pp" "${plan[@]}" --out "$tmp/p.plan" > /dev/null || fail "plan"
refused "export onto the plan file" plan export "$tmp/p.plan" --chrome-trace "$tmp/p.plan"
"$pp" plan validate "$tmp/p.plan" > /dev/null || fail "the plan file was damaged"

# Nothing an input: every input byte-identical after all of the above.
sums | diff "$tmp/before" - > /dev/null || fail "an input changed"

# The file records the iterations the run was to plan (token budgets counted by a dry run).
"$pp" plan validate "$tmp/p.plan" | grep -q "(iterations 0..1, complete)" || fail "plan file completeness record"
"$pp" plan --manifest "$m" --global-batch-tokens 16384 --stages 2 --layers-per-stage 4 --no-baselines \
  --out "$tmp/e.plan" --json > "$tmp/e.json" || fail "whole-epoch plan"
n=$(/usr/bin/python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['iterations']))" "$tmp/e.json")
"$pp" plan validate "$tmp/e.plan" | grep -q "(iterations 0..$((n - 1)), complete)" || fail "whole-epoch completeness"

# A run that fails leaves nothing at its output, and never a file that validates.
if "$pp" plan --manifest "$m" --global-batch-tokens 65536 --iterations 2 --memory-mb 20000 --layers-per-stage 8 \
     --out "$tmp/failed.plan" > /dev/null 2>&1; then fail "an impossible plan succeeded"; fi
[[ ! -e $tmp/failed.plan ]] || fail "a failed plan run left $tmp/failed.plan"
ls "$tmp" | grep -q "failed.plan.tmp" && fail "a failed plan run left its temporary"

# Two concurrent writers of one output: while another process holds the output's lock (as a
# running packpipe does), a second writer fails at once, naming the output, and writes nothing.
/usr/bin/python3 - "$tmp/c.plan.lock" <<'PY' &
import fcntl, sys, time
f = open(sys.argv[1], "w")
fcntl.flock(f, fcntl.LOCK_EX)
open(sys.argv[1] + ".held", "w").close()
time.sleep(30)
PY
pids+=($!)
for _ in $(seq 200); do [[ -e $tmp/c.plan.lock.held ]] && break; sleep 0.05; done
[[ -e $tmp/c.plan.lock.held ]] || fail "the lock holder did not start"
if "$pp" "${plan[@]}" --out "$tmp/c.plan" 2> "$tmp/err" > /dev/null; then fail "a second concurrent writer succeeded"; fi
grep -q "another process is writing" "$tmp/err" || fail "second writer: $(cat "$tmp/err")"
[[ ! -e $tmp/c.plan ]] || fail "the refused writer left a file"
kill -9 "${pids[0]}" 2>/dev/null
wait "${pids[0]}" 2>/dev/null
"$pp" "${plan[@]}" --out "$tmp/c.plan" > /dev/null || fail "writing after the lock was released"
"$pp" plan validate "$tmp/c.plan" > /dev/null || fail "the plan file does not validate"
# Two outputs of one command at one path: refused before anything is written, naming both, whether
# the path exists or not, however it is spelt, and whichever outputs collide (one given as an
# option, one derived from a prefix, or two derived ones).
same() {
  local what=$1; shift
  if "$pp" "$@" > "$tmp/out" 2> "$tmp/err"; then fail "$what: accepted: $*"; fi
  grep -q "are the same file" "$tmp/err" || fail "$what: unclear message: $(cat "$tmp/err")"
}
mkdir "$tmp/b"
printf '{"input_ids":[1,2],"target_ids":[3]}\n' > "$tmp/pairs.jsonl"
same "build --manifest onto its own dataset's index" dataset build --input "$tmp/pairs.jsonl" \
  --output-prefix "$tmp/b/out3" --manifest "$tmp/b/out3_inputs_document.idx"
same "build --manifest onto its own .bin, spelt with .." dataset build --input "$tmp/pairs.jsonl" \
  --output-prefix "$tmp/b/out3" --manifest "$tmp/b/x/../out3_targets_document.bin"
printf '{"task":"x","input_ids":[1],"target_ids":[2]}\n{"task":"x_inputs_document","input_ids":[5]}\n' \
  > "$tmp/collide.jsonl"
same "build: a task's dataset is another task's" dataset build --input "$tmp/collide.jsonl" \
  --output-prefix "$tmp/b/c" --split-by-task
[[ -z $(ls -A "$tmp/b") ]] || fail "a refused build left files: $(ls "$tmp/b")"
same "plan --out and --report" "${plan[@]}" --out "$tmp/b/s.json" --report "$tmp/b/./s.json"
same "plan --chrome-trace and --report, one a lock file of the other" "${plan[@]}" --chrome-trace "$tmp/b/t.json" \
  --report "$tmp/b/t.json.lock"
# An input named like an output's lock file is never taken (and removed) as the lock.
cp "$m" "$d/copy.json.lock"
if "$pp" plan --manifest "$d/copy.json.lock" --global-batch-tokens 16384 --iterations 1 --stages 2 \
     --layers-per-stage 4 --no-baselines --report "$d/copy.json" > /dev/null 2> "$tmp/err"; then
  fail "plan --report beside an input named as its lock file"
fi
grep -q "lock file" "$tmp/err" || fail "lock file message: $(cat "$tmp/err")"
cmp -s "$m" "$d/copy.json.lock" || fail "the input named as a lock file changed"
rm "$d/copy.json.lock"

echo "cli output tests: ok"

#!/usr/bin/env bash
# End-to-end tests of `packpipe dataset ...` on the real Megatron fixtures.
# Usage: test_dataset.sh PACKPIPE_BINARY FIXTURES_DIR
set -euo pipefail
pp=$1
fx=$2/megatron-small
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
py=/usr/bin/python3

# --help on every subcommand
for sub in info verify build compress decompress merge sample; do
  "$pp" dataset "$sub" --help | grep "Usage" > /dev/null || fail "dataset $sub --help"
done

# info --json has the documented keys and the fixture's values
"$pp" dataset info "$fx/wordnet_multiseq_int32" --json > "$tmp/info.json"
$py - "$tmp/info.json" <<'PY' || fail "info --json values"
import json, sys
j = json.load(open(sys.argv[1]))
assert (j["format"], j["version"], j["dtype"], j["sequences"], j["documents"], j["tokens"]) == ("MMIDIDX", 1, "int32", 96, 48, 722), j
PY
"$pp" dataset info "$fx/wordnet_legacy_tntidx_int32.idx" | grep "TNTIDX" > /dev/null || fail "info on TNTIDX"

# verify: every fixture passes; a corrupted copy fails with status 1 and names the index
for p in wordnet_gpt2_text_document wordnet_mt_inputs_document wordnet_multiseq_int32 wordnet_modes_uint16 wordnet_legacy_tntidx_int32; do
  "$pp" dataset verify "$fx/$p" > /dev/null || fail "verify $p"
done
cp "$fx/wordnet_gpt2_text_document.idx" "$fx/wordnet_gpt2_text_document.bin" "$tmp/"
$py - "$tmp/wordnet_gpt2_text_document.idx" <<'PY'
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
S = 64
off = 34 + 4 * S + 8 * 10          # pointers[10]
struct.pack_into("<q", b, off, struct.unpack_from("<q", b, off)[0] + 2)
open(p, "wb").write(bytes(b))
PY
set +e
"$pp" dataset verify "$tmp/wordnet_gpt2_text_document" > "$tmp/verify.txt" 2>&1
rc=$?
set -e
[[ $rc == 1 ]] || fail "verify of a corrupt dataset returned $rc"
grep -q "10" "$tmp/verify.txt" || fail "verify does not name sequence 10: $(cat "$tmp/verify.txt")"

# build reproduces Megatron's bytes for the paired inputs/targets fixtures
$py - "$fx/records.jsonl" "$tmp/records.jsonl" <<'PY'
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for line in f:
        r = json.loads(line)
        out.write(json.dumps({"input_ids": r["input_ids"], "target_ids": r["target_ids"]}) + "\n")
PY
"$pp" dataset build --input "$tmp/records.jsonl" --output-prefix "$tmp/mt" --append-eod 50256 --json > "$tmp/build.json"
cmp "$tmp/mt_inputs_document.bin" "$fx/wordnet_mt_inputs_document.bin" || fail "inputs .bin differs"
cmp "$tmp/mt_inputs_document.idx" "$fx/wordnet_mt_inputs_document.idx" || fail "inputs .idx differs"
cmp "$tmp/mt_targets_document.bin" "$fx/wordnet_mt_targets_document.bin" || fail "targets .bin differs"
cmp "$tmp/mt_targets_document.idx" "$fx/wordnet_mt_targets_document.idx" || fail "targets .idx differs"
(cd "$fx" && sha256sum --quiet -c SHA256SUMS) || fail "fixture checksums"

# build --split-by-task writes a manifest the sampler can read
"$pp" dataset build --input "$fx/records.jsonl" --output-prefix "$tmp/split/wn" --split-by-task \
  --append-eod 50256 --manifest "$tmp/split/manifest.json" > /dev/null
"$pp" dataset info "$tmp/split/manifest.json" --json > "$tmp/minfo.json"
$py - "$tmp/minfo.json" <<'PY' || fail "manifest info"
import json, sys
j = json.load(open(sys.argv[1]))
assert [t["name"] for t in j["tasks"]] == ["define", "example", "synonyms"], j
assert j["samples"] == 144, j
PY
"$pp" dataset sample "$tmp/split/manifest.json" --global-batch-tokens 1024 --batches 3 --json > /dev/null
# sample --max-seq-len: each batch as planning sees it (planner::batch_lengths), besides the sampled one
for pol in truncate drop split; do
  "$pp" dataset sample "$root/data/demo/manifest.json" --global-batch-tokens 16384 --batches 4 --max-seq-len 256 \
    --seq-policy $pol --json > "$tmp/ctx.json" || fail "dataset sample --seq-policy $pol"
  $py - "$tmp/ctx.json" $pol <<'PY' || fail "dataset sample --seq-policy $pol"
import json, sys
j, pol = json.load(open(sys.argv[1])), sys.argv[2]
assert (j["max_seq_len"], j["seq_policy"]) == (256, pol)
for b in j["batches"]:
    assert b["seq_max_sample_tokens"] <= 256 < b["max_sample_tokens"], b
    if pol == "truncate":
        assert b["seq_samples"] == b["samples"] and b["seq_truncated"] > 0 and b["seq_tokens"] < b["tokens"]
    elif pol == "drop":
        assert b["seq_samples"] == b["samples"] - b["seq_dropped"] and b["seq_dropped"] > 0
    else:
        assert b["seq_tokens"] == b["tokens"] and b["seq_samples"] == b["samples"] - b["seq_split"] + b["seq_chunks"]
PY
done
"$pp" dataset sample "$root/data/demo/manifest.json" --global-batch-tokens 16384 --batches 1 --max-seq-len 256 \
  --max-target-len 32 --encoder-decoder > "$tmp/ctx.txt" || fail "dataset sample --encoder-decoder"
grep -q "within the context length: [0-9]* samples" "$tmp/ctx.txt" || fail "sample text: $(cat "$tmp/ctx.txt")"
if "$pp" dataset sample "$root/data/demo/manifest.json" --global-batch-tokens 16384 --max-seq-len 256 \
     --max-target-len 32 2> "$tmp/err.txt"; then fail "--max-target-len without --encoder-decoder"; fi
grep -q -- "--max-target-len 32 is for encoder-decoder models" "$tmp/err.txt" || fail "message: $(cat "$tmp/err.txt")"
"$pp" dataset verify "$tmp/split/manifest.json" > /dev/null || fail "verify manifest"

# sample --batches 0: the whole epoch, streamed as one JSON object (every sample once, the state at
# the end carries its check); the text form prints a line per batch
"$pp" dataset sample "$root/data/demo/manifest.json" --global-batch-tokens 4096 --batches 0 --dp 2 --json \
  > "$tmp/epoch.json" || fail "dataset sample --batches 0"
$py - "$tmp/epoch.json" <<'PY' || fail "dataset sample --batches 0 --json"
import json, sys
j = json.load(open(sys.argv[1]))
b = j["batches"]
assert [x["index"] for x in b] == list(range(len(b))), "batches out of order"
assert sum(x["samples"] for x in b) == j["epoch_samples"], (sum(x["samples"] for x in b), j["epoch_samples"])
assert all(sum(r["samples"] for r in x["ranks"]) == x["samples"] for x in b)
assert j["state"]["position"] == j["epoch_samples"] and j["state"]["batch_index"] == len(b), j["state"]
assert len(j["state"]["check"]) == 16, j["state"]
PY
n=$("$pp" dataset sample "$root/data/demo/manifest.json" --global-batch-tokens 4096 --batches 0 | grep -c "^  batch ")
[ "$n" = "$($py -c "import json; print(len(json.load(open('$tmp/epoch.json'))['batches']))")" ] \
  || fail "text form: $n batch lines"

# bad JSON lines name the line
printf '{"input_ids":[1,2]}\n{"input_ids":[1,-5]}\n' > "$tmp/bad.jsonl"
if "$pp" dataset build --input "$tmp/bad.jsonl" --output-prefix "$tmp/bad" 2> "$tmp/err.txt"; then fail "negative id accepted"; fi
grep -q "bad.jsonl:2" "$tmp/err.txt" || fail "error does not name line 2: $(cat "$tmp/err.txt")"
# an id past what --dtype auto chooses: named at its line, with the --dtype to give (it named no line and a --dtype
# the user had not given)
printf '{"input_ids":[1]}\n{"input_ids":[4294967296]}\n' > "$tmp/wide.jsonl"
if "$pp" dataset build --input "$tmp/wide.jsonl" --output-prefix "$tmp/wide" 2> "$tmp/err.txt"; then fail "wide id accepted"; fi
grep -q "wide.jsonl:2: token id 4294967296 does not fit int32 (--dtype auto .* give --dtype int64)" "$tmp/err.txt" \
  || fail "wide id: $(cat "$tmp/err.txt")"
"$pp" dataset build --input "$tmp/wide.jsonl" --output-prefix "$tmp/wide" --dtype int64 > /dev/null || fail "int64 build"

# compress / decompress: zstd -d gives back the exact .bin; reads through .bin.zst match
cp "$fx/wordnet_mt_targets_document.idx" "$fx/wordnet_mt_targets_document.bin" "$tmp/"
"$pp" dataset compress "$tmp/wordnet_mt_targets_document" --frame-size 1024 > /dev/null
zstd -q -d -c "$tmp/wordnet_mt_targets_document.bin.zst" | cmp - "$fx/wordnet_mt_targets_document.bin" || fail "zstd -d differs"
mv "$tmp/wordnet_mt_targets_document.bin" "$tmp/orig.bin"
"$pp" dataset info "$tmp/wordnet_mt_targets_document" --json | grep '"storage": "bin.zst"' > /dev/null || fail "info on .bin.zst"
"$pp" dataset verify "$tmp/wordnet_mt_targets_document" > /dev/null || fail "verify .bin.zst"
"$pp" dataset decompress "$tmp/wordnet_mt_targets_document" > /dev/null
cmp "$tmp/wordnet_mt_targets_document.bin" "$tmp/orig.bin" || fail "decompress differs"
# an existing .bin is not replaced without --force; a .bin.zst that does not match the index is refused
# before anything is written (a stale .bin.zst had replaced a good .bin, exit 0)
if "$pp" dataset decompress "$tmp/wordnet_mt_targets_document" 2> "$tmp/err.txt"; then fail "existing .bin replaced"; fi
grep -q "wordnet_mt_targets_document.bin exists" "$tmp/err.txt" || fail "no refusal: $(cat "$tmp/err.txt")"
cp "$tmp/wordnet_mt_targets_document.bin.zst" "$tmp/stale.bin.zst"
cp "$fx/wordnet_mt_inputs_document.idx" "$tmp/stale.idx"
if "$pp" dataset decompress "$tmp/stale" 2> "$tmp/err.txt"; then fail "stale .bin.zst decompressed"; fi
grep -q "data size mismatch" "$tmp/err.txt" || fail "stale .bin.zst: $(cat "$tmp/err.txt")"
[ ! -e "$tmp/stale.bin" ] || fail "stale .bin.zst left a .bin"
"$pp" dataset decompress "$tmp/wordnet_mt_targets_document" --force > /dev/null || fail "--force"
cmp "$tmp/wordnet_mt_targets_document.bin" "$tmp/orig.bin" || fail "decompress --force differs"

# a document index out of order: info names it (it read past the sizes: a segfault, or garbage figures)
for v in -1 4611686018427387904; do
  cp "$fx/wordnet_gpt2_text_document.bin" "$tmp/badidx.bin"
  /usr/bin/python3 -c "
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
S = struct.unpack_from('<Q', b, 18)[0]
struct.pack_into('<q', b, 34 + 12 * S + 8 * 5, int(sys.argv[3]))
open(sys.argv[2], 'wb').write(b)" "$fx/wordnet_gpt2_text_document.idx" "$tmp/badidx.idx" "$v"
  if "$pp" dataset info "$tmp/badidx" --json > /dev/null 2> "$tmp/err.txt"; then fail "doc_idx $v accepted by info"; fi
  grep -q "doc_idx\[5\]" "$tmp/err.txt" || fail "doc_idx $v: $(cat "$tmp/err.txt")"
done

# merge: inputs + targets = one dataset with 288 sequences
"$pp" dataset merge "$fx/wordnet_mt_inputs_document" "$fx/wordnet_mt_targets_document" --output-prefix "$tmp/merged" --json > "$tmp/merge.json"
grep -q '"sequences": 288' "$tmp/merge.json" || fail "merge count"
"$pp" dataset verify "$tmp/merged" > /dev/null || fail "verify merged"

# a missing dataset is a clear error, exit status 1
if "$pp" dataset info "$tmp/nope" 2> "$tmp/err.txt"; then fail "missing dataset accepted"; fi
grep -q "nope.idx" "$tmp/err.txt" || fail "missing file not named: $(cat "$tmp/err.txt")"
echo "cli dataset tests: ok"

# The C++ example samples what the manifest says (its split, weights and samples_per_epoch), as
# `dataset sample` does: it sampled every sample of every split, unweighted.
example="$(dirname "$pp")/examples/sample_batches"
[ -x "$example" ] || fail "the example $example is not built beside packpipe"
{
  demo="$(cd "$(dirname "$0")/../.." && pwd)/data/demo"
  printf '{"version": 1, "split": "10,45,45", "tasks": [{"name": "define", "inputs": "%s", "targets": "%s"}]}\n' \
    "$demo/demo_define_inputs_document" "$demo/demo_define_targets_document" > "$tmp/split.json"
  printf '{"version": 1, "samples_per_epoch": 3000, "tasks": [{"name": "define", "weight": 1, "inputs": "%s", "targets": "%s"}, {"name": "synonyms", "weight": 3, "inputs": "%s", "targets": "%s"}]}\n' \
    "$demo/demo_define_inputs_document" "$demo/demo_define_targets_document" \
    "$demo/demo_synonyms_inputs_document" "$demo/demo_synonyms_targets_document" > "$tmp/weights.json"
  for m in split weights; do
    got=$("$example" "$tmp/$m.json")
    want=$("$pp" dataset sample "$tmp/$m.json" --global-batch-tokens 65536 --seed 1234 --json | /usr/bin/python3 -c "
import json, sys
b = json.load(sys.stdin)['batches']
print(f'{len(b)} global batches, {sum(x[\"tokens\"] for x in b)} tokens in epoch 0')")
    [ "$got" = "$want" ] || fail "example on $m.json: '$got', dataset sample: '$want'"
  done
}

#!/usr/bin/env bash
# End-to-end tests of `packpipe costmodel show|query`.
# Usage: test_costmodel.sh PACKPIPE_BINARY FIXTURES_DIR
set -euo pipefail
pp=$1
fx=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
py=/usr/bin/python3

for sub in show query; do
  "$pp" costmodel "$sub" --help | grep "Usage" > /dev/null || fail "costmodel $sub --help"
done

# show: text and JSON with the documented keys
"$pp" costmodel show --model gpt-1.3b --device V100-32GB | grep "gpt-1.3b" > /dev/null || fail "show text"
"$pp" costmodel show --model llama-7b --device H100-80GB --json > "$tmp/show.json"
$py - "$tmp/show.json" <<'PY' || fail "show --json keys"
import json, sys
j = json.load(open(sys.argv[1]))
for k in ("model", "device", "cost_model", "comm", "model_presets", "device_presets"):
    assert k in j, k
assert j["model"]["gated_mlp"] is True and j["device"]["name"] == "H100-80GB", j
PY

# query: JSON keys, recompute ordering (the eager kernel's), decoder query on T5, static memory under ZeRO
for rc in none selective full; do
  "$pp" costmodel query --model gpt-6.7b --device A100-40GB --attention eager --tp 2 --mbs 2 --seq 2048 --recompute $rc \
      --layers 4 --dp 8 --zero 1 --json > "$tmp/q_$rc.json"
done
$py - "$tmp" <<'PY' || fail "query --json values"
import json, sys
d = sys.argv[1]
q = {rc: json.load(open(f"{d}/q_{rc}.json")) for rc in ("none", "selective", "full")}
for k in ("model", "device", "cost_model", "query", "forward_ms", "backward_ms", "recompute_ms", "total_ms",
          "stored_bytes", "peak_bytes", "boundary_bytes", "boundary_p2p_ms", "time_source", "memory_source", "static"):
    assert k in q["none"], k
assert q["none"]["query"] == {"kind": "encoder", "layers": 4, "tp": 2, "mbs": 2, "seq": 2048, "dec_seq": 0,
                              "recompute": "none", "layout": "padded"}, q["none"]["query"]
assert q["none"]["total_ms"] < q["selective"]["total_ms"] < q["full"]["total_ms"]
assert q["none"]["stored_bytes"] > q["selective"]["stored_bytes"] > q["full"]["stored_bytes"]
s = q["none"]["static"]
assert abs(s["optimizer_bytes"] - 6 * s["params_bytes"] / 8) < 1e-6 * s["optimizer_bytes"], s
assert q["none"]["time_source"] == "analytic"
assert q["none"]["attention_kernel"] == "eager"
PY
# the flash kernel (the GPU presets'): no stored scores; a 32K row before and after; slices cost more with their prefix
"$pp" costmodel query --model llama-7b --device H100-80GB --segments 32768 --layers 4 --json > "$tmp/f32.json"
"$pp" costmodel query --model llama-7b --device H100-80GB --attention eager --segments 32768 --layers 4 --json > "$tmp/e32.json"
"$pp" costmodel query --model llama-7b --device H100-80GB --segments 4096 --prefix 28672 --layers 4 --json > "$tmp/s32.json"
"$pp" costmodel query --model llama-7b --device H100-80GB --segments 4096 --prefix 0 --layers 4 --json > "$tmp/s0.json"
$py - "$tmp" <<'PY' || fail "flash kernel and slices"
import json, sys
d = sys.argv[1]
f, e, s, s0 = (json.load(open(f"{d}/{n}.json")) for n in ("f32", "e32", "s32", "s0"))
assert f["attention_kernel"] == "flash" and e["attention_kernel"] == "eager"
gib = 1 << 30
assert 15 * gib < f["stored_bytes"] < 20 * gib, f["stored_bytes"] / gib   # about 34 s h a layer
assert e["stored_bytes"] > 500 * gib, e["stored_bytes"] / gib            # 5 a s^2 a layer
assert f["total_ms"] < e["total_ms"]
assert s["query"]["attention"]["prefix_tokens"] == 28672 and s["query"]["attention"]["prefix"] == 4096 * 28672
assert s["total_ms"] > 2 * s0["total_ms"] and s["stored_bytes"] > s0["stored_bytes"]
PY
"$pp" costmodel show --model llama-7b --device H100-80GB | grep -q "kernel  flash attention" || fail "show names the kernel"
"$pp" costmodel query --model t5-11b --kind decoder --enc-seq 512 --dec-seq 128 --mbs 2 --json > "$tmp/t5.json"
$py - "$tmp/t5.json" <<'PY' || fail "t5 decoder query"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["boundary_bytes"] == 2 * 2 * (512 + 128) * 1024, j
PY
"$pp" costmodel query --model gpt-1.3b --seq 1024 | grep "forward" > /dev/null || fail "query text"

# bad input: non-zero exit and a message naming the argument
expect_error() {
  local pattern=$1; shift
  if "$pp" "$@" > "$tmp/out" 2> "$tmp/err"; then fail "expected failure: $*"; fi
  grep -q -- "$pattern" "$tmp/err" || { cat "$tmp/err" >&2; fail "message for: $*"; }
}
expect_error "unknown model 'gpt-99b'" costmodel query --model gpt-99b --seq 128
expect_error "mbs" costmodel query --mbs 0 --seq 128
expect_error "decoder-only" costmodel query --kind decoder --seq 128 --dec-seq 16
expect_error "tp (3) must divide" costmodel query --tp 3 --seq 128
expect_error "--seq" costmodel query --mbs 1
expect_error "unknown recompute mode" costmodel query --seq 128 --recompute most
expect_error "ZeRO stage (zero / --zero)" costmodel query --seq 128 --zero 7

# a packed row (varlen attention): its layout and sums in the query, cheaper than the dense row of
# the same tokens, dearer than its longest sample alone
"$pp" costmodel query --model gpt-6.7b --segments 1024 1024 2048 --json > "$tmp/packed.json"
"$pp" costmodel query --model gpt-6.7b --seq 4096 --json > "$tmp/dense.json"
"$pp" costmodel query --model gpt-6.7b --seq 2048 --json > "$tmp/longest.json"
$py - "$tmp" <<'PY' || fail "query --segments"
import json, sys
d = sys.argv[1]
p, dn, lo = (json.load(open(f"{d}/{n}.json")) for n in ("packed", "dense", "longest"))
assert p["query"]["layout"] == "packed" and p["query"]["seq"] == 4096, p["query"]
assert p["query"]["attention"] == {"self": 2 * 1024 ** 2 + 2048 ** 2, "dec_self": 0, "cross": 0, "prefix": 0,
                                   "prefix_tokens": 0}, p["query"]
assert lo["total_ms"] < p["total_ms"] < dn["total_ms"], (lo["total_ms"], p["total_ms"], dn["total_ms"])
assert p["stored_bytes"] <= dn["stored_bytes"]
PY
"$pp" costmodel query --model t5-770m --kind decoder --segments 300 200 --dec-segments 40 60 | grep -i "packed" \
    > /dev/null || fail "t5 packed row text"
expect_error "leave out --seq" costmodel query --segments 100 50 --seq 150
expect_error "segment 1 has length 0" costmodel query --segments 100 0
expect_error "one decoder length per segment" costmodel query --model t5-770m --kind decoder --segments 300 200 \
    --dec-segments 40
expect_error "decoder-only" costmodel query --segments 300 --dec-segments 40
expect_error "2 prefixes for 1 segments" costmodel query --model llama-7b --segments 300 --prefix 10 20
expect_error "needs --segments" costmodel query --model llama-7b --seq 300 --prefix 10
expect_error "encoder-decoder" costmodel query --model t5-770m --kind decoder --segments 300 --dec-segments 40 --prefix 5
expect_error "attention" costmodel query --model llama-7b --seq 128 --attention sdpa
expect_error "measured with eager attention" costmodel query --model gpt-6.7b --seq 1024 --attention flash \
    --profile "$fx/dynapipe/derived_from_cost_models_pkl/gpt_6.7b_timing.csv"
echo "ok"

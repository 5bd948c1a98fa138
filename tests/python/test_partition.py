"""packpipe.partition from Python: numpy lengths in, micro-batches with numpy sample arrays out."""
import numpy as np
import pytest

import packpipe


def gpt():
    return packpipe.CostModel("gpt-6.7b", "A100-40GB")


def t5():
    return packpipe.CostModel("t5-11b", "A100-40GB")


def lengths(n, seed, median=200.0, cap=2048):
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(median), 1.0, n)), 1, cap).astype(np.uint32)


def covered(result, n):
    seen = np.concatenate([mb["samples"] for mb in result["microbatches"]] + [result["dropped"]])
    return np.array_equal(np.sort(seen), np.arange(n))


@pytest.mark.parametrize("method", ["dp", "dynapipe", "fixed", "tokens", "packing"])
def test_every_method_covers_each_sample_once(method):
    x = lengths(150, 1)
    r = packpipe.partition(x, gpt(), stages=4, layers_per_stage=4, memory_mb=36000, method=method, mbs=2, tokens=4096)
    assert covered(r, len(x))
    assert 0 < r["efficiency"] <= 1
    for mb in r["microbatches"]:
        assert mb["samples"].dtype == np.uint32
        assert mb["padded_len"] % 8 == 0
        assert mb["padded_len"] >= x[mb["samples"]].max() or len(mb["row_offsets"]) > 0
        assert mb["recompute"] in ("none", "selective", "full")


def test_int64_lengths_and_encoder_decoder():
    x = lengths(80, 2, cap=1024).astype(np.int64)
    y = lengths(80, 3, median=60, cap=512).astype(np.int64)
    r = packpipe.partition(x, t5(), target_lengths=y, stages=4, layers_per_stage=6, memory_mb=36000)
    assert covered(r, len(x))
    assert all(mb["padded_dec_len"] >= y[mb["samples"]].max() for mb in r["microbatches"])
    assert 0 < r["target_efficiency"] <= 1


def test_dp_no_worse_than_dynapipe_and_deterministic():
    x = lengths(200, 4)
    kw = dict(stages=4, layers_per_stage=4, memory_mb=36000, cost_basis="dynapipe")
    ours = packpipe.partition(x, gpt(), method="dp", **kw)
    base = packpipe.partition(x, gpt(), method="dynapipe", **kw)
    assert ours["objective_ms"] <= base["objective_ms"] * (1 + 1e-12)
    again = packpipe.partition(x, gpt(), method="dp", **kw)
    assert again["objective_ms"] == ours["objective_ms"]
    assert all(np.array_equal(a["samples"], b["samples"]) for a, b in zip(ours["microbatches"], again["microbatches"]))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"input_lengths must have an integer dtype \(lengths in tokens\), found float64"):
        packpipe.partition(np.array([1.5, 2.0]), gpt())
    with pytest.raises(ValueError, match="input_lengths must be one-dimensional"):
        packpipe.partition(np.ones((2, 2), dtype=np.uint32), gpt())
    with pytest.raises(ValueError, match=r"sample 1 \(length 1000000\)"):
        packpipe.partition(np.array([10, 1000000], dtype=np.uint32), gpt(), stages=4, layers_per_stage=4,
                           memory_mb=36000)
    r = packpipe.partition(np.array([10, 1000000], dtype=np.uint32), gpt(), stages=4, layers_per_stage=4,
                           memory_mb=36000, oversize="drop")
    assert list(r["dropped"]) == [1]
    with pytest.raises(ValueError, match="unknown partition method"):
        packpipe.partition(np.array([10], dtype=np.uint32), gpt(), method="greedy")


def _same(a, b):
    assert a["objective_ms"] == b["objective_ms"]
    assert len(a["microbatches"]) == len(b["microbatches"])
    for x, y in zip(a["microbatches"], b["microbatches"]):
        assert np.array_equal(x["samples"], y["samples"])
        assert x["time_ms"] == y["time_ms"] and x["recompute"] == y["recompute"]


def test_partition_cache_keeps_shapes_and_never_changes_results():
    cache = packpipe.PartitionCache()
    assert cache.shapes == 0
    models = [gpt(), t5()]
    seen = 0
    for k in range(6):
        cm = models[k % 2]  # alternating models: the cache starts afresh for each
        x = lengths(120, 10 + k, cap=1024)
        y = lengths(120, 20 + k, median=60.0, cap=256) if k % 2 else None
        kw = dict(target_lengths=y, stages=4, layers_per_stage=(6 if k % 2 else 4), memory_mb=36000)
        cold = packpipe.partition(x, cm, **kw)
        warm = packpipe.partition(x, cm, cache=cache, **kw)
        _same(cold, warm)
        again = packpipe.partition(x, cm, cache=cache, **kw)
        _same(cold, again)
        assert cache.shapes > 0
        seen = max(seen, cache.shapes)
    assert "shapes=" in repr(cache)
    with pytest.raises(TypeError):
        packpipe.partition(lengths(10, 1), gpt(), stages=2, layers_per_stage=8, cache=object())


def test_order_and_threads():
    x = lengths(150, 7, cap=1024)
    y = lengths(150, 8, median=60, cap=512)
    kw = dict(target_lengths=y, stages=4, layers_per_stage=6, memory_mb=36000)
    sorted_ = packpipe.partition(x, t5(), order="sorted", **kw)
    order = np.concatenate([mb["samples"] for mb in sorted_["microbatches"]])
    pairs = list(zip(x[order].tolist(), y[order].tolist()))
    assert pairs == sorted(pairs, reverse=True)
    one = packpipe.partition(x, t5(), threads=1, **kw)
    two = packpipe.partition(x, t5(), threads=2, **kw)
    assert one["objective_ms"] == two["objective_ms"] <= sorted_["objective_ms"]
    assert all(np.array_equal(a["samples"], b["samples"]) for a, b in zip(one["microbatches"], two["microbatches"]))
    with pytest.raises(ValueError, match="unknown encoder-decoder order 'tsp'"):
        packpipe.partition(x, t5(), order="tsp", **kw)
    with pytest.raises(ValueError, match=r"threads must be in \[0, 1024\]"):
        packpipe.partition(x, t5(), threads=-1, **kw)


def test_arguments_out_of_range_raise_value_error():
    """Unsigned arguments refuse negatives (no wrap-around), sizes are bounded before anything is
    allocated from them, and a layer count above the model's is refused."""
    x = lengths(20, 3, cap=512)
    cm = gpt()
    for kw, msg in [
        (dict(tokens=-1, method="tokens"), "tokens must not be negative"),
        (dict(tokens=1.5, method="tokens"), "tokens must be an integer"),
        (dict(tokens=2**64, method="tokens"), "tokens must be at most"),
        (dict(stages=2**31 - 1), r"stages must be in \[1, 65536\], found 2147483647"),
        (dict(chunks=2**40), r"chunks must be in \[1, 65536\]"),
        (dict(dp=0), r"dp must be in \[1, 65536\]"),
        (dict(stages=4, layers_per_stage=1000), "= 4000 layers, more than the 32 layers of 'gpt-6.7b'"),
        (dict(stages=64), "64 virtual stages exceed the 32 layers"),
        (dict(tp=3), "tp 3 must divide the attention heads"),
        (dict(memory_mb=1e300), "memory limit must be in"),
        (dict(memory_mb=float("nan")), "memory limit must be in"),
        (dict(round_multiple=2**62), r"round_multiple must be in \[1, 65536\]"),
        (dict(threads=2**40), r"threads must be in \[0, 1024\]"),
        (dict(mbs=-1, method="fixed"), "mbs must be in"),
    ]:
        with pytest.raises(ValueError, match=msg):
            packpipe.partition(x, cm, **kw)
    # numpy integers are integers
    r = packpipe.partition(x, cm, stages=4, layers_per_stage=4, method="tokens", tokens=np.uint64(4096),
                           memory_mb=36000)
    assert sum(len(mb["samples"]) for mb in r["microbatches"]) == 20


def test_model_state_over_the_limit_is_named_whatever_the_policy():
    x = lengths(20, 4, cap=512)
    for pol in ("error", "truncate", "drop"):
        with pytest.raises(ValueError, match=r"model state of rank 0 .* more than the 100 MB memory limit.*cannot help"):
            packpipe.partition(x, gpt(), stages=4, memory_mb=100, oversize=pol)


def test_lengths_are_checked_never_cast():
    x = np.arange(1, 101)
    ref = packpipe.partition(x.astype(np.uint32), gpt(), stages=4, layers_per_stage=4)
    for arg in (x.astype(np.int16), x.astype(np.uint64), x.tolist(), np.arange(1, 101).repeat(2)[::2]):
        assert packpipe.partition(arg, gpt(), stages=4, layers_per_stage=4)["objective_ms"] == ref["objective_ms"]
    for arg, found in ((np.array([True, False]), "bool"), (np.array([1 + 0j]), "complex128"), ([1.5], "float64")):
        with pytest.raises(ValueError, match=f"input_lengths must have an integer dtype .*found {found}"):
            packpipe.partition(arg, gpt())
    with pytest.raises(ValueError, match=r"input_lengths\[1\] = -1 is out of range"):
        packpipe.partition([3, -1], gpt())

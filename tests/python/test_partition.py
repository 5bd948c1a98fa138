"""packpipe.partition from Python: the cost model, then numpy lengths, then the shape and options;
a Partition of MicroBatch objects whose sample arrays are zero-copy views."""
import numpy as np
import pytest

import packpipe
from packpipe import PartitionOptions, PipelineShape


def gpt():
    return packpipe.CostModel("gpt-6.7b", "A100-40GB")


def t5():
    return packpipe.CostModel("t5-11b", "A100-40GB")


def lengths(n, seed, median=200.0, cap=2048):
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(median), 1.0, n)), 1, cap).astype(np.uint32)


def covered(result, n, x=None):
    """Every sample once, or (x: the lengths) every token of every sample once: a sliced sample's
    spans cover it back to back from token 0, in micro-batch order."""
    if x is None or not any(len(mb.spans) for mb in result.microbatches):
        seen = np.concatenate([mb.samples for mb in result.microbatches] + [result.dropped])
        return np.array_equal(np.sort(seen), np.arange(n))
    at = {}
    for mb in result.microbatches:
        spans = mb.spans or [(0, int(x[s])) for s in mb.samples]
        for s, (b, l) in zip(mb.samples, spans):
            if at.get(int(s), 0) != b:
                return False
            at[int(s)] = b + l
    at.update({int(s): int(x[s]) for s in result.dropped})
    return sorted(at) == list(range(n)) and all(at[s] == int(x[s]) for s in at)


FOUR = PipelineShape(stages=4, layers_per_stage=4, memory_mb=36000)


@pytest.mark.parametrize("method", ["dp", "dynapipe", "fixed", "tokens", "packing", "wlb"])
def test_every_method_covers_each_sample_once(method):
    x = lengths(150, 1)
    r = packpipe.partition(gpt(), x, shape=FOUR, options=PartitionOptions(method=method, mbs=2, tokens=4096))
    assert isinstance(r, packpipe.Partition)
    assert covered(r, len(x), x)
    assert 0 < r.efficiency <= 1
    for mb in r.microbatches:
        assert isinstance(mb, packpipe.MicroBatch)
        assert mb.samples.dtype == np.uint32
        assert mb.recompute in ("none", "selective", "full")
        assert mb.rows == (len(mb.row_offsets) - 1 if len(mb.row_offsets) else len(mb.samples))
        if mb.layout == "packed" and mb.spans:  # slices: each attends to its prefix's kept keys too
            lens = np.array([l for _, l in mb.spans], np.int64)
            pre = np.array([b for b, _ in mb.spans], np.int64)
            assert mb.rows == 1 and mb.padded_len == int(lens.sum())
            assert mb.attention == (int((lens ** 2).sum()), 0, 0, int((lens * pre).sum()), int(pre.sum()))
        elif mb.layout == "packed":  # one row of every sample back to back, attended apart (varlen)
            assert mb.rows == 1 and mb.padded_len == int(x[mb.samples].sum())
            assert mb.attention == (int((x[mb.samples].astype(np.int64) ** 2).sum()), 0, 0, 0, 0)
        else:
            assert mb.padded_len % 8 == 0
            assert mb.padded_len >= x[mb.samples].max() or len(mb.row_offsets) > 0
            assert mb.attention == (0, 0, 0, 0, 0)
    if method in ("packing", "wlb"):
        assert all(mb.layout == "packed" for mb in r.microbatches)
    if method in ("fixed", "tokens", "dynapipe"):
        assert all(mb.layout == "padded" for mb in r.microbatches)


def test_result_fields():
    x = lengths(120, 5)
    r = packpipe.partition(gpt(), x, shape=PipelineShape(stages=4, layers_per_stage=4, dp=2, memory_mb=36000))
    mbs = r.microbatches
    assert sum(mb.tokens for mb in mbs) == int(x.sum()) == r.input_tokens
    assert r.target_tokens == 0 and r.target_efficiency == 0
    assert r.padded_input_tokens == sum(mb.rows * mb.padded_len for mb in mbs)
    assert r.efficiency == pytest.approx(r.input_tokens / r.padded_input_tokens)
    assert r.max_time_ms == max(mb.time_ms for mb in mbs)
    assert r.sum_time_ms == pytest.approx(sum(mb.time_ms for mb in mbs))
    assert len(r.ranks) == 2 and sorted(i for rank in r.ranks for i in rank) == list(range(len(mbs)))
    assert r.rank_time_ms == pytest.approx([sum(mbs[i].time_ms for i in rank) for rank in r.ranks])
    assert r.cost_basis == "stages" and r.memory_limit_mb == 36000
    assert sorted(r.order.tolist()) == list(range(len(x)))
    assert r.objective_ms > 0 and r.tau_evaluations > 0
    assert all(mb.stored_mb > 0 and mb.peak_mb > 0 for mb in mbs)
    # results are read-only: views into the C++ result, kept alive by it
    view = mbs[0].samples
    assert not view.flags.writeable and not view.flags.owndata
    with pytest.raises(AttributeError):
        r.objective_ms = 1.0
    del r, mbs
    assert view.tolist() == view.tolist()  # still valid once the result is gone
    assert repr(packpipe.partition(gpt(), x[:8], shape=FOUR)).startswith("Partition(microbatches=[")


def test_int64_lengths_and_encoder_decoder():
    x = lengths(80, 2, cap=1024).astype(np.int64)
    y = lengths(80, 3, median=60, cap=512).astype(np.int64)
    r = packpipe.partition(t5(), x, y, shape=PipelineShape(stages=4, layers_per_stage=6, memory_mb=36000))
    assert covered(r, len(x))
    assert all(mb.padded_dec_len >= y[mb.samples].max() for mb in r.microbatches)
    assert 0 < r.target_efficiency <= 1
    assert r.target_tokens == int(y.sum())


def test_dp_no_worse_than_dynapipe_and_deterministic():
    x = lengths(200, 4)
    dp = PartitionOptions(method="dp", cost_basis="dynapipe")
    ours = packpipe.partition(gpt(), x, shape=FOUR, options=dp)
    base = packpipe.partition(gpt(), x, shape=FOUR, options=PartitionOptions(method="dynapipe", cost_basis="dynapipe"))
    assert ours.objective_ms <= base.objective_ms * (1 + 1e-12)
    assert base.dynapipe_recompute in ("none", "selective", "full")
    again = packpipe.partition(gpt(), x, shape=FOUR, options=dp)
    assert again.objective_ms == ours.objective_ms
    assert all(np.array_equal(a.samples, b.samples) for a, b in zip(ours.microbatches, again.microbatches))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"input_lengths must have an integer dtype .*found float64"):
        packpipe.partition(gpt(), np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match="input_lengths must be one-dimensional"):
        packpipe.partition(gpt(), np.ones((2, 2), dtype=np.uint32))
    with pytest.raises(ValueError, match=r"sample 1 \(length 1000000\)"):
        packpipe.partition(gpt(), np.array([10, 1000000], dtype=np.uint32), shape=FOUR)
    r = packpipe.partition(gpt(), np.array([10, 1000000], dtype=np.uint32), shape=FOUR,
                           options=PartitionOptions(oversize="drop"))
    assert list(r.dropped) == [1]
    with pytest.raises(ValueError, match="unknown partition method"):
        PartitionOptions(method="greedy")
    with pytest.raises(ValueError, match="target_lengths has 1 entries but input_lengths has 2"):
        packpipe.partition(t5(), [10, 20], [5])
    with pytest.raises(TypeError):
        packpipe.partition(gpt(), lengths(10, 1), shape=FOUR, options=FOUR)


def _same(a, b):
    assert a.objective_ms == b.objective_ms
    assert len(a.microbatches) == len(b.microbatches)
    for x, y in zip(a.microbatches, b.microbatches):
        assert np.array_equal(x.samples, y.samples)
        assert x.time_ms == y.time_ms and x.recompute == y.recompute


def test_partition_cache_keeps_shapes_and_never_changes_results():
    cache = packpipe.PartitionCache()
    assert cache.shapes == 0
    models = [gpt(), t5()]
    for k in range(6):
        cm = models[k % 2]  # alternating models: the cache starts afresh for each
        x = lengths(120, 10 + k, cap=1024)
        y = lengths(120, 20 + k, median=60.0, cap=256) if k % 2 else None
        shape = PipelineShape(stages=4, layers_per_stage=(6 if k % 2 else 4), memory_mb=36000)
        cold = packpipe.partition(cm, x, y, shape=shape)
        warm = packpipe.partition(cm, x, y, shape=shape, cache=cache)
        _same(cold, warm)
        again = packpipe.partition(cm, x, y, shape=shape, cache=cache)
        _same(cold, again)
        assert cache.shapes > 0
    assert "shapes=" in repr(cache)
    with pytest.raises(TypeError):
        packpipe.partition(gpt(), lengths(10, 1), shape=PipelineShape(stages=2, layers_per_stage=8), cache=object())


def test_order_and_threads():
    x = lengths(150, 7, cap=1024)
    y = lengths(150, 8, median=60, cap=512)
    shape = PipelineShape(stages=4, layers_per_stage=6, memory_mb=36000)
    padded = ("padded",)  # the order is the padded search's (packed micro-batches balance any order)
    sorted_ = packpipe.partition(t5(), x, y, shape=shape, options=PartitionOptions(order="sorted", layouts=padded))
    order = np.concatenate([mb.samples for mb in sorted_.microbatches])
    pairs = list(zip(x[order].tolist(), y[order].tolist()))
    assert pairs == sorted(pairs, reverse=True)
    one = packpipe.partition(t5(), x, y, shape=shape, options=PartitionOptions(threads=1, layouts=padded))
    two = packpipe.partition(t5(), x, y, shape=shape, options=PartitionOptions(threads=2, layouts=padded))
    assert one.objective_ms == two.objective_ms <= sorted_.objective_ms
    assert all(np.array_equal(a.samples, b.samples) for a, b in zip(one.microbatches, two.microbatches))
    with pytest.raises(ValueError, match="unknown encoder-decoder order 'tsp'"):
        PartitionOptions(order="tsp")
    with pytest.raises(ValueError, match="threads must not be negative"):
        PartitionOptions(threads=-1)


def test_arguments_out_of_range_raise_value_error():
    """Sizes are bounded before anything is allocated from them (the C++ library's checks, named as the
    Python fields), and a layer count above the model's is refused."""
    x = lengths(20, 3, cap=512)
    cm = gpt()
    for shape, options, msg in [
        (dict(), dict(method="tokens"), r"method 'tokens' needs a token budget per micro-batch \(tokens / --tokens\)"),
        (dict(), dict(method="fixed"), r"method 'fixed' needs a micro-batch size \(mbs / --mbs\) of at least 1"),
        (dict(stages=4, layers_per_stage=1000), dict(), "= 4000 layers, more than the 32 layers of 'gpt-6.7b'"),
        (dict(stages=64), dict(), "64 virtual stages exceed the 32 layers"),
        (dict(tp=3), dict(), "tp 3 must divide the attention heads"),
        (dict(), dict(round_multiple=2**62), r"\(round_multiple / --round-multiple\) must be in \[1, 65536\]"),
    ]:
        with pytest.raises(ValueError, match=msg):
            packpipe.partition(cm, x, shape=PipelineShape(**shape), options=PartitionOptions(**options))
    # numpy integers are integers
    r = packpipe.partition(cm, x, shape=FOUR, options=PartitionOptions(method="tokens", tokens=np.uint64(4096)))
    assert sum(len(mb.samples) for mb in r.microbatches) == 20


def test_model_state_over_the_limit_is_named_whatever_the_policy():
    x = lengths(20, 4, cap=512)
    for pol in ("error", "truncate", "drop"):
        with pytest.raises(ValueError, match=r"model state of rank 0 .* more than the 100 MB memory limit.*cannot help"):
            packpipe.partition(gpt(), x, shape=PipelineShape(stages=4, memory_mb=100),
                               options=PartitionOptions(oversize=pol))


def test_evaluate_partition_costs_given_microbatches_on_either_basis():
    cm = packpipe.CostModel("gpt-6.7b", "A100-40GB")
    lens = np.random.default_rng(3).integers(16, 1500, size=60).astype(np.uint32)
    shape = PipelineShape(stages=4, layers_per_stage=4, memory_mb=36000)
    for basis in ("stages", "dynapipe"):
        p = packpipe.partition(cm, lens, shape=shape, options=PartitionOptions(cost_basis=basis))
        e = packpipe.evaluate_partition(cm, lens, microbatches=list(p.microbatches), shape=shape, basis=basis)
        assert [m.layout for m in e.microbatches] == [m.layout for m in p.microbatches]
        assert [m.time_ms for m in e.microbatches] == [m.time_ms for m in p.microbatches]
        assert [m.recompute for m in e.microbatches] == [m.recompute for m in p.microbatches]
        assert e.objective_ms == pytest.approx(p.objective_ms)
    with pytest.raises(ValueError, match="micro-batch 0 .* does not fit"):
        packpipe.evaluate_partition(cm, lens, microbatches=[np.arange(60)], shape=shape,
                                    options=PartitionOptions(recompute="none"))
    with pytest.raises(ValueError, match="micro-batch 0 names sample 99"):
        packpipe.evaluate_partition(cm, lens, microbatches=[[99]], shape=shape)
    with pytest.raises(ValueError, match=r"microbatches\[1\]"):
        packpipe.evaluate_partition(cm, lens, microbatches=[[0], [-1]], shape=shape)


def test_evaluate_partition_keeps_slices():
    """A sliced Partition's micro-batches evaluated again keep their slices (each priced with its
    prefix, linked for the schedule), and the result records the lengths."""
    cm = packpipe.CostModel("gpt-1.3b")
    shape = packpipe.PipelineShape(stages=4, layers_per_stage=3)
    lengths = np.array([700, 90, 260, 40, 333], dtype=np.uint32)
    part = packpipe.partition(cm, lengths, shape=shape,
                              options=packpipe.PartitionOptions(method="slicing", capacity=128))
    ev = packpipe.evaluate_partition(cm, lengths, microbatches=list(part.microbatches), shape=shape)
    assert [[tuple(s) for s in mb.spans] for mb in ev.microbatches] == \
           [[tuple(s) for s in mb.spans] for mb in part.microbatches]
    assert any(len(mb.spans) for mb in ev.microbatches)
    assert [mb.time_ms for mb in ev.microbatches] == pytest.approx([mb.time_ms for mb in part.microbatches])
    a = packpipe.ScheduleProblem(cm, ev, shape=shape).simulate("1f1b").makespan_ms
    b = packpipe.ScheduleProblem(cm, part, shape=shape).simulate("1f1b").makespan_ms
    assert a == pytest.approx(b) and a > 0
    # Slices that do not cover their sample are refused, naming it.
    with pytest.raises(ValueError, match="sample 0: its slices"):
        packpipe.evaluate_partition(cm, np.array([900, 90, 260, 40, 333], dtype=np.uint32),
                                    microbatches=list(part.microbatches), shape=shape)


@pytest.mark.parametrize("lens", [[100, 2], [9, 1], [16, 8], [100, 50], [1, 1, 9]])
def test_dynapipe_plans_a_few_short_samples(lens):
    """Every window time within dynapipe_thin_ms of the least (a few short samples): the thinned caps all refused the
    longest sample's window, and DynaPipe's partition 'found no feasible plan in 40000 MB'. The caps thinned away are
    tried when none kept fits; every sample is planned once."""
    cm = packpipe.CostModel("gpt-1.3b", "A100-40GB")
    for stages in (1, 2, 4):
        r = packpipe.partition(cm, np.array(lens, np.uint32), shape=PipelineShape(stages=stages),
                               options=PartitionOptions(method="dynapipe"))
        assert sorted(s for mb in r.microbatches for s in mb.samples) == list(range(len(lens)))
        assert np.isfinite(r.objective_ms) and r.objective_ms > 0


def test_evaluate_partition_lists_samples_left_out_and_refuses_one_given_twice():
    """Micro-batches that leave samples out are costed as given, and the samples are listed in dropped (it said
    dropped == []); a sample in two micro-batches is refused, naming both (the batch's tokens were counted twice)."""
    cm = packpipe.CostModel("gpt-1.3b", "A100-40GB")
    L = np.array([100, 2, 300, 50], np.uint32)
    part = packpipe.evaluate_partition(cm, L, microbatches=[[0, 1]], shape=PipelineShape(stages=2))
    assert list(part.dropped) == [2, 3] and part.input_tokens == 102
    whole = packpipe.evaluate_partition(cm, L, microbatches=[[0, 1], [2, 3]], shape=PipelineShape(stages=2))
    assert list(whole.dropped) == [] and whole.input_tokens == 452
    with pytest.raises(ValueError, match="sample 1 is in micro-batch 0 and again in micro-batch 1"):
        packpipe.evaluate_partition(cm, L, microbatches=[[0, 1], [1, 2, 3]], shape=PipelineShape(stages=2))

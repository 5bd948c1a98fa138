"""Planning a global batch from Python: plans out as objects and numpy arrays."""
import numpy as np
import pytest

import packpipe


def _lengths(n, seed):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(200), 1.0, n), 1, 2048).astype(np.uint32)


def test_plan_batch_returns_valid_plans_covering_every_sample():
    cm = packpipe.CostModel("gpt-6.7b", "A100-40GB")
    lengths = _lengths(300, 1)
    r = packpipe.plan_batch(cm, lengths, stages=4, layers_per_stage=4, dp=2, validate=True, baselines=True,
                            baseline_mbs=[1, 4])
    assert len(r["plans"]) == 2
    seen = []
    weight = 0.0
    for k, plan in enumerate(r["plans"]):
        assert plan.replica == k and plan.ranks == 4
        assert plan.validate()["ok"]
        ins = plan.instructions(0)
        assert ins.dtype.names[0] == "opcode" and len(ins) > 0
        for mb in plan.microbatches:
            seen += list(mb["samples"])
            weight += mb["loss_weight"]
    assert sorted(seen) == list(range(300))
    assert weight == pytest.approx(1.0)
    assert r["packpipe"]["feasible"] and r["packpipe"]["iteration_ms"] > 0
    assert r["tokens"] == int(lengths.sum())
    assert [g["mbs"] for g in r["fixed"]] == [1, 4]
    best = min(g["iteration_ms"] for g in r["fixed"] + r["packing"] if g["feasible"])
    assert r["packpipe"]["iteration_ms"] <= best * 1.0001


def test_plan_batch_is_deterministic_and_checks_arguments():
    cm = packpipe.CostModel("gpt-6.7b", "A100-40GB")
    lengths = _lengths(120, 2)
    a = packpipe.plan_batch(cm, lengths, stages=2, layers_per_stage=8)
    b = packpipe.plan_batch(cm, lengths.astype(np.int64), stages=2, layers_per_stage=8)
    assert a["plans"][0].to_bytes() == b["plans"][0].to_bytes()
    with pytest.raises(ValueError, match=r"input_lengths must have an integer dtype \(lengths in tokens\), found float32"):
        packpipe.plan_batch(cm, lengths.astype(np.float32), stages=2, layers_per_stage=8)
    with pytest.raises(ValueError, match="schedule"):
        packpipe.plan_batch(cm, lengths, stages=2, layers_per_stage=8, schedule="nope")


def test_plan_batch_with_a_cache_plans_the_same():
    cm = packpipe.CostModel("gpt-6.7b", "A100-40GB")
    cache = packpipe.PartitionCache()
    for seed in range(3):
        lengths = _lengths(150, 30 + seed)
        a = packpipe.plan_batch(cm, lengths, stages=4, layers_per_stage=4, memory_mb=36000)
        b = packpipe.plan_batch(cm, lengths, stages=4, layers_per_stage=4, memory_mb=36000, cache=cache)
        assert a["packpipe"]["iteration_ms"] == b["packpipe"]["iteration_ms"]
        assert [list(m["samples"]) for m in a["plans"][0].microbatches] == [list(m["samples"]) for m in b["plans"][0].microbatches]
    assert cache.shapes > 0


def test_plan_batch_refuses_out_of_range_arguments():
    cm = packpipe.CostModel("gpt-6.7b", "A100-40GB")
    lengths = _lengths(40, 3)
    for kw, msg in [
        (dict(seed=-1), "seed must not be negative"),
        (dict(iteration=-1), "iteration must not be negative"),
        (dict(iteration=2**64), "iteration must be at most"),
        (dict(seed=0.5), "seed must be an integer"),
        (dict(stages=2**31 - 1), r"stages must be in \[1, 65536\]"),
        (dict(stages=4, layers_per_stage=1000), "more than the 32 layers"),
        (dict(baselines=True, baseline_mbs=[1, -1]), r"baseline micro-batch size -1 \(entry 1 of baseline_mbs\)"),
        (dict(baselines=True, baseline_mbs=[0]), "baseline micro-batch size 0"),
        (dict(memory_mb=1e300), "memory limit must be in"),
        (dict(oversize="squash"), "unknown oversize policy 'squash'"),
    ]:
        with pytest.raises(ValueError, match=msg):
            packpipe.plan_batch(cm, lengths, **kw)
    r = packpipe.plan_batch(cm, lengths, stages=4, layers_per_stage=4, seed=2**64 - 1, iteration=np.int64(7))
    assert r["iteration"] == 7


def test_plan_batch_oversize_policy():
    """One long sample no longer aborts the batch when asked: error names it and the option;
    truncate and drop plan the rest and count what is trained."""
    cm = packpipe.CostModel("gpt-6.7b", "A100-40GB")
    lengths = np.array([300, 200, 900000, 150], dtype=np.uint32)
    kw = dict(stages=4, layers_per_stage=4, memory_mb=36000, validate=True)
    with pytest.raises(ValueError, match=r"iteration 5, sample 2 of the global batch \(length 900000\) does not fit.*"
                                         r"oversize truncate or drop"):
        packpipe.plan_batch(cm, lengths, iteration=5, **kw)
    d = packpipe.plan_batch(cm, lengths, oversize="drop", **kw)
    assert d["dropped"] == 1 and d["truncated"] == 0 and d["samples"] == 3 and d["tokens"] == 650
    seen = sorted(int(s) for p in d["plans"] for mb in p.microbatches for s in mb["samples"])
    assert seen == [0, 1, 3]
    assert sum(mb["loss_weight"] for p in d["plans"] for mb in p.microbatches) == pytest.approx(1.0)
    t = packpipe.plan_batch(cm, lengths, oversize="truncate", **kw)
    assert t["truncated"] == 1 and t["dropped"] == 0 and t["samples"] == 4 and 650 < t["tokens"] < 650 + 900000
    assert sum(mb["loss_weight"] for p in t["plans"] for mb in p.microbatches) == pytest.approx(1.0)

"""The call forms of packpipe 0.1 work for one more release, with a DeprecationWarning naming the new
form and the removal, and give the same results as the new forms."""
import numpy as np
import pytest

import packpipe
from packpipe import PartitionOptions, PipelineShape


def gpt():
    return packpipe.CostModel("gpt-6.7b", "A100-40GB")


X = np.random.default_rng(5).integers(20, 1500, 80).astype(np.uint32)
SHAPE = PipelineShape(stages=4, layers_per_stage=4, memory_mb=36000)
REMOVAL = r"packpipe 0\.1 only and is removed in packpipe 0\.2"


def same_partition(a, b):
    return a.objective_ms == b.objective_ms and \
        [m.samples.tolist() for m in a.microbatches] == [m.samples.tolist() for m in b.microbatches]


def test_partition_old_order_and_flat_keywords():
    new = packpipe.partition(gpt(), X, shape=SHAPE, options=PartitionOptions(method="tokens", tokens=4096))
    with pytest.warns(DeprecationWarning, match=r"partition\(input_lengths, cost_model, \.\.\.\) is deprecated; use "
                                                r"partition\(cost_model, input_lengths, \.\.\.\)") as w:
        old = packpipe.partition(X, gpt(), stages=4, layers_per_stage=4, memory_mb=36000, method="tokens",
                                 tokens=4096)
    assert same_partition(old, new)
    messages = [str(x.message) for x in w]
    assert any("shape=packpipe.PipelineShape(...)" in m and "options=packpipe.PartitionOptions(...)" in m
               for m in messages)
    assert all(x.filename == __file__ for x in w)  # points at the caller's line
    with pytest.warns(DeprecationWarning, match=REMOVAL):
        kw = packpipe.partition(X, cost_model=gpt(), shape=SHAPE, options=PartitionOptions(method="tokens",
                                                                                             tokens=4096))
    assert same_partition(kw, new)
    with pytest.warns(DeprecationWarning):  # 0.1 positions, past the lengths and the model
        pos = packpipe.partition(X, gpt(), None, 4, 4, 1, 1, 1, 36000.0, 1, "tokens", 0, 4096)
    assert same_partition(pos, new)


def test_zero_stage_is_zero():
    with pytest.warns(DeprecationWarning, match=r"partition\(.*zero_stage="):
        old = packpipe.partition(gpt(), X, stages=4, layers_per_stage=4, memory_mb=36000, dp=2, zero_stage=3)
    new = packpipe.partition(gpt(), X, shape=PipelineShape(stages=4, layers_per_stage=4, memory_mb=36000, dp=2,
                                                           zero=3))
    assert same_partition(old, new)
    with pytest.warns(DeprecationWarning, match=r"static_memory\(zero_stage=\) is deprecated; use static_memory\(zero=\)"):
        s = packpipe.static_memory(1e9, dp=8, zero_stage=3)
    assert s.total_bytes == packpipe.static_memory(1e9, dp=8, zero=3).total_bytes


def test_plan_batch_flat_keywords_keep_their_old_defaults():
    """plan_batch(stages=4 by default) and the shape default agree: an old call plans the same bytes."""
    with pytest.warns(DeprecationWarning, match=r"plan_batch\(layers_per_stage=, memory_mb=, oversize=\.\.\.\)"):
        old = packpipe.plan_batch(gpt(), X, layers_per_stage=4, memory_mb=36000, oversize="drop")
    new = packpipe.plan_batch(gpt(), X, shape=SHAPE, options=PartitionOptions(oversize="drop"))
    assert [p.to_bytes() for p in old.plans] == [p.to_bytes() for p in new.plans]
    with pytest.raises(TypeError, match="give shape= or the keywords stages, not both"):
        packpipe.plan_batch(gpt(), X, shape=SHAPE, stages=4)


def test_result_items_answer_as_the_old_dicts():
    r = packpipe.plan_batch(gpt(), X, shape=SHAPE, baselines=True, baseline_mbs=[1, 2])
    with pytest.warns(DeprecationWarning, match=r"IterationResult\['plans'\] is deprecated; use the attribute \.plans"):
        assert r["plans"][0] is r.plans[0]
    with pytest.warns(DeprecationWarning):
        assert r["packpipe"]["iteration_ms"] == r.packpipe.iteration_ms
    with pytest.warns(DeprecationWarning):
        fixed = r["fixed"]  # 0.1: a list of figure dicts with their micro-batch size
    assert [g["mbs"] for g in fixed] == [1, 2]
    assert [g["iteration_ms"] for g in fixed] == [f.iteration_ms for f in r.fixed.figures]
    p = packpipe.partition(gpt(), X, shape=SHAPE)
    with pytest.warns(DeprecationWarning):
        assert p["microbatches"][0]["padded_len"] == p.microbatches[0].padded_len
    with pytest.raises(KeyError):
        p["no_such_field"]
    with pytest.raises(KeyError):
        p["__class__"]


def test_schedule_problem_flat_keywords():
    cm = packpipe.CostModel("gpt-1.3b")
    shapes = [(4, 512), (2, 1024), (8, 256), (4, 512)]
    new = packpipe.ScheduleProblem(cm, shapes, shape=PipelineShape(stages=2, chunks=2))
    with pytest.warns(DeprecationWarning, match=r"ScheduleProblem\(chunks=, stages=\.\.\.\)"):
        old = packpipe.ScheduleProblem(cm, shapes, stages=2, chunks=2)
    with pytest.warns(DeprecationWarning):
        positional = packpipe.ScheduleProblem(cm, shapes, 2, 2)
    for p in (old, positional):
        assert p.vstages == new.vstages == 4
        assert p.simulate("interleaved-1f1b").makespan_ms == new.simulate("interleaved-1f1b").makespan_ms
    assert isinstance(old, packpipe.ScheduleProblem)

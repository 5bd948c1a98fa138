"""packpipe schedules, simulator and search from Python."""
import json

import numpy as np
import pytest

import packpipe
from packpipe import PipelineShape

SHAPES = [(4, 512), (2, 1024), (16, 128, 0, "selective"), (1, 2048), (8, 256), (4, 512), (2, 1024), (8, 256)]


@pytest.fixture(scope="module")
def problem():
    return packpipe.ScheduleProblem(packpipe.CostModel("gpt-1.3b"), SHAPES)  # 4 stages by default, as the CLI


def test_schedule_names():
    assert packpipe.schedule_names() == ["gpipe", "1f1b", "interleaved-1f1b", "cyclic", "wait-free-cyclic",
                                         "zero-bubble"]


def test_uniform_costs_match_closed_forms():
    m, S = 8, 4
    p = packpipe.ScheduleProblem.from_costs(np.ones((m, S)), 2 * np.ones((m, S)), ranks=S)
    for name in ("gpipe", "1f1b"):
        s = p.simulate(name)
        assert s.makespan_ms == pytest.approx((m + S - 1) * 3)
        assert s.bubble_fraction == pytest.approx((S - 1) / (m + S - 1))
    assert p.lower_bound_ms == pytest.approx(m * 3)


def test_ops_are_zero_copy_structured_arrays(problem):
    s = problem.simulate("zero-bubble")
    for r in range(4):
        a = s.ops(r)
        assert a.dtype.names == ("kind", "mb", "vstage", "start_ms", "end_ms")
        assert not a.flags.owndata
        assert np.all(a["vstage"] % 4 == r)
        assert np.all(a["end_ms"][:-1] <= a["start_ms"][1:] + 1e-9)  # one op at a time
        assert set(np.unique(a["kind"])) == {0, 2, 3}  # F, I, W
        lst = s.op_list(r)
        assert len(lst) == len(a) and lst[0][0] in ("F", "I", "W")
    assert max(a["end_ms"].max() for a in (s.ops(r) for r in range(4))) == pytest.approx(s.makespan_ms)
    with pytest.raises(IndexError):
        s.ops(4)


def test_search_is_deterministic_and_not_worse_than_reference(problem):
    a = problem.search(seed=5)
    b = problem.search(seed=5)
    ref = problem.search(seed=5, reference=True)
    assert a.schedule.order == b.schedule.order and a.schedule.makespan_ms == b.schedule.makespan_ms
    assert a.feasible and ref.feasible
    assert a.schedule.makespan_ms <= ref.schedule.makespan_ms
    assert a.schedule.makespan_ms >= a.lower_bound_ms * (1 - 1e-12)
    assert sorted(a.schedule.order) == list(range(len(SHAPES)))
    only = problem.search(schedules=["1f1b"])
    assert only.schedule.name == "1f1b"


def test_search_margin_keeps_1f1b_in_order_unless_another_candidate_is_that_much_faster(problem):
    plain = problem.search(reference=True)
    given = problem.simulate("1f1b")  # the reference: 1F1B over the micro-batches in their order
    assert plain.schedule.makespan_ms < given.makespan_ms  # the margin has a choice to make
    gain = 1 - plain.schedule.makespan_ms / given.makespan_ms
    won = problem.search(reference=True, margin=gain * 0.9).schedule
    assert won.name == plain.schedule.name and won.makespan_ms == plain.schedule.makespan_ms
    kept = problem.search(reference=True, margin=min(gain * 1.1, 0.99)).schedule
    assert kept.name == "1f1b" and kept.order == given.order and kept.makespan_ms == given.makespan_ms
    # Without 1F1B among the candidates there is no reference, and the margin changes nothing.
    others = ["zero-bubble", "wait-free-cyclic"]
    assert (problem.search(schedules=others, margin=0.5).schedule.order ==
            problem.search(schedules=others).schedule.order)
    for bad in (-0.01, 1.0, float("nan")):
        with pytest.raises(ValueError, match="margin"):
            problem.search(margin=bad)


def test_chrome_trace_is_valid_json(problem):
    s = problem.simulate("1f1b")
    t = json.loads(s.chrome_trace())
    ev = [e for e in t["traceEvents"] if e["ph"] == "X"]
    assert len(ev) == 2 * len(SHAPES) * 4
    assert {e["tid"] for e in ev} == {0, 1, 2, 3}


def test_bad_arguments():
    cm = packpipe.CostModel("gpt-1.3b")
    with pytest.raises(ValueError, match="unknown schedule"):
        packpipe.ScheduleProblem(cm, SHAPES).simulate("pipedream")
    with pytest.raises(ValueError, match="microbatches is empty"):
        packpipe.ScheduleProblem(cm, [])
    with pytest.raises(ValueError, match="rows must be at least 1"):
        packpipe.ScheduleProblem(cm, [(0, 512)])
    with pytest.raises(ValueError, match="not a permutation"):
        packpipe.ScheduleProblem(cm, SHAPES).simulate("gpipe", order=[0] * len(SHAPES))
    with pytest.raises(ValueError, match=r"backward_ms must have shape \(2, 2\), found \(3, 2\)"):
        packpipe.ScheduleProblem.from_costs(np.ones((2, 2)), np.ones((3, 2)), ranks=2)


def test_sizes_out_of_range_raise_value_error():
    cm = packpipe.CostModel("gpt-1.3b")
    with pytest.raises(ValueError, match=r"microbatches\[0\] rows must not be negative"):
        packpipe.ScheduleProblem(cm, [(-4, 512)])
    with pytest.raises(ValueError, match=r"microbatches\[1\] rows must be at most 1048576"):
        packpipe.ScheduleProblem(cm, [(4, 512), (2**40, 512)])
    with pytest.raises(ValueError, match=r"microbatches\[0\] padded_len must not be negative"):
        packpipe.ScheduleProblem(cm, [(4, -512)])
    with pytest.raises(ValueError, match=r"microbatches\[0\]: padded_len must be at least 1"):
        packpipe.ScheduleProblem(cm, [(4, 0)])
    with pytest.raises(ValueError, match=r"stages must be in \[1, 65536\]"):
        packpipe.ScheduleProblem(cm, SHAPES, shape=PipelineShape(stages=2**31 - 1))
    with pytest.raises(ValueError, match="more than the 24 layers"):
        packpipe.ScheduleProblem(cm, SHAPES, shape=PipelineShape(stages=4, layers_per_stage=7))
    p = packpipe.ScheduleProblem(cm, SHAPES)
    with pytest.raises(ValueError, match="seed must not be negative"):
        p.search(seed=-1)
    assert p.search(seed=2**64 - 1).schedule.makespan_ms > 0


def test_cost_arrays_accept_floats_and_exact_integers_only():
    m, S = 6, 3
    ref = packpipe.ScheduleProblem.from_costs(np.ones((m, S)), 2 * np.ones((m, S)), ranks=S).simulate("1f1b")
    for fwd, bwd in [
        (np.ones((m, S), dtype=np.float32), 2 * np.ones((m, S), dtype=np.float16)),
        (np.ones((m, S), dtype=np.int64), np.full((m, S), 2, dtype=np.uint8)),
        ([[1] * S] * m, [[2.0] * S] * m),  # lists, through numpy
        (np.ones((S, m)).T, (2 * np.ones((m, 2 * S)))[:, ::2]),  # strided views
    ]:
        p = packpipe.ScheduleProblem.from_costs(fwd, bwd, ranks=S)
        assert p.simulate("1f1b").makespan_ms == ref.makespan_ms
    bad = [
        (np.ones((m, S), dtype=bool), "forward_ms must have a floating or integer dtype, found bool"),
        (np.ones((m, S), dtype=np.complex128), "forward_ms must have a floating or integer dtype, found complex128"),
        (np.array([[object()] * S] * m), "forward_ms must have a floating or integer dtype, found object"),
        (np.ones(m), "forward_ms must have 2 dimensions, found 1"),
        (np.full((m, S), 2**60, dtype=np.int64), "forward_ms entry 0 .* is not exact as a double"),
    ]
    for fwd, msg in bad:
        with pytest.raises(ValueError, match=msg):
            packpipe.ScheduleProblem.from_costs(fwd, 2 * np.ones((m, S)), ranks=S)
    with pytest.raises(ValueError, match="peak_bytes must have a floating or integer dtype, found bool"):
        packpipe.ScheduleProblem.from_costs(np.ones((m, S)), np.ones((m, S)), peak_bytes=np.zeros((m, S), bool),
                                            ranks=S)
    with pytest.raises(ValueError, match="static_bytes must have 1 dimensions, found 2"):
        packpipe.ScheduleProblem.from_costs(np.ones((m, S)), np.ones((m, S)), static_bytes=np.zeros((1, S)), ranks=S)


def test_microbatches_of_a_partition_and_the_shape():
    """ScheduleProblem takes a Partition's micro-batches as they are, on the same PipelineShape."""
    cm = packpipe.CostModel("gpt-1.3b")
    shape = PipelineShape(stages=4, chunks=2, layers_per_stage=3, memory_mb=36000)
    lengths = np.random.default_rng(3).integers(16, 1500, 60)
    part = packpipe.partition(cm, lengths, shape=shape, options=packpipe.PartitionOptions(layouts=("padded",)))
    p = packpipe.ScheduleProblem(cm, part.microbatches, shape=shape)
    assert p.microbatches == len(part.microbatches) and p.vstages == 8 and p.ranks == 4
    tuples = [(mb.rows, mb.padded_len, 0, mb.recompute) for mb in part.microbatches]
    q = packpipe.ScheduleProblem(cm, tuples, shape=shape)
    assert p.simulate("zero-bubble").makespan_ms == q.simulate("zero-bubble").makespan_ms > 0
    with pytest.raises(ValueError, match=r"microbatches\[0\] must be a MicroBatch or \(rows, padded_len"):
        packpipe.ScheduleProblem(cm, [(1,)], shape=shape)

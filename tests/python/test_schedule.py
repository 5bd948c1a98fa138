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
    # The last rank's forwards cannot start before S - 1 forwards upstream: (S - 1) + m (1 + 2).
    assert p.lower_bound_ms == pytest.approx(S - 1 + m * 3)


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


def test_a_sliced_partition_keeps_its_slices_in_order():
    """Micro-batches holding slices are scheduled with their links (forward in slice order, backward in
    reverse): from the Partition itself or with input_lengths=, never silently without them."""
    cm = packpipe.CostModel("gpt-1.3b")
    shape = PipelineShape(stages=4, layers_per_stage=3)
    lengths = np.array([700, 90, 260, 40, 333], dtype=np.uint32)
    part = packpipe.partition(cm, lengths, shape=shape,
                              options=packpipe.PartitionOptions(method="slicing", capacity=128))
    assert any(len(mb.spans) for mb in part.microbatches)
    with pytest.raises(ValueError, match=r"microbatches\[\d+\] holds slices: pass the Partition itself, or "
                                         r"input_lengths="):
        packpipe.ScheduleProblem(cm, part.microbatches, shape=shape)
    whole = packpipe.ScheduleProblem(cm, part, shape=shape)
    given = packpipe.ScheduleProblem(cm, part.microbatches, shape=shape, input_lengths=lengths)
    # The links: per sample, its pieces by first token.
    pieces = {}
    for m, mb in enumerate(part.microbatches):
        for s, (begin, n) in zip(mb.samples, mb.spans):
            if not (begin == 0 and n == lengths[s]):
                pieces.setdefault(int(s), []).append((int(begin), m))
    links = [(a[1], b[1]) for v in pieces.values() for a, b in zip(sorted(v), sorted(v)[1:])]
    assert links
    checked = {"F": 0, "back": 0}
    for kind in ("1f1b", "zero-bubble", "gpipe"):
        a, b = whole.simulate(kind), given.simulate(kind)
        assert a.makespan_ms == b.makespan_ms > 0
        for r in range(a.ranks):
            ops = a.op_list(r)
            at = {(tok, mb, v): i for i, (tok, mb, v, _, _) in enumerate(ops)}
            for prev, nxt in links:
                for v in {v for (_, _, v) in at}:
                    if ("F", prev, v) in at and ("F", nxt, v) in at:
                        assert at[("F", prev, v)] < at[("F", nxt, v)], (kind, r, prev, nxt)
                        checked["F"] += 1
                    back = [k for k in ("B", "I") if (k, prev, v) in at and (k, nxt, v) in at]
                    for k in back:
                        assert at[(k, nxt, v)] < at[(k, prev, v)], (kind, r, prev, nxt)
                        checked["back"] += 1
    assert checked["F"] > 0 and checked["back"] > 0
    s = whole.search()
    assert s.feasible and s.schedule.makespan_ms >= whole.lower_bound_ms
    # Lengths that the slices do not cover, or a Partition with lengths besides: refused, naming why.
    short = lengths.copy()
    short[0] = 600
    with pytest.raises(ValueError, match="sample 0: its slices"):
        packpipe.ScheduleProblem(cm, part.microbatches, shape=shape, input_lengths=short)
    with pytest.raises(ValueError, match="input_lengths: a Partition carries its own lengths"):
        packpipe.ScheduleProblem(cm, part, shape=shape, input_lengths=lengths)
    with pytest.raises(ValueError, match="microbatches must be a Partition or a sequence"):
        packpipe.ScheduleProblem(cm, "1f1b", shape=shape)


def test_a_partition_of_several_replicas_is_scheduled_one_replica_at_a_time():
    """A dp > 1 Partition is one pipeline per replica: replica= picks one (its micro-batches in the
    planner's order); without it the problem is refused rather than run every replica as one."""
    cm = packpipe.CostModel("gpt-1.3b")
    shape = PipelineShape(stages=4, layers_per_stage=6, dp=2)
    lengths = np.array([7000, 900, 2600, 400, 3330, 5000, 8000, 1200], dtype=np.uint32)
    part = packpipe.partition(cm, lengths, shape=shape,
                              options=packpipe.PartitionOptions(method="slicing", capacity=1024))
    assert len(part.ranks) == 2
    with pytest.raises(ValueError, match=r"the Partition has 2 data-parallel replicas .*pass replica= \(0 to 1\)"):
        packpipe.ScheduleProblem(cm, part, shape=shape)
    per = []
    for k, members in enumerate(part.ranks):
        p = packpipe.ScheduleProblem(cm, part, shape=shape, replica=k)
        q = packpipe.ScheduleProblem(cm, [part.microbatches[m] for m in members], shape=shape, input_lengths=lengths)
        assert p.microbatches == len(members)
        assert p.simulate("1f1b").makespan_ms == q.simulate("1f1b").makespan_ms > 0
        per.append(p.lower_bound_ms)
    # Each replica's bound is at most the planner's iteration (the slowest replica's makespan).
    plan = packpipe.plan_batch(cm, lengths, shape=shape, options=packpipe.PartitionOptions(method="slicing",
                                                                                           capacity=1024))
    assert max(per) <= plan.packpipe.iteration_ms * (1 + 1e-9)
    with pytest.raises(ValueError, match="replica"):
        packpipe.ScheduleProblem(cm, part, shape=shape, replica=2)
    with pytest.raises(ValueError, match="replica: a Partition's data-parallel replica"):
        packpipe.ScheduleProblem(cm, part.microbatches, shape=shape, input_lengths=lengths, replica=0)


def test_input_lengths_that_disagree_with_the_slices_are_named():
    cm = packpipe.CostModel("gpt-1.3b")
    shape = PipelineShape(stages=4, layers_per_stage=3)
    lengths = np.array([700, 90, 260, 40, 333], dtype=np.uint32)
    part = packpipe.partition(cm, lengths, shape=shape,
                              options=packpipe.PartitionOptions(method="slicing", capacity=128))
    for bad in (lengths[:3], np.array([800, 90, 260, 40, 333], dtype=np.uint32)):
        with pytest.raises(ValueError, match="microbatches and input_lengths disagree: .*input_lengths must be the "
                                             "lengths the micro-batches were cut from"):
            packpipe.ScheduleProblem(cm, part.microbatches, shape=shape, input_lengths=bad)

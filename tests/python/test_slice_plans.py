"""Long samples cut into slices (docs/design/015-long-context.md), through the public Python API:
plans keep the slices through JSON, bytes and plan files; the validator refuses a slice out of order;
a slice's cost grows with its prefix; the dp method cuts by cost and keeps each sample's slices
together in memory; the planner is never slower than a baseline on long-context batches; the
slicing baseline runs each sample's slices one after another."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import packpipe
from packpipe import PartitionOptions, PipelineShape

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import long_mixtures  # noqa: E402

LLAMA = packpipe.CostModel("llama-7b", "H100-80GB")
SHAPE = PipelineShape(stages=8, layers_per_stage=4, memory_mb=72000)


def entries(mb):
    """(sample, length, prefix) of each entry (a micro-batch without slices records no prefix)."""
    pre = list(mb["prefix"]) or [0] * len(mb["samples"])
    return [(int(s), int(n), int(p)) for s, n, p in zip(mb["samples"], mb["lengths"], pre)]


def sliced(plans):
    return [(r, m, i) for r, p in enumerate(plans) for m, mb in enumerate(p.microbatches)
            for i, v in enumerate(mb["prev"]) if v is not None]


@pytest.fixture(scope="module")
def long_batch():
    """One long-context batch (a 125K and a 36K document among short samples) planned with a report."""
    x = long_mixtures.batches("chatqa2-128K", 1, 1234)[0]
    return x, packpipe.plan_batch(LLAMA, x, shape=SHAPE, baselines=True, baseline_mbs=[1, 2, 4], validate=True)


def test_a_long_batch_is_planned_with_slices_and_every_token_once(long_batch):
    x, r = long_batch
    assert r.source == "dp" and r.dropped == 0 and r.truncated == 0
    assert len(sliced(r.plans)) >= 8
    covered = {}
    for p in r.plans:
        for mb in p.microbatches:
            for s, n, pre in entries(mb):
                covered.setdefault(s, []).append((pre, n))
    assert sorted(covered) == list(range(len(x)))
    for s, spans in covered.items():  # a sample's slices tile it: prefix = the tokens before
        spans.sort()
        at = 0
        for pre, n in spans:
            assert pre == at
            at += n
        assert at == int(x[s])
    # memory holds in the simulated schedule, chains of slices included
    for p in r.plans:
        assert max(p.peak_bytes) <= p.memory_limit_bytes


def test_slices_are_cut_by_cost_later_slices_shorter(long_batch):
    """Under flash attention a token late in a 125K document costs several early ones: the dp method's
    cuts balance cost, so the slices of the longest sample shorten as their prefix grows."""
    x, r = long_batch
    longest = int(np.argmax(x))
    spans = sorted((pre, n) for p in r.plans for mb in p.microbatches for s, n, pre in entries(mb) if s == longest)
    assert len(spans) >= 4
    assert spans[0][1] > 1.5 * spans[-2][1]  # (the last may be a remainder)


def test_never_slower_than_a_baseline_on_long_context_batches(long_batch):
    batches = [long_batch[1]] + [packpipe.plan_batch(LLAMA, x, shape=SHAPE, baselines=True, baseline_mbs=[1, 2])
                                 for x in long_mixtures.batches("longalign-64K", 2, 7)]
    seen = set()
    for r in batches:
        assert r.dropped == 0 and r.truncated == 0  # every sample fits when sliced
        for b in r.baselines:
            seen.add(b.family)
            if b.figures.feasible and b.family != "packing-mask":
                assert r.packpipe.iteration_ms <= b.figures.iteration_ms * (1 + 1e-12), b.setting
    assert "slicing" in seen


def test_slice_plans_round_trip_through_json_bytes_and_plan_files(long_batch, tmp_path):
    _, r = long_batch
    p = r.plans[0]
    assert sliced([p])
    q = packpipe.Plan.from_json(p.to_json())
    assert q == p and [mb["prefix"] for mb in q.microbatches] == [mb["prefix"] for mb in p.microbatches]
    assert [mb["prev"] for mb in q.microbatches] == [mb["prev"] for mb in p.microbatches]
    for compress in (False, True):
        assert packpipe.Plan.from_bytes(p.to_bytes(compress=compress)) == p
    path = str(tmp_path / "long.plans")
    with packpipe.PlanFileWriter(path, compress=True) as w:
        w.append(p)
    back = packpipe.PlanFileReader(path).read(p.iteration)
    assert back == p and back.validate()["ok"]


def _edit(plan, fn):
    d = json.loads(plan.to_json())
    fn(d)
    return packpipe.Plan.from_json(json.dumps(d))


def test_the_validator_refuses_slices_out_of_order_or_unlinked(long_batch):
    _, r = long_batch
    p = r.plans[0]
    rank, m, i = sliced([p])[0]
    d = json.loads(p.to_json())
    mbs = d["microbatches"]
    prev = mbs[m]["prev"][i]

    def point_forward(d):  # the previous slice after its next one
        d["microbatches"][m]["prev"][i] = len(mbs) - 1 if prev != len(mbs) - 1 else 0

    def unlink(d):  # a continuing slice without its previous one
        d["microbatches"][m]["prev"][i] = None

    def wrong_prefix(d):  # a prefix that is not the tokens before
        d["microbatches"][m]["prefix"][i] += 1

    for fn in (point_forward, unlink, wrong_prefix):
        try:
            bad = _edit(p, fn)
        except (ValueError, RuntimeError) as e:  # refused when read
            assert "slice" in str(e) or "prefix" in str(e) or "prev" in str(e)
            continue
        rep = bad.validate()
        assert not rep["ok"], fn.__name__
        with pytest.raises(RuntimeError, match="invalid"):
            bad.validate_or_throw()


def test_a_slice_costs_more_with_a_longer_prefix():
    for kernel in ("flash", "eager"):
        cm = packpipe.CostModel("llama-7b", "H100-80GB", attention=kernel)
        prev = None
        for pre in (0, 4096, 16384, 65536):
            c = cm.query(kind="encoder", segments=[4096], prefix=[pre], layers=4)
            t = c.forward_ms + c.backward_ms
            if prev is not None:
                assert t > prev[0] and c.stored_bytes > prev[1]
            prev = (t, c.stored_bytes)


def test_the_slicing_baseline_runs_each_samples_slices_one_after_another():
    x = long_mixtures.batches("longalign-64K", 1, 1234)[0]
    for cap in (4096, 8192):
        r = packpipe.plan_batch(LLAMA, x, shape=SHAPE, schedule="1f1b",
                                options=PartitionOptions(method="slicing", capacity=cap), validate=True)
        assert r.packpipe.feasible
        mbs = r.plans[0].microbatches
        assert all(int(n) <= cap for mb in mbs for n in mb["lengths"])
        # a continuing slice directly follows the micro-batch of its previous slice, except where one
        # micro-batch holds the tails of two samples (then one of them waits for the other's chain)
        links = [(int(v), m) for m, mb in enumerate(mbs) for v in mb["prev"] if v is not None]
        assert links and sum(1 for a, b in links if b == a + 1) >= len(links) - 1


def test_recompute_leaves_room_for_slices_only_where_needed(long_batch):
    """The sliced plan recomputes some of its micro-batches, not all: the partition recomputes the
    cheapest slices of a sample until its slices fit together, and the planner simulates variants."""
    _, r = long_batch
    modes = [mb["recompute"][0] for p in r.plans for mb in p.microbatches]
    assert "none" in modes


def test_slices_are_searched_where_they_may_pay_and_skipped_where_they_cannot():
    """The sliced search runs where a sample is longer than its average micro-batch or the pipeline has
    fewer than 2 micro-batches per stage (a few uniform long documents: Seq1F1B's case), and is skipped
    where every sample is short beside a full pipeline's micro-batches: there plans equal slicing='off'."""
    cost = packpipe.CostModel("gpt-6.7b", "A100-40GB")
    shape = PipelineShape(stages=4, layers_per_stage=4)
    few_long = [16384] * 4  # unsliced: 4 micro-batches of one document each, a half-empty pipeline
    r = packpipe.plan_batch(cost, few_long, shape=shape)
    assert sliced(r.plans), "four 16K documents on 4 stages should be planned with slices"
    assert r.plans[0].to_bytes() != packpipe.plan_batch(cost, few_long, shape=shape,
                                                        options=PartitionOptions(slicing="off")).plans[0].to_bytes()
    rng = np.random.default_rng(5)
    short = [int(x) for x in rng.integers(200, 1200, size=160)]  # ~110K tokens of short samples
    auto = packpipe.plan_batch(cost, short, shape=shape)
    off = packpipe.plan_batch(cost, short, shape=shape, options=PartitionOptions(slicing="off"))
    assert not sliced(auto.plans)
    assert auto.plans[0].to_bytes() == off.plans[0].to_bytes()


def test_a_sliced_plan_is_not_exported_to_pytorch_pipelining(long_batch):
    """PyTorch's pipelining would run each slice on its own (no kept keys and values, no reverse
    backward): the export refuses, naming the micro-batch and why, rather than write a schedule
    that trains something else."""
    plan = next(p for p in long_batch[1].plans if sliced([p]))
    ok, why = plan.pytorch_exportable()
    assert not ok and "holds slices of a long sample" in why and "slicing off" in why
    with pytest.raises(Exception, match="cannot export iteration .* holds slices"):
        plan.pytorch_csv()


def test_measurements_of_a_sliced_plan_keep_each_slices_prefix(long_batch, tmp_path):
    """What a run measures is filed under the shape the plan priced: a later slice's queries attend
    to its kept prefix too, so its measured shape carries the prefix sums (a calibration fitted on
    them would otherwise take a slice for a short sample)."""
    plan = next(p for p in long_batch[1].plans if sliced([p]))
    times = [[(1000 * i, 1000 * i + 500) for i in range(len(stream))] for stream in plan.streams]
    path = str(tmp_path / "m.jsonl")
    packpipe.write_measurements(path, packpipe.measurements_from(plan, times))
    lines = [json.loads(x) for x in open(path) if x.strip()]
    by_mb = {}
    for x in lines:
        if "attention" in x and x.get("stage") == 0:
            by_mb[x["mb"]] = x["attention"]
    for m, mb in enumerate(plan.microbatches):
        if m not in by_mb:
            continue
        pre = [int(p) for p in mb["prefix"]] or [0] * len(mb["samples"])
        lens = [int(n) for n in mb["lengths"]]
        att = by_mb[m]
        assert att[0] == sum(n * n for n in lens), (m, att)
        if any(pre):
            assert len(att) == 5 and att[3] == sum(n * p for n, p in zip(lens, pre)) and att[4] == sum(pre), (m, att)
        else:
            assert len(att) == 3, (m, att)
    assert any(any(int(p) for p in mb["prefix"]) for m, mb in enumerate(plan.microbatches) if m in by_mb)

"""packpipe.RankLoader, assemble_microbatch and microbatch_layout: the tensors of every LOAD_MB equal an
assembly written here in numpy from dataset.sample(task, index), for decoder-only and encoder-decoder
plans, packed and padded rows and both loss modes; resumption, plan files and every rank; errors."""
import gc
import json
import pathlib

import numpy as np
import pytest

import packpipe
from packpipe import PartitionOptions, PipelineShape

DEMO = pathlib.Path(__file__).resolve().parents[2] / "data" / "demo"
WEIGHTS = [1, 1, 1, 0, 1, 0]  # the short tasks; man_summarize (long inputs) and man_text (long texts) not drawn
SHAPE = PipelineShape(stages=2)
ROWS = {"padded": PartitionOptions(), "packing": PartitionOptions(method="packing", mbs=2),
        "windows": PartitionOptions(pack_windows=True)}
NAMES = ["input_ids", "position_ids", "labels", "decoder_input_ids", "decoder_labels"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo tasks with sampling weights (a manifest beside a temporary folder, naming the demo files)."""
    m = json.loads((DEMO / "manifest.json").read_text())
    for task, weight in zip(m["tasks"], WEIGHTS):
        task["weight"] = weight
        for key in ("inputs", "targets", "dataset"):
            if key in task:
                task[key] = str(DEMO / task[key])
    path = tmp_path_factory.mktemp("demo") / "manifest.json"
    path.write_text(json.dumps(m))
    return packpipe.MultiTaskDataset(str(path))


@pytest.fixture(scope="module")
def gpt():
    return packpipe.CostModel("gpt-350m", "A100-40GB")


@pytest.fixture(scope="module")
def t5():
    return packpipe.CostModel("t5-770m", "A100-40GB")


def reference(ds, plan, m, *, ignore_index=-100, pad_id=0, decoder_start_id=0):
    """Every tensor of micro-batch m by the token rule, and its loss tokens, from the samples' tokens."""
    mb = plan.microbatches[m]
    encdec = len(mb["target_lengths"]) > 0
    rows, width, dec = mb["rows"], mb["padded_len"], mb["padded_dec_len"]
    offsets = mb["row_offsets"] or list(range(len(mb["samples"]) + 1))
    out = {"input_ids": np.full((rows, width), pad_id, np.int64), "position_ids": np.zeros((rows, width), np.int64),
           "labels": np.full((rows, width), ignore_index, np.int64)}
    if encdec:
        out["decoder_input_ids"] = np.full((rows, dec), pad_id, np.int64)
        out["decoder_labels"] = np.full((rows, dec), ignore_index, np.int64)
    loss = 0
    for r in range(rows):
        at = dec_at = 0
        for k in range(offsets[r], offsets[r + 1]):
            inp, tgt = (np.asarray(x, np.int64) for x in ds.sample(*mb["refs"][k]))
            n = mb["lengths"][k]
            out["position_ids"][r, at:at + n] = np.arange(n)
            if not encdec:
                # a truncated sample keeps its first tokens; a chunk of a split sample is its tokens from its offset
                o = mb["offsets"][k]
                tokens = np.concatenate([inp, tgt])[o:o + n]
                assert len(tokens) == n
                labels = np.full(n, ignore_index, np.int64)
                labels[:-1] = tokens[1:]
                if plan.loss_mode == "targets":
                    labels[:max(len(inp) - 1 - o, 0)] = ignore_index  # only where the next token is a target
                out["input_ids"][r, at:at + n] = tokens
                out["labels"][r, at:at + n] = labels
                loss += int(np.count_nonzero(labels != ignore_index))
            else:
                assert mb["offsets"][k] == 0  # encoder-decoder samples are never split
                encoder = inp if len(inp) else np.array([pad_id], np.int64)
                out["input_ids"][r, at:at + n] = encoder[:n]
                t = mb["target_lengths"][k]
                out["decoder_input_ids"][r, dec_at:dec_at + t] = np.concatenate([[decoder_start_id], tgt])[:t]
                kept = min(t, len(tgt))
                out["decoder_labels"][r, dec_at:dec_at + kept] = tgt[:kept]
                loss += kept
                dec_at += t
            at += n
    return out, loss


def check_loads(ds, plan, loads, **tokens):
    """Each LoadedTensors equals the reference: the tensors its stage loads, None for the others."""
    for t in loads:
        want, loss = reference(ds, plan, t.mb, **tokens)
        mb = plan.microbatches[t.mb]
        assert t.loads == plan.stages[t.stage]["loads"]
        assert (t.rows, t.seq, t.dec_seq) == (mb["rows"], mb["padded_len"], mb["padded_dec_len"])
        assert t.loss_tokens == loss == mb["loss_tokens"]
        assert sorted(t.tensors) == sorted(t.loads)
        for name in NAMES:
            got = getattr(t, name)
            if name not in t.loads:
                assert got is None
                continue
            assert got.dtype == np.int64 and not got.flags.writeable
            assert np.shares_memory(got, t.tensors[name])  # both views of one buffer
            np.testing.assert_array_equal(got, want[name], err_msg=f"iteration {plan.iteration} {t!r} {name}")


def stream_loads(plan, rank):
    """(mb, stage) of the LOAD_MBs of `rank`'s stream, in stream order."""
    return [(i.mb, i.stage) for i in plan.streams[rank] if i.op == "LOAD_MB"]


def test_weight_zero_is_allowed(demo):
    s = packpipe.Sampler(demo, weights=WEIGHTS, global_batch_samples=64)
    tasks = {task for b in s for task in b["tasks"].tolist()}
    assert tasks == {0, 1, 2, 4}


@pytest.mark.parametrize("rows", ["padded", "packing", "windows"])
@pytest.mark.parametrize("loss", ["all", "targets"])
def test_decoder_only_tensors_equal_numpy(demo, gpt, rows, loss):
    rng = np.random.default_rng(17)
    epoch = packpipe.plan_epoch(gpt, demo, shape=SHAPE, options=ROWS[rows], global_batch_tokens=300, loss=loss)
    total = epoch.iterations
    assert total > 10
    packed = 0
    for first in sorted(rng.choice(total, size=3, replace=False).tolist()):
        loader = packpipe.RankLoader(demo, packpipe.plan_epoch(gpt, demo, shape=SHAPE, options=ROWS[rows],
                                                               global_batch_tokens=300, loss=loss,
                                                               first_iteration=first, iterations=2),
                                     rank=None, ignore_index=-1, pad_id=3)
        assert len(loader) == 2 and loader.position == first
        its = list(loader)
        assert [it.iteration for it in its] == [first, first + 1] and loader.position == first + 2
        for it in its:
            assert it.plan.loss_mode == loss and it.plan.iteration == it.iteration
            assert [(t.mb, t.stage) for t in it.loads] == stream_loads(it.plan, 0) + stream_loads(it.plan, 1)
            check_loads(demo, it.plan, it.loads, ignore_index=-1, pad_id=3)
            packed += sum(1 for mb in it.plan.microbatches
                          if any(b - a > 1 for a, b in zip(mb["row_offsets"], mb["row_offsets"][1:])))
            for task, _ in (r for mb in it.plan.microbatches for r in mb["refs"]):
                assert task not in (3, 5)  # weight 0
    if rows != "padded":
        assert packed > 0


@pytest.mark.parametrize("rows", ["padded", "packing"])
def test_encoder_decoder_tensors_equal_numpy(demo, t5, rows):
    loader = packpipe.RankLoader(demo, packpipe.plan_epoch(t5, demo, shape=SHAPE, options=ROWS[rows],
                                                           global_batch_tokens=300, first_iteration=5, iterations=4),
                                 rank=None, decoder_start_id=7)
    seen = set()
    for it in loader:
        assert [s["decoder_layers"][1] > s["decoder_layers"][0] for s in it.plan.stages] == [False, True]
        check_loads(demo, it.plan, it.loads, decoder_start_id=7)
        seen |= {name for t in it.loads for name in t.loads}
    assert seen == {"input_ids", "position_ids", "decoder_input_ids", "decoder_labels"}


def test_assemble_and_layout_of_one_microbatch(demo, gpt, t5):
    for cost, decoder in ((gpt, False), (t5, True)):
        it = next(packpipe.plan_epoch(cost, demo, shape=SHAPE, options=ROWS["packing"], global_batch_tokens=300))
        plan = it.result.plans[0]
        for m, mb in enumerate(plan.microbatches):
            t = packpipe.assemble_microbatch(demo, plan, m, 0, pad_id=5)
            check_loads(demo, plan, [t], pad_id=5)
            for side in (False, True) if decoder else (False,):
                lay = packpipe.microbatch_layout(plan, m, decoder=side)
                lengths = mb["target_lengths"] if side else mb["lengths"]
                width = mb["padded_dec_len"] if side else mb["padded_len"]
                offsets = mb["row_offsets"] or list(range(len(lengths) + 1))
                pos = np.zeros((mb["rows"], width), np.int32)
                seg = np.zeros((mb["rows"], width), np.int32)
                cu = [0]
                for r in range(mb["rows"]):
                    at = 0
                    for s, k in enumerate(range(offsets[r], offsets[r + 1])):
                        pos[r, at:at + lengths[k]] = np.arange(lengths[k])
                        seg[r, at:at + lengths[k]] = s + 1
                        at += lengths[k]
                        cu.append(cu[-1] + lengths[k])
                    if at < width:
                        cu.append(cu[-1] + width - at)
                assert lay["cu_seqlens"].dtype == np.int32 and lay["position_ids"].dtype == np.int32
                np.testing.assert_array_equal(lay["position_ids"], pos)
                np.testing.assert_array_equal(lay["segment_ids"], seg)
                np.testing.assert_array_equal(lay["cu_seqlens"], cu)
                assert lay["max_seqlen"] == max(lengths)
                if not side:
                    np.testing.assert_array_equal(lay["position_ids"], t.position_ids)


def same_iterations(a, b):
    assert [x.iteration for x in a] == [y.iteration for y in b]
    for x, y in zip(a, b):
        assert x.plan == y.plan
        assert [(t.mb, t.stage, t.loads) for t in x.loads] == [(t.mb, t.stage, t.loads) for t in y.loads]
        for s, t in zip(x.loads, y.loads):
            for name in s.loads:
                np.testing.assert_array_equal(getattr(s, name), getattr(t, name))


def test_resume_plan_file_and_every_rank(demo, gpt, tmp_path):
    opts = PartitionOptions(method="packing", mbs=1)  # a row a micro-batch: enough for two replicas
    shape = PipelineShape(stages=2, dp=2)
    kw = dict(shape=shape, options=opts, global_batch_tokens=600, loss="targets", iterations=6)
    path = tmp_path / "epoch.plans"
    with packpipe.PlanFileWriter(str(path)) as w:
        its = list(packpipe.plan_epoch(gpt, demo, **kw))
        w.expect_iterations(0, len(its))
        for it in its:
            for p in it.result.plans:
                w.append(p)
    assert len(its) == 6
    for replica in (0, 1):
        for rank in (0, 1, None):
            full = list(packpipe.RankLoader(demo, packpipe.plan_epoch(gpt, demo, **kw), replica=replica, rank=rank))
            assert [x.plan for x in full] == [it.result.plans[replica] for it in its]
            filed = list(packpipe.RankLoader(demo, plan_file=path, replica=replica, rank=rank, depth=1))
            same_iterations(full, filed)
            kw_resumed = dict(kw, first_iteration=3, iterations=3)
            resumed = list(packpipe.RankLoader(demo, packpipe.plan_epoch(gpt, demo, **kw_resumed), replica=replica,
                                               rank=rank))
            same_iterations(full[3:], resumed)
            same_iterations(full[3:5], list(packpipe.RankLoader(demo, plan_file=str(path), first_iteration=3,
                                                                iterations=2, replica=replica, rank=rank)))
            if rank is None:
                check_loads(demo, full[0].plan, full[0].loads)
                ranks = [list(packpipe.RankLoader(demo, plan_file=path, replica=replica, rank=r)) for r in (0, 1)]
                for k, x in enumerate(full):
                    parts = ranks[0][k].loads + ranks[1][k].loads
                    assert [(t.mb, t.stage) for t in x.loads] == [(t.mb, t.stage) for t in parts]
                    for s, t in zip(x.loads, parts):
                        for name in s.loads:
                            np.testing.assert_array_equal(getattr(s, name), getattr(t, name))


def test_views_keep_their_tensors_and_the_loader_keeps_the_dataset(gpt):
    ds = packpipe.MultiTaskDataset(str(DEMO / "manifest.json"))
    loader = packpipe.RankLoader(ds, packpipe.plan_epoch(gpt, ds, shape=SHAPE, global_batch_tokens=300, iterations=3))
    del ds
    gc.collect()
    it = next(loader)
    ids = it.loads[0].input_ids
    copy = ids.copy()
    del it, loader
    gc.collect()
    np.testing.assert_array_equal(ids, copy)  # the view's base keeps the LoadedTensors alive
    with pytest.raises(ValueError):
        ids[0, 0] = 1  # read-only


def test_clear_errors(demo, gpt, tmp_path):
    epoch = packpipe.plan_epoch(gpt, demo, shape=SHAPE, global_batch_tokens=300, iterations=2)
    with pytest.raises(ValueError, match="exactly one of planner"):
        packpipe.RankLoader(demo)
    with pytest.raises(ValueError, match="exactly one of planner"):
        packpipe.RankLoader(demo, epoch, plan_file=str(tmp_path / "x.plans"))
    with pytest.raises(ValueError, match="rank must not be negative"):
        packpipe.RankLoader(demo, epoch, rank=-1)
    with pytest.raises(ValueError, match="depth must be an integer"):
        packpipe.RankLoader(demo, plan_file=str(tmp_path / "x.plans"), depth="2")
    with pytest.raises(ValueError, match="first_iteration and iterations apply to plan_file"):
        packpipe.RankLoader(demo, epoch, first_iteration=1)
    with pytest.raises(TypeError, match="plan_file must be a str or an os.PathLike"):
        packpipe.RankLoader(demo, plan_file=3)
    with pytest.raises(RuntimeError, match="x.plans"):
        packpipe.RankLoader(demo, plan_file=tmp_path / "x.plans")
    with pytest.raises(TypeError):
        packpipe.RankLoader(demo, "not a planner")
    # The loader takes the planner over, even when it refuses a setting.
    with pytest.raises(ValueError, match="rank 2 is out of range: the plans have 2 pipeline ranks"):
        packpipe.RankLoader(demo, packpipe.plan_epoch(gpt, demo, shape=SHAPE, global_batch_tokens=300), rank=2)
    with pytest.raises(ValueError, match="replica 1 is out of range: the plans have 1 data-parallel"):
        packpipe.RankLoader(demo, packpipe.plan_epoch(gpt, demo, shape=SHAPE, global_batch_tokens=300), replica=1)
    loader = packpipe.RankLoader(demo, epoch)
    for use in (lambda: next(epoch), lambda: len(epoch), lambda: packpipe.RankLoader(demo, epoch)):
        with pytest.raises(RuntimeError, match="handed to a RankLoader"):
            use()
    assert len(list(loader)) == 2
    # A planning error comes at its iteration, after the earlier ones, and again on later calls.
    failing = packpipe.RankLoader(demo, packpipe.plan_epoch(
        gpt, demo, shape=PipelineShape(stages=2, memory_mb=1), global_batch_tokens=300))
    for _ in range(2):
        with pytest.raises(ValueError, match="iteration 0"):
            next(failing)
    # assemble_microbatch and microbatch_layout
    plan = packpipe.plan_batch(gpt, [10, 20, 30], shape=SHAPE).plans[0]
    with pytest.raises(ValueError, match=r"no sample refs; plan it with plan_epoch or plan_batch\(refs=...\)"):
        packpipe.assemble_microbatch(demo, plan, 0, 0)
    with pytest.raises(IndexError, match="micro-batch 99 is out of range"):
        packpipe.assemble_microbatch(demo, plan, 99, 0)
    with pytest.raises(IndexError, match="virtual stage 9 is out of range"):
        packpipe.assemble_microbatch(demo, plan, 0, 9)
    with pytest.raises(ValueError, match="mb must not be negative"):
        packpipe.assemble_microbatch(demo, plan, -1, 0)
    with pytest.raises(ValueError, match="a decoder-only plan has no decoder side"):
        packpipe.microbatch_layout(plan, 0, decoder=True)
    assert packpipe.microbatch_layout(plan, 0)["position_ids"].shape == (plan.microbatches[0]["rows"],
                                                                          plan.microbatches[0]["padded_len"])
    other = packpipe.MultiTaskDataset(str(DEMO / "demo_man_text"))  # a plan's refs into another dataset
    good = next(packpipe.plan_epoch(gpt, demo, shape=SHAPE, global_batch_tokens=300)).result.plans[0]
    with pytest.raises(ValueError, match=r"the plan was planned from another dataset than .*demo_man_text.*other tasks"):
        packpipe.assemble_microbatch(other, good, 0, 0)
    # a plan that records no dataset (refs given without it): each ref is still checked against the one given
    anonymous = packpipe.plan_batch(gpt, [10, 20], shape=SHAPE, refs=[(5, 0), (5, 1)]).plans[0]
    assert anonymous.dataset is None
    with pytest.raises(ValueError, match="is this the plan's dataset"):
        packpipe.assemble_microbatch(other, anonymous, 0, 0)
    with pytest.raises(ValueError, match=r"refs\[0\] = \(5, 0\) is not a sample of dataset"):
        packpipe.plan_batch(gpt, [10, 20], shape=SHAPE, refs=[(5, 0), (5, 1)], dataset=other)
    with pytest.raises(ValueError, match="dataset is given without refs"):
        packpipe.plan_batch(gpt, [10, 20], shape=SHAPE, dataset=other)


@pytest.mark.parametrize("policy", ["truncate", "drop", "split"])
@pytest.mark.parametrize("loss", ["all", "targets"])
def test_context_length_keeps_every_position_below_it(gpt, policy, loss):
    """The whole demo (samples up to ~3,000 tokens) at max_seq_len=1024: every plan's lengths and every
    position a loader emits stay below 1024, and the tensors follow the token rule (a chunk of a split
    sample is its tokens from its offset, labelled within the chunk)."""
    ds = packpipe.MultiTaskDataset(str(DEMO / "manifest.json"))
    kw = dict(shape=SHAPE, global_batch_tokens=32768, loss=loss, iterations=3, seed=5, max_seq_len=1024,
              seq_policy=policy, validate=True)
    its = list(packpipe.plan_epoch(gpt, ds, **kw))
    over = {"truncate": 0, "drop": 0, "split": 0}
    for it in its:
        over["truncate"] += it.result.seq_truncated
        over["drop"] += it.result.seq_dropped
        over["split"] += it.result.seq_split
        assert it.input_lengths.max() <= 1024 and (it.sample_lengths >= it.input_lengths).all()
        assert len(it.sample_lengths) == len(it.input_lengths) == len(it.refs) == len(it.trained_input_lengths)
        np.testing.assert_array_equal(it.trained_input_lengths, it.input_lengths)  # memory fits: nothing cut
        np.testing.assert_array_equal(it.trained_loss_tokens, it.loss_tokens)
        if policy == "split":
            # the chunks of a sample: consecutive offsets from 0, covering the whole sample
            ends = {}
            for (task, index, offset), n, whole in zip(it.refs.tolist(), it.input_lengths, it.sample_lengths):
                assert offset == ends.get((task, index), 0)
                ends[(task, index)] = offset + int(n)
                assert ends[(task, index)] <= whole
            assert all(ends[k] == ds.lengths(k[0])[0][k[1]] + ds.lengths(k[0])[1][k[1]] for k in ends)
        else:
            assert (it.refs["offset"] == 0).all()
        if policy == "drop":
            assert len(it.result.seq_dropped_refs) == it.result.seq_dropped == len(it.result.seq_dropped_samples)
            for task, index, _ in it.result.seq_dropped_refs.tolist():
                inp, tgt = ds.lengths(task)
                assert inp[index] + tgt[index] > 1024
        for plan in it.result.plans:
            assert plan.max_seq_len == 1024 and plan.max_target_len == 0
            trained = [n for mb in plan.microbatches for n in mb["lengths"]]
            assert max(trained) <= 1024
    assert over[policy] > 0 and sum(over.values()) == over[policy]
    loader = packpipe.RankLoader(ds, packpipe.plan_epoch(gpt, ds, **kw), rank=None)
    positions = 0
    for it in loader:
        check_loads(ds, it.plan, it.loads)
        for t in it.loads:
            if t.position_ids is not None:
                assert t.position_ids.max() < 1024
                positions += t.position_ids.size
        for m in range(len(it.plan.microbatches)):
            assert packpipe.microbatch_layout(it.plan, m)["position_ids"].max() < 1024
    assert positions > 0


def test_context_length_of_an_encoder_decoder_model(t5):
    ds = packpipe.MultiTaskDataset(str(DEMO / "manifest.json"))
    kw = dict(shape=SHAPE, global_batch_tokens=32768, iterations=2, seed=5, max_seq_len=1024, max_target_len=64)
    loader = packpipe.RankLoader(ds, packpipe.plan_epoch(t5, ds, **kw), rank=None)
    cut = 0
    for it in loader:
        assert (it.plan.max_seq_len, it.plan.max_target_len) == (1024, 64)
        for mb in it.plan.microbatches:
            assert max(mb["lengths"]) <= 1024 and max(mb["target_lengths"]) <= 64
        check_loads(ds, it.plan, it.loads)
    for it in packpipe.plan_epoch(t5, ds, **kw):
        cut += it.result.seq_truncated
        assert (it.trained_target_lengths <= 64).all() and (it.sample_target_lengths >= it.target_lengths).all()
    assert cut > 0
    with pytest.raises(ValueError, match="seq_policy 'split' is for decoder-only models"):
        packpipe.plan_epoch(t5, ds, **dict(kw, seq_policy="split"))

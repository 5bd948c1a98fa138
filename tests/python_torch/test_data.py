"""PlanLoader and MicroBatch: the tensors equal an independent assembly from the dataset's tokens,
resume after state_dict() gives what an uninterrupted run gives, plan files and planning agree,
and the masks keep packed samples apart."""
import numpy as np
import pytest
import torch

import packpipe
import packpipe.torch as pt
from packpipe.torch import models

import support

GPT = models.GPTConfig(vocab_size=96, hidden=16, layers=4, heads=2, dtype=torch.float64)
T5C = models.T5Config(vocab_size=96, hidden=16, encoder_layers=2, decoder_layers=2, heads=2, dtype=torch.float64)


def loader(tmp_path, cfg, **kw):
    args = dict(cost_model=support.cost_model(cfg, tmp_path), shape=packpipe.PipelineShape(stages=2),
                global_batch_tokens=500, seed=3, dtype="fp64", rank=None, iterations=4)
    args.update(kw)
    return pt.PlanLoader(support.short_manifest(tmp_path), **args)


def expected_rows(it, mb, encdec, loss):
    """The micro-batch's rows rebuilt here from the dataset (support.sample_tensors) and the plan's
    rows: {name: int64 [rows, seq]}."""
    info = it.plan.microbatches[mb]
    rows, seq, dseq = info["rows"], info["padded_len"], info["padded_dec_len"]
    offsets = list(info["row_offsets"]) or list(range(len(info["samples"]) + 1))
    data = it_dataset[0]
    out = {"input_ids": np.zeros((rows, seq), np.int64), "labels": np.full((rows, seq), -100, np.int64),
           "position_ids": np.zeros((rows, seq), np.int64)}
    if encdec:
        out.update(decoder_input_ids=np.zeros((rows, dseq), np.int64),
                   decoder_labels=np.full((rows, dseq), -100, np.int64))
    tl = info["target_lengths"] if len(info["target_lengths"]) else [0] * len(info["samples"])
    for r in range(rows):
        col = dcol = 0
        for i in range(offsets[r], offsets[r + 1]):
            ref = info["refs"][i]
            s = support.sample_tensors(data, ref[0], ref[1], info["lengths"][i], tl[i], encdec, loss)
            n = len(s["input_ids"])
            out["input_ids"][r, col:col + n] = s["input_ids"]
            out["position_ids"][r, col:col + n] = np.arange(n)
            if not encdec:
                out["labels"][r, col:col + n] = s["labels"]
            else:
                d = len(s["decoder_input_ids"])
                out["decoder_input_ids"][r, dcol:dcol + d] = s["decoder_input_ids"]
                out["decoder_labels"][r, dcol:dcol + d] = s["decoder_labels"]
                dcol += d
            col += n
    return out


it_dataset = [None]


@pytest.mark.parametrize("cfg,method,loss", [(GPT, "dp", "all"), (GPT, "packing", "targets"), (T5C, "dp", "targets"),
                                             (T5C, "packing", "all")])
def test_tensors_equal_an_independent_assembly(tmp_path, cfg, method, loss):
    ld = loader(tmp_path, cfg, options=packpipe.PartitionOptions(method=method, mbs=4 if method == "packing" else 0),
                loss=loss)
    it_dataset[0] = ld.dataset
    encdec = cfg is T5C
    checked = iterations = 0
    layouts = set()
    for it in ld:
        iterations += 1
        layouts.update(m["layout"] for m in it.plan.microbatches)
        assert it.loss_tokens == sum(m["loss_tokens"] for m in it.plan.microbatches) > 0
        for mb in range(len(it.plan.microbatches)):
            want = expected_rows(it, mb, encdec, loss)
            first = it.loaded(mb, 0)
            last = it.loaded(mb, it.plan.vstages - 1)
            assert np.array_equal(first["input_ids"].numpy(), want["input_ids"])
            assert np.array_equal(first["position_ids"].numpy(), want["position_ids"])
            if encdec:
                assert np.array_equal(last["decoder_labels"].numpy(), want["decoder_labels"])
                dec = [v for v in range(it.plan.vstages) if "decoder_input_ids" in it.plan.stages[v]["loads"]][0]
                assert np.array_equal(it.loaded(mb, dec)["decoder_input_ids"].numpy(), want["decoder_input_ids"])
                labels = want["decoder_labels"]
            else:
                assert np.array_equal(last["labels"].numpy(), want["labels"])
                labels = want["labels"]
            assert int((labels != -100).sum()) == it.plan.microbatches[mb]["loss_tokens"]
            # Every stage sees the same layout; positions equal the loaded ones.
            batch = it.microbatch(mb, stage=1)
            assert torch.equal(batch.position_ids, first["position_ids"])
            checked += 1
    assert iterations >= 2 and checked >= iterations  # every micro-batch of several iterations
    assert layouts <= {"padded", "packed"}


def test_resume_gives_what_an_uninterrupted_run_gives(tmp_path):
    whole = [it for it in loader(tmp_path, GPT, iterations=5)]
    part = loader(tmp_path, GPT, iterations=5)
    got = [next(part), next(part)]
    state = part.state_dict()
    assert state["next_iteration"] == 2
    resumed = loader(tmp_path, GPT, iterations=5)
    resumed.load_state_dict(state)
    got += list(resumed)
    assert [it.iteration for it in got] == [it.iteration for it in whole] == list(range(5))
    for a, b in zip(whole, got):
        assert a.plan == b.plan
        for mb in range(len(a.plan.microbatches)):
            for v in (0, a.plan.vstages - 1):
                for name, t in a.loaded(mb, v).items():
                    assert torch.equal(t, b.loaded(mb, v)[name])
    other = loader(tmp_path, GPT, iterations=5, seed=4)
    with pytest.raises(ValueError, match="other settings"):
        other.load_state_dict(state)


def test_plan_file_and_planning_agree_and_ranks_get_their_loads(tmp_path):
    planned = list(loader(tmp_path, GPT, iterations=3))
    path = str(tmp_path / "plans.ppln")
    with packpipe.PlanFileWriter(path) as w:
        for it in planned:
            w.append(it.plan)
    from_file = list(pt.PlanLoader(support.short_manifest(tmp_path), plan_file=path, rank=None))
    assert [a.plan == b.plan for a, b in zip(planned, from_file)] == [True] * 3
    only1 = next(iter(loader(tmp_path, GPT, rank=1)))
    assert only1.plan == planned[0].plan
    loads = [ins for ins in only1.plan.streams[1] if ins.op == "LOAD_MB"]
    assert loads, "the last stage loads labels"
    for ins in loads:
        assert set(only1.loaded(ins.mb, ins.stage)) == {"labels"}
    with pytest.raises(KeyError, match="no inputs of micro-batch 0 stage 0"):
        only1.loaded(0, 0)
    with pytest.raises(ValueError, match="exactly one of cost_model"):
        pt.PlanLoader(support.short_manifest(tmp_path))


def test_masks_keep_packed_samples_apart(tmp_path):
    ld = loader(tmp_path, GPT, options=packpipe.PartitionOptions(method="packing", mbs=2))
    it = next(iter(ld))
    mb = next(m for m in range(len(it.plan.microbatches)) if len(it.plan.microbatches[m]["row_offsets"]))
    batch = it.microbatch(mb, stage=0)
    seg = batch.segment_ids
    mask = batch.attention_mask(causal=True)[:, 0]
    rows, n = seg.shape
    for r in range(rows):
        for q in range(n):
            for k in range(n):
                same = seg[r, q] == seg[r, k] and seg[r, q] > 0
                want = (same and k <= q) or q == k
                assert bool(mask[r, q, k]) == bool(want)
    assert int(batch.cu_seqlens[-1]) == rows * n
    assert batch.max_seqlen == max(it.plan.microbatches[mb]["lengths"])
    x = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="decoder boundary tensor"):
        batch.split_boundary(x)

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


def test_one_state_for_the_job_restores_on_every_rank_and_replica(tmp_path):
    """The usual checkpoint pattern: rank 0 (replica 0, pipeline rank 0) saves, every rank and replica
    loads the same state, and each continues with what an uninterrupted run of its own delivers."""
    shape = packpipe.PipelineShape(stages=2, dp=2)
    saver = loader(tmp_path, GPT, iterations=4, shape=shape, replica=0, rank=0)
    next(saver)
    state = saver.state_dict()
    for replica in (0, 1):
        for rank in (0, 1):
            whole = list(loader(tmp_path, GPT, iterations=4, shape=shape, replica=replica, rank=rank))
            resumed = loader(tmp_path, GPT, iterations=4, shape=shape, replica=replica, rank=rank)
            resumed.load_state_dict(state)
            rest = list(resumed)
            assert [it.iteration for it in rest] == [1, 2, 3]
            for a, b in zip(whole[1:], rest):
                assert a.plan == b.plan and a.plan.replica == replica
    with pytest.raises(ValueError, match="other settings"):
        loader(tmp_path, GPT, iterations=4, shape=packpipe.PipelineShape(stages=2, dp=1)).load_state_dict(state)


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


@pytest.mark.parametrize("kw, exc, message", [
    (dict(iterations=-1), ValueError, r"PlanLoader: iterations must be in \[0, \d+\], found -1"),
    (dict(iterations=True), TypeError, "PlanLoader: iterations must be an integer .* found bool True"),
    (dict(iterations=2.0), TypeError, "iterations must be an integer .* found float 2.0"),
    (dict(depth=0), ValueError, r"depth must be in \[1, 256\], found 0"),
    (dict(depth=10 ** 12), ValueError, r"depth must be in \[1, 256\], found 1000000000000"),
    (dict(first_iteration=2.5), TypeError, "first_iteration must be an integer"),
    (dict(first_iteration=-3), ValueError, "first_iteration must be in"),
    (dict(epoch=-1), ValueError, "epoch must be in"),
    (dict(replica="0"), TypeError, "replica must be an integer .* found str '0'"),
    (dict(rank=-1), ValueError, "rank must be in"),
    (dict(ignore_index=2 ** 70), ValueError, "ignore_index must be in"),
    (dict(pad_id=-1), ValueError, "pad_id must be in"),
    (dict(decoder_start_id=None), TypeError, "decoder_start_id must be an integer"),
    (dict(bogus=1), TypeError, "PlanLoader: unknown keyword argument 'bogus' .*global_batch_tokens"),
    (dict(encode=True), TypeError, "unknown keyword argument 'encode'"),
    (dict(shape="2 stages"), TypeError, "shape must be packpipe._core.PipelineShape, found str"),
    (dict(schedule_fallback=1), TypeError, "schedule_fallback must be bool, found int 1"),
    (dict(baseline_mbs=[1, 2.5]), ValueError, r"baseline_mbs\[1\] must be an integer, found 2.5"),
    (dict(cost_model="gpt-1.3b"), TypeError, "cost_model must be CostModel, found str"),
    (dict(global_batch_tokens=0), ValueError, "give exactly one of a global batch token budget"),
])
def test_bad_loader_arguments_are_refused_at_construction_naming_them(tmp_path, kw, exc, message):
    with pytest.raises(exc, match=message) as e:
        loader(tmp_path, GPT, **kw)
    assert "incompatible function arguments" not in str(e.value)


def test_bad_loader_sources_are_refused_naming_them(tmp_path):
    with pytest.raises(TypeError, match="PlanLoader: dataset must be a MultiTaskDataset, or the path"):
        pt.PlanLoader(5, cost_model=support.cost_model(GPT, tmp_path), global_batch_tokens=500)
    with pytest.raises(TypeError, match="PlanLoader: plan_file must be a path"):
        pt.PlanLoader(support.short_manifest(tmp_path), plan_file=5)
    with pytest.raises(ValueError, match="PlanLoader: plan_file is an empty path"):
        pt.PlanLoader(support.short_manifest(tmp_path), plan_file="")
    with pytest.raises(ValueError, match=r"planning settings \['schedule'\] do not apply to a plan file"):
        pt.PlanLoader(support.short_manifest(tmp_path), plan_file="x.plan", schedule="1f1b")
    with pytest.raises(RuntimeError, match="missing.plan"):  # opened at construction, not at the first iteration
        pt.PlanLoader(support.short_manifest(tmp_path), plan_file=str(tmp_path / "missing.plan"))


@pytest.mark.parametrize("change, exc, message", [
    (lambda s: s.pop("epoch"), ValueError, "state has fields .* missing epoch"),
    (lambda s: s.pop("next_iteration"), ValueError, "state has fields .* missing next_iteration"),
    (lambda s: s.pop("config"), ValueError, "state has fields .* missing config"),
    (lambda s: s.update(extra=1), ValueError, "state has fields .* unknown extra"),
    (lambda s: s.update(next_iteration=2.7), TypeError, r"state\['next_iteration'\] must be an integer .*float 2.7"),
    (lambda s: s.update(next_iteration="2"), TypeError, r"state\['next_iteration'\] must be an integer .*str '2'"),
    (lambda s: s.update(next_iteration=True), TypeError, r"state\['next_iteration'\] must be an integer .*bool"),
    (lambda s: s.update(next_iteration=-1), ValueError, r"state\['next_iteration'\] must be in \[0, 5\], found -1"),
    (lambda s: s.update(next_iteration=6), ValueError, r"state\['next_iteration'\] must be in \[0, 5\], found 6"),
    (lambda s: s.update(epoch="0"), TypeError, r"state\['epoch'\] must be an integer"),
    (lambda s: s.update(epoch=0.0), TypeError, r"state\['epoch'\] must be an integer"),
    (lambda s: s.update(config=None), TypeError, r"state\['config'\] must be a str"),
    (lambda s: s.update(calibration=5), TypeError, r"state\['calibration'\] must be None or a str"),
])
def test_a_bad_loader_state_names_the_field(tmp_path, change, exc, message):
    good = loader(tmp_path, GPT, iterations=5)
    next(good)
    state = good.state_dict()
    change(state)
    target = loader(tmp_path, GPT, iterations=5)
    with pytest.raises(exc, match="PlanLoader.load_state_dict: " + message):
        target.load_state_dict(state)
    assert next(target).iteration == 0  # nothing changed


def test_a_loader_state_that_is_not_a_dict_is_refused(tmp_path):
    target = loader(tmp_path, GPT, iterations=5)
    for bad in (None, [("epoch", 0)], "state"):
        with pytest.raises(TypeError, match="state must be the dict state_dict"):
            target.load_state_dict(bad)


def test_a_layout_prints_what_it_holds(tmp_path):
    it = next(iter(loader(tmp_path, GPT, iterations=1)))
    for mb, info in enumerate(it.plan.microbatches):
        text = repr(it.layout(mb))
        assert text.startswith(f"Layout(iteration {it.iteration}, micro-batch {mb}: {info['layout']}, ")
        assert f"{len(info['samples'])} samples, {info['loss_tokens']} loss tokens" in text and " object at " not in text


def test_the_fields_each_client_takes(tmp_path):
    """The guide's per-client forms on real micro-batches: HF's flattened packed form (seq_idx 0-based
    int32 [1, tokens], cu_seq_lens_q/k over the one row without padding, max_length >= every segment),
    Megatron's THD PackedSeqParams fields and loss_mask beside vocabulary-indexing labels; seq_idx
    refuses a layout that is not HF's flattened form."""
    packed = loader(tmp_path, GPT, iterations=1, options=packpipe.PartitionOptions(layouts=("packed",)))
    it = next(iter(packed))
    for mb in range(len(it.plan.microbatches)):
        b = it.microbatch(mb)
        assert b.layout == "packed" and b.rows == 1
        tokens = b.input_ids.shape[1]
        idx = b.seq_idx
        assert idx.dtype == torch.int32 and tuple(idx.shape) == (1, tokens)
        cu = b.cu_seq_lens_q.tolist()
        assert cu[0] == 0 and cu[-1] == tokens  # no padding in HF's flattened form
        for k in range(len(cu) - 1):
            assert bool((idx[0, cu[k]:cu[k + 1]] == k).all())
            assert b.max_length_q >= cu[k + 1] - cu[k]
        # Megatron THD: PackedSeqParams(qkv_format="thd", cu_seqlens_q=, cu_seqlens_kv=, max_seqlen_q=, max_seqlen_kv=)
        assert torch.equal(b.cu_seqlens, b.cu_seq_lens_q) and torch.equal(b.cu_seqlens_k, b.cu_seq_lens_k)
        mask = b.loss_mask
        assert mask.dtype == torch.float32 and int(mask.sum()) == b.loss_tokens
        assert bool(((b.labels != -100) == (mask > 0)).all()) and int(b.labels.clamp(min=0).min()) >= 0
    padded = next(iter(loader(tmp_path, GPT, iterations=1, options=packpipe.PartitionOptions(layouts=("padded",)))))
    b = padded.microbatch(0)
    with pytest.raises(ValueError, match=r"seq_idx is HF's flattened form.*padded.*layouts=\('packed',\)"):
        b.seq_idx
    assert int(b.loss_mask.sum()) == b.loss_tokens

"""Slices (docs/design/015-long-context.md): long samples cut into consecutive micro-batches that
attend to their earlier slices' kept keys and values, backward in reverse slice order, train exactly
as the unsliced samples do: gradients and parameters equal the whole model run on each sample alone
(fp64, 1e-10) on every runner and schedule kind that runs slices, with full recompute, a split
backward, and one stage with gradient accumulation."""
import copy
import numpy as np
import pytest
import torch

import packpipe
import packpipe.torch as pt
from packpipe.torch import models

import support

torch.set_num_threads(1)

GPT = models.GPTConfig(vocab_size=96, hidden=16, layers=4, heads=2, dtype=torch.float64, seed=3,
                       max_positions=4096)


def loader(tmp_path, *, pp, schedule="1f1b", options=None, recompute="none", iterations=2, tokens=1500, seed=11,
           split_backward=False, dp=1, replica=None, rank=None):
    cm = support.cost_model(GPT, tmp_path)
    manifest = support.long_manifest(tmp_path)
    options = options or packpipe.PartitionOptions(method="slicing", capacity=128, recompute=recompute)
    kw = {} if replica is None else {"replica": replica}
    return pt.PlanLoader(manifest, cost_model=cm, rank=rank, iterations=iterations,
                         shape=packpipe.PipelineShape(stages=pp, dp=dp), options=options, global_batch_tokens=tokens,
                         seed=seed, schedule=schedule, dtype="fp64", schedule_fallback=True,
                         split_backward=split_backward, **kw), packpipe.MultiTaskDataset(manifest)


def sliced(plan):
    return any(len(mb["prev"]) for mb in plan.microbatches)


def run_local(load, data, lr=0.05):
    """LocalPipeline over the loader's iterations against the whole model on each sample alone."""
    full = models.GPT(GPT)
    ref, pipe_model = full, copy.deepcopy(full)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr)
    sink, stages, pipe, first, kinds, slices = {}, None, None, None, [], 0
    for it in load:
        plan = it.plan
        kinds.append(plan.schedule)
        slices += sliced(plan)
        if pipe is None:
            stages = {v: pipe_model.stage(plan.stages[v]) for v in range(plan.vstages)}
            pipe = pt.LocalPipeline(stages, models.gpt_loss, lambda ps: support.RecordingSGD(ps, lr, sink),
                                    dtype=torch.float64, timeout_s=120)
        ref_opt.zero_grad()
        l_ref = support.reference_loss(ref, data, support.batch_samples([plan]), False, "all", plan.global_loss_tokens)
        l_ref.backward()
        result = pipe.run(it)
        assert abs(result.loss - float(l_ref)) <= 1e-9 * max(1.0, abs(float(l_ref))), (result.loss, float(l_ref))
        pairs = [pr for m in stages.values() for pr in support.param_pairs(m, ref)]
        if first is None:
            first = support.grad_error(pairs, sink)
        ref_opt.step()
    pairs = [pr for m in stages.values() for pr in support.param_pairs(m, ref)]
    return first, support.relative_error(pairs, "data"), kinds, slices


@pytest.mark.parametrize("pp,schedule,recompute,split", [
    (2, "1f1b", "none", False),
    (4, "1f1b", "none", False),
    (4, "gpipe", "full", False),
    (2, "wait-free-cyclic", "none", False),
    (4, "zero-bubble", "none", True),
])
def test_sliced_samples_train_as_the_whole_model(tmp_path, pp, schedule, recompute, split):
    load, data = loader(tmp_path, pp=pp, schedule=schedule, recompute=recompute, split_backward=split)
    g, p, kinds, slices = run_local(load, data)
    assert slices == 2, "every iteration holds sliced samples"
    assert set(kinds) == {schedule}
    assert g <= 1e-10 and p <= 1e-10, (g, p)


def test_a_sliced_and_an_unsliced_plan_of_the_same_batch_train_alike(tmp_path):
    """The same global batch planned with slices and whole: both equal the reference on each sample
    alone, over the same samples, so slicing never changes what is trained."""
    results = {}
    for name, opts in (("sliced", packpipe.PartitionOptions(method="slicing", capacity=96)),
                       ("whole", packpipe.PartitionOptions(method="packing", mbs=1, slicing="off"))):
        d = tmp_path / name
        d.mkdir()
        load, data = loader(d, pp=2, options=opts, iterations=1)
        its = list(load)
        assert sliced(its[0].plan) == (name == "sliced")
        results[name] = sorted(support.batch_samples([its[0].plan]))
        g, p, _, _ = run_local(its, data)
        assert g <= 1e-10 and p <= 1e-10, (name, g, p)
    assert results["sliced"] == results["whole"]


def test_gradient_accumulation_runs_slices_forward_in_order_and_back_in_reverse(tmp_path):
    load, data = loader(tmp_path, pp=1, iterations=2)
    its = list(load)
    full = models.GPT(GPT)
    model = copy.deepcopy(full).stage(its[0].plan.stages[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(full.parameters(), lr=0.05)
    runner = pt.GradientAccumulation(model, models.gpt_loss, opt)
    pairs = support.param_pairs(model, full)
    n = 0
    for it in its:
        n += sliced(it.plan)
        ref_opt.zero_grad()
        l_ref = support.reference_loss(full, data, support.batch_samples([it.plan]), False, "all",
                                       it.plan.global_loss_tokens)
        l_ref.backward()
        grads = {id(p): p.grad.detach().clone() for p in full.parameters()}
        opt.zero_grad()
        # the accumulated gradients before the step: run without the optimizer, compare, then step
        runner.optimizer = None
        res = runner.run(it)
        assert abs(res.loss - float(l_ref)) <= 1e-9 * max(1.0, abs(float(l_ref)))
        err = max(float((a.grad - grads[id(b)]).abs().max() / (grads[id(b)].abs().max() + 1e-300))
                  for a, b in pairs)
        assert err <= 1e-10, err
        opt.step()
        ref_opt.step()
    assert n == 2


def test_attention_keeps_the_contract_of_flash_attn_varlen(tmp_path):
    """A slice's keys side: cu_seqlens_k counts its kept prefix and its own tokens, max_seqlen_k the
    longest; positions continue from the prefix; the last token of a slice that continues has a label."""
    load, data = loader(tmp_path, pp=1, iterations=1)
    it = next(iter(load))
    seen = 0
    for m, info in enumerate(it.plan.microbatches):
        b = it.microbatch(m)
        q = b.cu_seqlens.numpy()
        k = b.cu_seqlens_k.numpy()
        pre = b.prefix
        assert np.array_equal(np.diff(k), np.diff(q) + pre) and b.max_seqlen_k == int(np.max(np.diff(k)))
        assert b.cu_seq_lens_k is not None and b.max_length_k == b.max_seqlen_k
        pos = b.position_ids.numpy()[0]
        for i, p in enumerate(pre):
            assert pos[q[i]] == p
            seen += p > 0
        labels = b.labels.numpy()[0]
        lay = packpipe.microbatch_layout(it.plan, m)
        for i, c in enumerate(lay["continues"]):
            if c:  # the next slice's first token is this slice's last label
                assert labels[q[i + 1] - 1] != -100
    assert seen > 0


# ---- data parallelism over two gloo processes: slices, and a replica without a sample -------------

def _ddp_worker(rank, world, config):
    """One stage, a replica per rank: GradientAccumulation under DDP, then PipelineRunner (pp 1, dp 2),
    on batches of `samples` samples (one: a replica gets no sample and still steps, with zeros)."""
    import tempfile
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    tmp = tempfile.mkdtemp(prefix="pp-slices-")
    cm = support.cost_model(GPT, tmp)
    manifest = support.long_manifest(tmp)
    opts = packpipe.PartitionOptions(method="slicing", capacity=128)
    common = dict(shape=packpipe.PipelineShape(stages=1, dp=world), options=opts, seed=5, dtype="fp64",
                  global_batch_samples=config["samples"], iterations=2)
    load = pt.PlanLoader(manifest, cost_model=cm, calibrate=False, **common)
    plans = [p.result.plans for p in packpipe.plan_epoch(cm, packpipe.MultiTaskDataset(manifest), **common)]
    out = {"errors": [], "empty": 0, "sliced": 0}
    for path in ("ddp", "runner"):
        full = models.GPT(GPT)
        model = copy.deepcopy(full).stage(plans[0][0].stages[0])
        if path == "ddp":
            step = pt.GradientAccumulation(DDP(model), models.gpt_loss)
        else:
            step = pt.PipelineRunner({0: model}, models.gpt_loss, None, pp=1, dp=world, timeout_s=60)
        for it, replicas in zip(load, plans):
            out["empty"] += not it.plan.microbatches
            out["sliced"] += sliced(it.plan)
            model.zero_grad(set_to_none=True)
            full.zero_grad(set_to_none=True)
            step.run(it)
            ref = support.reference_loss(full, load.dataset, support.batch_samples(replicas), False, "all",
                                         it.plan.global_loss_tokens)
            ref.backward()
            pairs = support.param_pairs(model, full)
            out["errors"].append(max(float((a.grad - b.grad).abs().max() / (b.grad.abs().max() + 1e-300))
                                     for a, b in pairs))
            if path == "ddp" and "leftover" not in out:
                # optimizer=None, not zeroed: a second run adds its reduced gradients to the first's, as DDP
                # does (the sum by hand of slices and empty replicas reduced the old ones again: 3x, not 2x)
                once = [a.grad.clone() for a, _ in pairs]
                step.run(it)
                out["leftover"] = max(float((a.grad - 2 * g).abs().max() / (g.abs().max() + 1e-300))
                                      for (a, _), g in zip(pairs, once))
        load.set_epoch(0)
        load = pt.PlanLoader(manifest, cost_model=cm, calibrate=False, **common)
        if path == "runner":
            step.close()
    dist.barrier()
    return out


@pytest.mark.parametrize("samples", [1, 6])
def test_data_parallel_slices_and_a_replica_without_a_sample(samples):
    results = support.spawn(_ddp_worker, 2, {"samples": samples}, timeout_s=300)
    assert sorted(results) == [0, 1], results
    for rank, (status, out) in sorted(results.items()):
        assert status == "ok", out
        assert out["errors"] and max(out["errors"]) <= 1e-10, (rank, out)
        assert out["leftover"] <= 1e-10, (rank, out)
    empty = sum(out["empty"] for _, (_, out) in results.items())
    if samples == 1:
        assert empty == 4, "every iteration leaves one of the two replicas without a sample (both paths)"
    else:
        assert sum(out["sliced"] for _, (_, out) in results.items()) > 0


def test_an_iteration_counts_a_sliced_sample_once(tmp_path):
    """Iteration.samples: a sample cut into slices sits in several micro-batches and is one sample."""
    load, _ = loader(tmp_path, pp=2, iterations=1)
    it = next(iter(load))
    assert sliced(it.plan)
    entries = sum(len(mb["samples"]) for mb in it.plan.microbatches)
    unique = {int(s) for mb in it.plan.microbatches for s in mb["samples"]}
    assert it.samples == len(unique) < entries

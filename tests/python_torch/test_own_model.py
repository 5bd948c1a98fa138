"""A model of the user's own (defined here, not packpipe.torch.models) on every path of the guide:
gradient accumulation in one process, DDP over two gloo ranks (GradientAccumulation and the
hand-written no_sync loop), Hugging Face's unshifted labels, a two-stage pipeline in one process
(its tied weight a Parameter both stages share) and over two processes, and training from a plan
file. Each path's gradients equal the whole model run on every sample alone in one process (fp64:
1e-10 relative)."""
import contextlib
import copy
import math
import tempfile
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import packpipe
import packpipe.torch as pt
from packpipe.torch.attention import attention

import support

torch.set_num_threads(1)
VOCAB = 64
TOL = 1e-10


def fold(ids):
    return torch.where(ids < 0, ids, torch.remainder(ids, VOCAB))


class Layer(nn.Module):
    """A pre-norm layer with separate q, k, v projections and a gated MLP (SwiGLU)."""

    def __init__(self, hidden, heads):
        super().__init__()
        self.n_head = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
        self.ln2 = nn.LayerNorm(hidden)
        self.gate = nn.Linear(hidden, 3 * hidden, bias=False)
        self.up = nn.Linear(hidden, 3 * hidden, bias=False)
        self.down = nn.Linear(3 * hidden, hidden, bias=False)

    def forward(self, x, batch):
        rows, n, h = x.shape
        a = self.ln1(x)

        def heads(t):
            return t.view(rows, n, self.n_head, -1).transpose(1, 2)
        y = attention(heads(self.q(a)), heads(self.k(a)), heads(self.v(a)), batch, causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(rows, n, h))
        b = self.ln2(x)
        return x + self.down(F.silu(self.gate(b)) * self.up(b))


class OwnLM(nn.Module):
    """Embeddings, layers, a final norm and an LM head tied to the token embedding."""

    def __init__(self, layers=4, hidden=16, heads=2, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.tok = nn.Embedding(VOCAB, hidden)
        self.pos = nn.Embedding(512, hidden)
        self.layers = nn.ModuleList(Layer(hidden, heads) for _ in range(layers))
        self.final = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, VOCAB, bias=False)
        self.lm_head.weight = self.tok.weight
        self.double()

    def forward(self, hidden, batch):
        return OwnStage(self, {"layers": (0, len(self.layers)), "embedding": True, "head": True})(hidden, batch)

    def stage(self, spec):
        return OwnStage(self, spec)


class OwnStage(nn.Module):
    def __init__(self, model, spec):
        super().__init__()
        self.tok = model.tok if spec["embedding"] else None
        self.pos = model.pos if spec["embedding"] else None
        self.layers = nn.ModuleList(model.layers[spec["layers"][0]:spec["layers"][1]])
        self.final = model.final if spec["head"] else None
        self.lm_head = model.lm_head if spec["head"] else None
        self.tied_weight = model.tok.weight if spec["embedding"] or spec["head"] else None

    def forward(self, hidden, batch):
        x = self.tok(fold(batch.input_ids)) + self.pos(batch.position_ids) if self.tok is not None else hidden
        for layer in self.layers:
            x = layer(x, batch)
        return self.lm_head(self.final(x)) if self.lm_head is not None else x


def loss_fn(logits, batch):
    return pt.summed_token_loss(logits, batch, labels=fold(batch.labels))


def hf_style_loss(logits, batch):
    """What a Hugging Face causal LM does with labels aligned with its inputs: shift, then sum."""
    labels = fold(batch.labels)
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100,
                           reduction="sum")


class OneSample:
    """One sample alone in a row: the reference's batch (dense causal attention, nothing packed)."""
    layout = "padded"
    labels_shifted = True
    encoder_decoder = False

    def __init__(self, ids, labels):
        self.input_ids, self.labels = torch.from_numpy(ids)[None], torch.from_numpy(labels)[None]
        self.position_ids = torch.arange(len(ids))[None]
        self.segment_ids = torch.ones(1, len(ids), dtype=torch.int64)
        self.loaded = {"input_ids": self.input_ids, "labels": self.labels}


def reference_grads(model, dataset, plans, loss="all"):
    """{parameter name: gradient} of the whole batch of `plans` (every replica's), each sample alone."""
    ref = copy.deepcopy(model)
    ref.zero_grad(set_to_none=True)
    total = 0
    for task, index, n, t in support.batch_samples(plans):
        s = support.sample_tensors(dataset, task, index, n, t, False, loss)
        batch = OneSample(s["input_ids"], s["labels"])
        total = total + loss_fn(ref(None, batch), batch)
    (total / plans[0].global_loss_tokens).backward()
    return {name: p.grad.clone() for name, p in ref.named_parameters()}


def grad_error(model, ref, names=None):
    num = den = 0.0
    for name, p in model.named_parameters():
        if names is not None and name not in names:
            continue
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        num += float(((g - ref[name]) ** 2).sum())
        den += float((ref[name] ** 2).sum())
    return math.sqrt(num) / max(math.sqrt(den), 1e-300)


def settings(tmp, model, stages=1, dp=1, **kw):
    """(manifest, PlanLoader/plan_epoch planning settings, cost model)."""
    manifest = support.short_manifest(tmp)
    cm = pt.cost_model(model, support.CPU_DEVICE)
    plan = dict(shape=packpipe.PipelineShape(stages=stages, dp=dp, memory_mb=1.5), global_batch_tokens=700, seed=5,
                tied_embedding=True, **kw)
    return manifest, plan, cm


def all_plans(cm, manifest, plan, iterations):
    return [it.result.plans for it in packpipe.plan_epoch(cm, packpipe.MultiTaskDataset(manifest), dtype="fp64",
                                                          split_backward=False, iterations=iterations, **plan)]


def test_the_cost_model_is_read_from_the_module():
    spec = pt.describe_model(OwnLM())
    assert spec == {"name": "OwnLM", "arch": "decoder_only", "num_layers": 4, "hidden": 16, "heads": 2, "kv_heads": 2,
                    "head_dim": 8, "ffn_hidden": 48, "gated_mlp": True, "vocab": VOCAB, "bytes_per_param": 8,
                    "dtype": "fp64"}
    cm = pt.cost_model(OwnLM(), support.CPU_DEVICE)
    assert cm.torch_dtype == torch.float64 and cm.model["gated_mlp"] and cm.model["num_layers"] == 4
    assert cm.model["dtype"] == "fp64"  # the activations between stages: planning's default dtype


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_accumulation_in_one_process(tmp_path, layout):
    model = OwnLM()
    manifest, plan, cm = settings(tmp_path, model, options=packpipe.PartitionOptions(layouts=(layout,)))
    loader = pt.PlanLoader(manifest, cost_model=cm, iterations=2, calibrate=False, **plan)
    assert loader.rank is None and loader.replica == 0 and loader.dtype == torch.float64
    step = pt.GradientAccumulation(model, loss_fn)
    for it, plans in zip(loader, all_plans(cm, manifest, plan, 2)):
        assert len(it.plan.microbatches) >= 3  # several micro-batches to accumulate over
        assert {m["layout"] for m in it.plan.microbatches} == {layout}
        model.zero_grad(set_to_none=True)
        result = step.run(it)
        ref = reference_grads(model, loader.dataset, plans)
        assert grad_error(model, ref) <= TOL
        assert result.loss == pytest.approx(result.loss_sum / it.global_loss_tokens)


def test_unshifted_labels_for_a_model_that_shifts_itself(tmp_path):
    model = OwnLM()
    manifest, plan, cm = settings(tmp_path, model)
    shifted = next(iter(pt.PlanLoader(manifest, cost_model=cm, iterations=1, calibrate=False, **plan)))
    loader = pt.PlanLoader(manifest, cost_model=cm, iterations=1, calibrate=False, labels="unshifted", **plan)
    it = next(iter(loader))
    for m in range(len(it.plan.microbatches)):
        a, b = shifted.microbatch(m), it.microbatch(m)
        assert not b.labels_shifted
        # the same (position, next token) pairs, one position later; nothing crosses a sample's start
        assert torch.equal(b.labels[:, 1:][b.position_ids[:, 1:] > 0], a.labels[:, :-1][b.position_ids[:, 1:] > 0])
        assert bool((b.labels[b.position_ids == 0] == -100).all())
        assert int((b.labels != -100).sum()) == b.loss_tokens
    ref = reference_grads(model, loader.dataset, all_plans(cm, manifest, plan, 1)[0])
    for loss in (hf_style_loss, loss_fn):  # the model's own shift, and summed_token_loss's
        model.zero_grad(set_to_none=True)
        pt.GradientAccumulation(model, loss).run(it)
        assert grad_error(model, ref) <= TOL


@pytest.mark.parametrize("per_rank", [False, True])
def test_a_pipeline_in_one_process_with_a_shared_tied_weight(tmp_path, per_rank):
    """The first and the last stage hold one Parameter (the tied embedding): its gradient is the
    whole model's, not twice it; a per-rank optimizer steps it once."""
    model = OwnLM()
    manifest, plan, cm = settings(tmp_path, model, stages=2)
    loader = pt.PlanLoader(manifest, cost_model=cm, iterations=1, calibrate=False, **plan)
    stages = {v: model.stage(loader.stages[v]) for v in loader.my_stages}
    assert stages[0].tied_weight is stages[1].tied_weight
    it = next(iter(loader))
    ref = reference_grads(model, loader.dataset, all_plans(cm, manifest, plan, 1)[0])
    if not per_rank:
        pt.LocalPipeline(stages, loss_fn).run(it)
        assert grad_error(model, ref) <= TOL
        return
    lr, before = 0.1, {n: p.detach().clone() for n, p in model.named_parameters()}
    pt.LocalPipeline(stages, loss_fn, lambda ps: torch.optim.SGD(ps, lr=lr)).run(it)
    num = den = 0.0
    for n, p in model.named_parameters():
        want = before[n] - lr * ref[n]
        num += float(((p.detach() - want) ** 2).sum())
        den += float(((before[n] - want) ** 2).sum())
    assert math.sqrt(num / den) <= TOL  # every parameter stepped once with the whole model's gradient


def test_training_from_a_plan_file(tmp_path):
    model = OwnLM()
    manifest, plan, cm = settings(tmp_path, model, stages=2)
    path = str(tmp_path / "plans.ppln")
    plans = all_plans(cm, manifest, plan, 2)
    with packpipe.PlanFileWriter(path) as w:
        w.expect_iterations(0, 2)
        for replicas in plans:
            for p in replicas:
                w.append(p)
    loader = pt.PlanLoader(manifest, plan_file=path)
    stages = {v: model.stage(loader.stages[v]) for v in loader.my_stages}
    runner = pt.LocalPipeline(stages, loss_fn)
    for it, replicas in zip(loader, plans):
        assert it.plan == replicas[0]
        model.zero_grad(set_to_none=True)
        runner.run(it)
        assert grad_error(model, reference_grads(model, loader.dataset, replicas)) <= TOL


# ---- two gloo processes ------------------------------------------------------------------------

def two_ranks(rank, world, config):
    """On each of two ranks: DDP accumulation (GradientAccumulation, then the hand-written loop),
    then a two-stage pipeline (PipelineRunner). Returns each path's gradient error."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    tmp = tempfile.mkdtemp(prefix="pp-own-")
    out = {}
    # Data parallel: one stage, a replica per rank, replica and rank from torch.distributed.
    model = OwnLM()
    manifest, plan, cm = settings(tmp, model, dp=world)
    loader = pt.PlanLoader(manifest, cost_model=cm, iterations=2, calibrate=False, **plan)
    out["replica"], out["rank"] = loader.replica, loader.rank
    ddp = DDP(model)
    step = pt.GradientAccumulation(ddp, loss_fn)
    for k, (it, plans) in enumerate(zip(loader, all_plans(cm, manifest, plan, 2))):
        model.zero_grad(set_to_none=True)
        if k == 0:
            result = step.run(it)
            out["share"] = result.loss
        else:  # by hand, as the guide shows
            batches = it.microbatches()
            for i, batch in enumerate(batches):
                with ddp.no_sync() if i < len(batches) - 1 else contextlib.nullcontext():
                    (loss_fn(ddp(None, batch), batch) * dist.get_world_size() / it.global_loss_tokens).backward()
        out[f"ddp{k}"] = grad_error(model, reference_grads(model, loader.dataset, plans))
        out[f"microbatches{k}"] = len(it.plan.microbatches)
    # A pipeline: a stage per rank, the tied embedding's two copies summed by the plan.
    model = OwnLM()
    manifest, plan, cm = settings(tmp, model, stages=world)
    loader = pt.PlanLoader(manifest, cost_model=cm, iterations=1, calibrate=False, **plan)
    stages = {v: model.stage(loader.stages[v]) for v in loader.my_stages}
    runner = pt.PipelineRunner(stages, loss_fn, None, pp=world, dp=1, timeout_s=60)
    it = next(iter(loader))
    runner.run(it)
    mine = {f"{n}" for n, p in model.named_parameters()
            if any(p is q for m in stages.values() for q in m.parameters())}
    out["pipeline"] = grad_error(model, reference_grads(model, loader.dataset, all_plans(cm, manifest, plan, 1)[0]),
                                 mine)
    out["stages"] = loader.my_stages
    runner.close()
    dist.barrier()
    return out


def test_data_parallel_and_a_pipeline_over_two_processes():
    results = support.spawn(two_ranks, 2, {}, timeout_s=240)
    assert sorted(results) == [0, 1], results
    for rank, (status, out) in sorted(results.items()):
        assert status == "ok", out
        assert (out["replica"], out["rank"]) == (rank, 0)
        assert out["stages"] == [rank]
        assert out["microbatches0"] >= 2 and out["microbatches1"] >= 2
        for path in ("ddp0", "ddp1", "pipeline"):
            assert out[path] <= TOL, (rank, path, out)
    # the replicas' shares of the batch's loss add up to the batch's loss (each is a part of it)
    assert 0 < results[0][1]["share"] and 0 < results[1][1]["share"]


class _HFStyle(torch.nn.Module):
    """A model written the Hugging Face way: forward(input_ids=..., position_ids=...)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 8).double()

    def forward(self, input_ids=None, position_ids=None):
        return self.embed(input_ids)


def test_a_module_written_another_way_is_told_the_call_contract(tmp_path):
    """module(hidden, batch) is the one call: an HF-style forward fails with a TypeError naming the
    contract, what its forward takes and the wrapper it needs, under both runners."""
    model = OwnLM()
    manifest, plan, cm = settings(tmp_path, model)
    it = next(iter(pt.PlanLoader(manifest, cost_model=cm, iterations=1, calibrate=False, **plan)))
    with pytest.raises(TypeError, match=r"GradientAccumulation: packpipe calls every module as module\(hidden, batch\).*"
                                        r"_HFStyle.forward takes \(input_ids, position_ids\).*Wrap an HF-style model: "
                                        r"packpipe.torch.HFCausalLM\(model\).*guide.md section 1"):
        pt.GradientAccumulation(_HFStyle(), loss_fn).run(it)
    # a module of the contract whose own code raises a TypeError keeps its own error
    class Broken(torch.nn.Module):
        def forward(self, hidden, batch):
            raise TypeError("my own bug")
    with pytest.raises(TypeError, match="^my own bug$"):
        pt.GradientAccumulation(Broken(), loss_fn).run(it)


class _FakeHF(torch.nn.Module):
    """The HF causal-LM calling convention, without transformers: keyword inputs, an output with
    .logits; per-token (no attention), so every layout must give the same gradients. Records what it
    was given."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.embed = torch.nn.Embedding(VOCAB, 8).double()
        self.pos = torch.nn.Embedding(512, 8).double()
        self.head = torch.nn.Linear(8, VOCAB).double()
        self.seen = []

    def forward(self, input_ids=None, position_ids=None, attention_mask=None, **kwargs):
        self.seen.append((attention_mask is not None, sorted(kwargs)))
        x = self.embed(torch.remainder(input_ids, VOCAB)) + self.pos(position_ids)
        return types.SimpleNamespace(logits=self.head(torch.tanh(x)))


def test_an_hf_style_model_trains_without_glue(tmp_path):
    """pt.HFCausalLM: an HF-style model under GradientAccumulation with pt.summed_token_loss and HF's
    unshifted labels: padded rows get the 2-D attention mask, packed rows the varlen keywords, and both
    layouts give the same gradients (the loss weighted per token of the global batch, as HF's
    num_items_in_batch); packed-mask micro-batches and a pipeline stage are refused by name."""
    grads = {}
    for layout in ("padded", "packed"):
        fake = _FakeHF()
        manifest, plan, cm = settings(tmp_path, OwnLM(), options=packpipe.PartitionOptions(layouts=(layout,)))
        loader = pt.PlanLoader(manifest, cost_model=cm, iterations=1, calibrate=False, labels="unshifted", **plan)
        it = next(iter(loader))
        pt.GradientAccumulation(pt.HFCausalLM(fake), lambda logits, b: pt.summed_token_loss(
            logits, b, labels=torch.remainder(b.labels, VOCAB).where(b.labels >= 0, b.labels))).run(it)
        grads[layout] = [p.grad.clone() for p in fake.parameters()]
        masks = {m for m, _ in fake.seen}
        keys = {k for _, ks in fake.seen for k in ks}
        if layout == "padded":
            assert masks == {True} and not keys
        else:
            assert masks == {False} and keys == {"cu_seq_lens_k", "cu_seq_lens_q", "max_length_k", "max_length_q",
                                                 "seq_idx"}
    assert all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(grads["padded"], grads["packed"]))
    manifest, plan, cm = settings(tmp_path, OwnLM(), options=packpipe.PartitionOptions(
        method="packing", mbs=1, capacity=256, layout="packed-mask"))
    plan["shape"] = packpipe.PipelineShape(stages=1, memory_mb=64)  # room for the block mask
    it = next(iter(pt.PlanLoader(manifest, cost_model=cm, iterations=1, calibrate=False, **plan)))
    with pytest.raises(ValueError, match=r"HFCausalLM: micro-batch 0 is packed-mask: HF models take no block mask"):
        pt.HFCausalLM(_FakeHF())(None, it.microbatch(0))
    with pytest.raises(ValueError, match=r"runs as one whole stage"):
        pt.HFCausalLM(_FakeHF())(torch.zeros(1), it.microbatch(0))
    with pytest.raises(TypeError, match=r"not an HF-style model"):
        pt.HFCausalLM(OwnLM())


def test_unshifted_labels_never_lose_a_slices_last_label(tmp_path):
    """labels="unshifted" cannot hold a slice's last label (the next slice's first token, in another micro-batch):
    the loader plans without slices (it lost one loss token per slice that continues: gradients off by 2e-3), refuses
    options that must slice, and a plan file's iteration with a slice that continues is refused, naming it."""
    from packpipe.torch import models
    gpt = models.GPTConfig(vocab_size=96, hidden=16, layers=2, heads=2, dtype=torch.float64, seed=3, max_positions=4096)
    cm = support.cost_model(gpt, tmp_path)
    manifest = support.long_manifest(tmp_path)
    kw = dict(cost_model=cm, iterations=1, shape=packpipe.PipelineShape(stages=1), global_batch_tokens=1500, seed=11,
              dtype="fp64", calibrate=False)
    sliced = packpipe.PartitionOptions(slicing="auto", min_slice_tokens=16)
    counts = {}
    for labels in ("shifted", "unshifted"):
        it = next(iter(pt.PlanLoader(manifest, options=sliced, labels=labels, **kw)))
        counts[labels] = (it.plan.global_loss_tokens, sum(
            int(((b.labels if b.labels_shifted else b.labels[:, 1:]) != -100).sum()) for b in it.microbatches()))
        assert any(len(m.get("prev", [])) for m in it.plan.microbatches) == (labels == "shifted")
    assert counts["unshifted"][0] == counts["unshifted"][1]  # every planned loss token is in the labels
    assert counts["shifted"][0] == counts["shifted"][1]
    for opts in (packpipe.PartitionOptions(method="slicing", capacity=128), packpipe.PartitionOptions(oversize="slice")):
        with pytest.raises(ValueError, match="labels='unshifted' cannot carry .* ask for slices"):
            pt.PlanLoader(manifest, options=opts, labels="unshifted", **kw)
    # a sample too long for one micro-batch is not offered slices, which this loader refuses (the message
    # suggested oversize slice), but told why not
    small = dict(kw, shape=packpipe.PipelineShape(stages=1, memory_mb=8))
    with pytest.raises(ValueError, match="truncate, drop, more stages.*slices, which are how .* cannot carry the label"):
        next(iter(pt.PlanLoader(manifest, labels="unshifted", **small)))
    # a plan file written with slices, read with unshifted labels
    path = str(tmp_path / "sliced.ppln")
    with packpipe.PlanFileWriter(path) as w:
        w.append(next(iter(pt.PlanLoader(manifest, options=packpipe.PartitionOptions(method="slicing", capacity=128),
                                         **kw))).plan)
    with pytest.raises(ValueError, match="iteration 0, micro-batch .*: labels='unshifted' cannot carry"):
        next(iter(pt.PlanLoader(manifest, plan_file=path, labels="unshifted", calibrate=False)))

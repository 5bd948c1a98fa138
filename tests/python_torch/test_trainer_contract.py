"""What a trainer of its own relies on (issue 22): PlanLoader's epochs as DistributedSampler's
(set_epoch, a second pass refused, len, state with the epoch), its defaults (dtype, split backward,
shape, ranks), the stage layout before the first iteration, MicroBatch's loaded tensors, the loss
contract's check, the cost model read from a module, the names (layers, has_targets) and the
runners' refusal to reduce stale gradients."""
import copy
import re
import warnings

import pytest
import torch
from torch import nn

import packpipe
import packpipe.torch as pt
from packpipe.torch import models

import support
from test_own_model import OwnLM, loss_fn

torch.set_num_threads(1)
GPT = models.GPTConfig(vocab_size=96, hidden=16, layers=4, heads=2, dtype=torch.float64, seed=3)


def loader(tmp_path, **kw):
    args = dict(cost_model=support.cost_model(GPT, tmp_path), shape=packpipe.PipelineShape(stages=2),
                global_batch_tokens=500, seed=3, dtype=torch.float64, iterations=3, calibrate=False)
    args.update(kw)
    return pt.PlanLoader(support.short_manifest(tmp_path), **args)


def plans(ld):
    return [it.plan for it in ld]


# ---- epochs ---------------------------------------------------------------------------------------

def test_epochs_follow_distributed_sampler(tmp_path):
    ld = loader(tmp_path)
    assert len(ld) == 3
    first = plans(ld)
    assert [p.iteration for p in first] == [0, 1, 2] and len(ld) == 3
    with pytest.raises(RuntimeError, match=r"the pass over epoch 0 has ended; call loader.set_epoch\(1\)"):
        iter(ld)
    ld.set_epoch(1)
    second = plans(ld)
    assert len(second) == 3 and second != first  # another epoch: other batches
    assert plans(loader(tmp_path, epoch=1)) == second
    ld.set_epoch(1)  # after its pass ended: the same epoch again
    assert plans(ld) == second
    # the whole epoch (iterations=0): len is the epoch's iteration count, constant during the pass
    whole = loader(tmp_path, iterations=0)
    n = len(whole)
    assert n == packpipe.plan_epoch(whole.cost_model, whole.dataset, shape=packpipe.PipelineShape(stages=2),
                                    global_batch_tokens=500, seed=3, dtype="fp64").epoch_iterations
    next(iter(whole))
    assert len(whole) == n


def test_state_carries_the_epoch_and_resumes_where_it_stopped(tmp_path):
    ld = loader(tmp_path, iterations=4)
    for _ in ld:
        pass
    ld.set_epoch(1)
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    assert (state["epoch"], state["next_iteration"]) == (1, 1)
    rest = plans(ld)
    resumed = loader(tmp_path, iterations=4)  # made for epoch 0
    resumed.load_state_dict(state)
    assert resumed.epoch == 1 and len(resumed) == 4
    resumed.set_epoch(1)  # the DistributedSampler idiom at the top of the epoch keeps the resume point
    assert plans(resumed) == rest
    # a state saved at the end of a pass resumes there: the next pass needs set_epoch
    done = loader(tmp_path, iterations=4)
    done.load_state_dict(resumed.state_dict())
    with pytest.raises(RuntimeError, match=r"set_epoch\(2\)"):
        iter(done)
    with pytest.raises(ValueError, match="other settings"):
        loader(tmp_path, iterations=4, seed=9).load_state_dict(state)
    # a next iteration past the end of the pass (no state_dict() says that) is refused, and the loader keeps its
    # place (it was taken, and the first iteration then said the pass had ended)
    whole = loader(tmp_path, iterations=0)
    past = dict(whole.state_dict(), epoch=1, next_iteration=10 ** 6)
    with pytest.raises(ValueError, match=r"next_iteration'\] 1000000 is past the end of epoch 1's pass"):
        whole.load_state_dict(past)
    assert whole.state_dict()["epoch"] == 0 and whole.state_dict()["next_iteration"] == 0
    assert next(iter(whole)).iteration == 0


# ---- defaults and the stage layout ---------------------------------------------------------------

def test_defaults_suit_the_torch_adapter(tmp_path):
    cm = support.cost_model(GPT, tmp_path)
    manifest = support.short_manifest(tmp_path)
    with pytest.raises(ValueError, match="PlanLoader: dtype is required.*next\\(model.parameters\\(\\)\\).dtype"):
        pt.PlanLoader(manifest, cost_model=cm, global_batch_tokens=500)
    with pytest.raises(ValueError, match="dtype must be a torch dtype or one of fp16, bf16, fp32, fp64, found 'half'"):
        pt.PlanLoader(manifest, cost_model=cm, global_batch_tokens=500, dtype="half")
    own = pt.cost_model(OwnLM(), support.CPU_DEVICE)
    ld = pt.PlanLoader(manifest, cost_model=own, global_batch_tokens=500, iterations=1, calibrate=False)
    # one stage, one replica (this process); every rank's loads; the model's dtype
    assert (ld.rank, ld.replica, ld.dtype, ld.stages[0]["layers"]) == (None, 0, torch.float64, (0, 4))
    it = next(iter(ld))
    assert it.plan.dtype == "fp64" and it.plan.vstages == 1
    # the search never picks a split backward unless asked for by name
    split = loader(tmp_path, shape=packpipe.PipelineShape(stages=4), schedule="search", iterations=2)
    assert all(ins.op not in ("BWD_I", "BWD_W") for p in plans(split) for s in p.streams for ins in s)
    zb = plans(loader(tmp_path, shape=packpipe.PipelineShape(stages=4), schedule="zero-bubble", iterations=1))
    assert zb[0].schedule == "zero-bubble"
    # the runners take the dtype from the stage modules
    assert pt.LocalPipeline({0: nn.Linear(2, 2).double()}, loss_fn).dtype == torch.float64
    with pytest.raises(ValueError, match="several dtypes .* give dtype="):
        pt.LocalPipeline({0: nn.Linear(2, 2), 1: nn.Linear(2, 2).double()}, loss_fn)


def test_the_stage_layout_before_the_first_iteration(tmp_path):
    ld = loader(tmp_path, shape=packpipe.PipelineShape(stages=2, chunks=2), schedule="interleaved-1f1b",
                schedule_fallback=True, rank=1)
    stages = ld.stages  # before any iteration
    assert [s["layers"] for s in stages] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert all(s["layers"] == s["encoder_layers"] for s in stages)
    assert ld.stage_rank == [0, 1, 0, 1] and ld.my_stages == [1, 3]
    its = list(ld)
    assert [it.iteration for it in its] == [0, 1, 2]  # peeking delivered nothing twice
    assert all(it.plan.stages == stages for it in its)


def test_names(tmp_path):
    demo = packpipe.MultiTaskDataset(str(support.DEMO / "manifest.json"))
    assert [demo.has_targets(t) for t in range(demo.num_tasks)] == [True] * 5 + [False]
    assert [demo.encoder_decoder(t) for t in range(demo.num_tasks)] == [True] * 5 + [False]
    t5 = models.T5Config(vocab_size=96, hidden=16, encoder_layers=2, decoder_layers=2, heads=2, dtype=torch.float64)
    ld = pt.PlanLoader(support.short_manifest(tmp_path), cost_model=support.cost_model(t5, tmp_path),
                       shape=packpipe.PipelineShape(stages=4), global_batch_tokens=500, iterations=1, calibrate=False,
                       dtype="fp64")
    assert [s["layers"] for s in ld.stages] == [(0, 1), (1, 2), (2, 3), (3, 4)]  # encoder layers, then decoder
    assert [s["decoder_layers"] for s in ld.stages] == [(0, 0), (0, 0), (0, 1), (1, 2)]


# ---- micro-batches --------------------------------------------------------------------------------

def test_microbatch_without_a_stage_loads_or_raises(tmp_path):
    it = next(iter(loader(tmp_path, rank=None)))
    batch = it.microbatch(0)
    assert set(batch.loaded) == {"input_ids", "position_ids", "labels"}
    assert batch.input_ids.shape == batch.labels.shape == (batch.rows, batch.seq)
    assert int(sum(batch.lengths)) == int(it.plan.microbatches[0]["tokens"]) and len(batch.target_lengths) == 0
    middle = it.microbatch(0, stage=1, loaded={})
    with pytest.raises(AttributeError, match="micro-batch 0 on stage 1: input_ids is loaded on stage 0, not here"):
        middle.input_ids
    assert getattr(middle, "labels", None) is None
    with pytest.raises(AttributeError, match="a decoder-only plan loads no decoder_input_ids"):
        batch.decoder_input_ids
    last = next(iter(loader(tmp_path, rank=1)))
    with pytest.raises(AttributeError, match="micro-batch 0: input_ids is loaded on stage 0, not here .*holds no loaded"):
        next(iter(loader(tmp_path, rank=1, shape=packpipe.PipelineShape(stages=4)))).microbatch(0).input_ids
    assert set(last.microbatch(0).loaded) == {"labels"}
    with pytest.raises(ValueError, match="GradientAccumulation runs one-stage plans; this plan has 2 virtual stages"):
        pt.GradientAccumulation(nn.Linear(2, 2), loss_fn).run(it)


# ---- the loss contract ---------------------------------------------------------------------------

def mean_loss(logits, batch):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             torch.remainder(batch.labels, 64).where(batch.labels >= 0, batch.labels)
                                             .reshape(-1), ignore_index=-100)


def test_a_mean_reducing_loss_is_refused(tmp_path):
    model = OwnLM()
    cm = pt.cost_model(model, support.CPU_DEVICE)
    manifest = support.short_manifest(tmp_path)
    ld = pt.PlanLoader(manifest, cost_model=cm, global_batch_tokens=500, iterations=1, calibrate=False)
    it = next(iter(ld))
    message = ("GradientAccumulation: loss_fn must return the micro-batch's summed token loss .* it behaves as a mean "
               "over the tokens .* use packpipe.torch.summed_token_loss")
    with pytest.raises(ValueError, match=message):
        pt.GradientAccumulation(model, mean_loss).run(it)
    pt.GradientAccumulation(model, mean_loss, check_loss=False).run(it)  # the trainer's responsibility then
    pt.GradientAccumulation(model, loss_fn).run(it)
    two = pt.PlanLoader(manifest, cost_model=cm, global_batch_tokens=500, iterations=1, calibrate=False,
                        shape=packpipe.PipelineShape(stages=2))
    stages = {v: model.stage(two.stages[v]) for v in two.my_stages}
    with pytest.raises(Exception, match="LocalPipeline: stage 1: loss_fn must return the micro-batch's summed"):
        pt.LocalPipeline(stages, mean_loss).run(next(iter(two)))


def test_the_summed_token_loss_is_the_reference_loss():
    logits = torch.randn(2, 5, 7, dtype=torch.float64)
    labels = torch.tensor([[1, 2, -100, 3, 4], [0, -100, -100, 6, 5]])

    class B:
        loaded = {"labels": labels}
    B.labels = labels
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, 7), labels.reshape(-1), reduction="sum")
    assert torch.equal(pt.summed_token_loss(logits, B()), want)
    B.labels_shifted = False  # Hugging Face's convention: logits at t predict labels at t + 1
    shifted = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 7), labels[:, 1:].reshape(-1),
                                                reduction="sum")
    assert torch.equal(pt.summed_token_loss(logits, B()), shifted)


# ---- the cost model of a module ------------------------------------------------------------------

class Bare(nn.Module):
    def __init__(self, attention_attr=True, ffn=True):
        super().__init__()
        self.emb = nn.Embedding(100, 8)
        self.blocks = nn.ModuleList(Blk(attention_attr, ffn) for _ in range(3))


class Blk(nn.Module):
    def __init__(self, attention_attr, ffn):
        super().__init__()
        if attention_attr:
            self.attn = nn.MultiheadAttention(8, 2)
        self.fc1 = nn.Linear(8, 24 if ffn else 8)
        self.fc2 = nn.Linear(24 if ffn else 8, 8)


def test_describe_model_reads_a_module_or_names_the_argument():
    spec = pt.describe_model(Bare())
    assert (spec["num_layers"], spec["hidden"], spec["heads"], spec["ffn_hidden"], spec["vocab"],
            spec["gated_mlp"], spec["bytes_per_param"]) == (3, 8, 2, 24, 100, False, 4)
    with pytest.raises(pt.ModelDescriptionError, match="cannot tell the number of attention heads of Bare.*pass heads="):
        pt.describe_model(Bare(attention_attr=False))
    assert pt.describe_model(Bare(attention_attr=False), heads=4)["heads"] == 4
    with pytest.raises(ValueError, match="cannot tell the FFN width of Bare .*pass ffn="):
        pt.describe_model(Bare(ffn=False))
    with pytest.raises(ValueError, match="cannot tell the transformer layers of Linear .*pass layers="):
        pt.describe_model(nn.Linear(4, 4), hidden=4, vocab=10, heads=1, ffn=16)
    two = nn.Module()
    two.a = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
    two.b = nn.ModuleList(nn.Sequential(nn.Linear(8, 8)) for _ in range(4))
    with pytest.raises(ValueError, match="several stacks of layers: 'a' .* and 'b'.*pass layers="):
        pt.describe_model(two, hidden=8, vocab=10, heads=1, ffn=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pt.cost_model(Bare(), support.CPU_DEVICE)  # described right: no warning
        pt.cost_model(OwnLM(), support.CPU_DEVICE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm = pt.cost_model(Bare(), support.CPU_DEVICE, layers=300)
    assert cm.model["num_layers"] == 300
    assert any(re.search("token embedding of Bare have [0-9,]+ parameters, the model file", str(w.message))
               for w in caught)


# ---- reductions never count a gradient twice -----------------------------------------------------

def test_stale_gradients_are_not_reduced_again(tmp_path):
    model = OwnLM()
    cm = pt.cost_model(model, support.CPU_DEVICE)
    ld = pt.PlanLoader(support.short_manifest(tmp_path), cost_model=cm, global_batch_tokens=500, iterations=2,
                       calibrate=False, shape=packpipe.PipelineShape(stages=2), tied_embedding=True)
    stages = {v: copy.deepcopy(model).stage(ld.stages[v]) for v in ld.my_stages}  # copies: a tie the plan reduces
    runner = pt.LocalPipeline(stages, loss_fn)
    first, second = ld
    runner.run(first)
    with pytest.raises(Exception, match="still holds a gradient from an earlier run; with optimizer=None"):
        runner.run(second)
    for m in stages.values():
        m.zero_grad()
    runner.run(second)
    shared = {v: model.stage(ld.stages[v]) for v in ld.my_stages}
    with pytest.raises(ValueError, match="is shared by the modules of pipeline ranks 0, 1; a per-rank optimizer"):
        ld2 = pt.PlanLoader(support.short_manifest(tmp_path), cost_model=cm, global_batch_tokens=500, iterations=1,
                            calibrate=False, shape=packpipe.PipelineShape(stages=2))  # not tied: nothing meets
        pt.LocalPipeline(shared, loss_fn, lambda ps: torch.optim.SGD(ps, lr=0.1)).run(next(iter(ld2)))


def test_new_arguments_are_checked_where_they_enter(tmp_path):
    cm = support.cost_model(GPT, tmp_path)
    manifest = support.short_manifest(tmp_path)
    for make, exc, message in [
        (lambda: pt.describe_model(Bare(), heads="4"), TypeError, "describe_model: heads must be an integer"),
        (lambda: pt.describe_model(Bare(), layers=2.0), TypeError, "describe_model: layers must be an integer"),
        (lambda: pt.describe_model(Bare(), arch="gpt"), ValueError, "arch must be one of decoder_only, encoder_dec"),
        (lambda: pt.describe_model("model"), TypeError, "describe_model: model must be a torch.nn.Module"),
        (lambda: pt.cost_model(Bare(), 5), TypeError, "device must be a preset name, a device .json file or a dict"),
        (lambda: pt.GradientAccumulation("m", loss_fn), TypeError, "GradientAccumulation: model must be a torch.nn"),
        (lambda: pt.GradientAccumulation(nn.Linear(2, 2), None), TypeError, "loss_fn must be callable"),
        (lambda: pt.GradientAccumulation(nn.Linear(2, 2), loss_fn, "sgd"), TypeError, "optimizer must be None or"),
        (lambda: pt.GradientAccumulation(nn.Linear(2, 2), loss_fn, check_loss=1), TypeError, "check_loss must be"),
        (lambda: pt.PlanLoader(manifest, cost_model=cm, dtype="fp32", global_batch_tokens=500, labels="hf"),
         ValueError, "PlanLoader: labels must be one of shifted, unshifted"),
        (lambda: pt.PlanLoader(manifest, cost_model=cm, dtype="fp32", global_batch_tokens=500, split_backward="no"),
         TypeError, "PlanLoader: split_backward must be True or False"),
        (lambda: pt.PlanLoader(manifest, cost_model=cm, dtype="fp32", global_batch_tokens=500, rank="last"),
         TypeError, "PlanLoader: rank must be an integer"),
        (lambda: loader(tmp_path).set_epoch(-1), ValueError, r"PlanLoader.set_epoch: epoch must be in \[0"),
    ]:
        with pytest.raises(exc, match=message):
            make()


@pytest.mark.parametrize("cls, field, value, message", [
    (models.GPTConfig, "layers", 0, r"GPTConfig: layers must be .*found 0"),
    (models.GPTConfig, "hidden", 2.5, r"GPTConfig: hidden"),
    (models.GPTConfig, "heads", 3, r"GPTConfig: heads must divide hidden, found hidden 64 and heads 3"),
    (models.GPTConfig, "vocab_size", True, r"GPTConfig: vocab_size"),
    (models.GPTConfig, "ffn", -1, r"GPTConfig: ffn"),
    (models.GPTConfig, "dtype", torch.int64, r"GPTConfig: dtype must be a torch floating dtype"),
    (models.T5Config, "decoder_layers", 0, r"T5Config: decoder_layers"),
    (models.T5Config, "max_positions", -5, r"T5Config: max_positions"),
])
def test_model_configs_check_their_fields_where_they_enter(cls, field, value, message):
    with pytest.raises((TypeError, ValueError), match=message):
        cls(**{field: value})


def test_another_ignore_index_reaches_packpipes_losses(tmp_path):
    """PlanLoader(ignore_index=-1): MicroBatch.ignore_index carries it, and summed_token_loss, the loss check,
    gpt_loss and loss_mask honour it (summed_token_loss crashed on label -1; gpt_loss folded it into the vocabulary
    and trained on the ignored positions: 6.73 against 6.40), so the loss and gradients equal -100's."""
    results = {}
    for ignore in (-100, -1):
        it = next(iter(loader(tmp_path, shape=packpipe.PipelineShape(stages=1), iterations=1, ignore_index=ignore)))
        b = it.microbatch(0)
        assert b.ignore_index == ignore and bool(((b.labels == ignore) == (b.loss_mask == 0)).all())
        def summed_token_loss(out, batch):  # the dataset's ids folded into the small vocabulary, as gpt_loss does
            keep = batch.labels == batch.ignore_index
            return pt.summed_token_loss(out, batch, labels=torch.where(keep, batch.labels, batch.labels % 96))

        for loss in (summed_token_loss, models.gpt_loss):
            model = models.GPT(GPT).stage(it.plan.stages[0])
            r = pt.GradientAccumulation(model, loss).run(it)
            results[(ignore, loss.__name__)] = (r.loss, [p.grad.clone() for p in model.parameters()])
    for name in ("summed_token_loss", "gpt_loss"):
        (a, ga), (b, gb) = results[(-100, name)], results[(-1, name)]
        assert a == pytest.approx(b, rel=1e-12)
        assert all(torch.allclose(x, y, rtol=1e-10, atol=1e-14) for x, y in zip(ga, gb))

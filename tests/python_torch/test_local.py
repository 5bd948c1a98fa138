"""Single-process pipelines (LocalPipeline: every stage on threads of this process, the runtime's
in-process transport): gradients and parameters equal the whole model run on each sample alone,
for GPT and T5, every schedule kind, packed and padded rows, both loss modes, recompute, a tied
embedding. fp64, so the only difference is rounding."""
import copy

import pytest
import torch

import packpipe
import packpipe.torch as pt
from packpipe.torch import models

import support

torch.set_num_threads(1)


def make_loader(tmp_path, cfg, *, pp, chunks=1, schedule="1f1b", method="dp", mbs=0, loss="all", tokens=600,
                iterations=1, tied=False, dtype="fp64", recompute="none", seed=7, rank=None):
    cm = support.cost_model(cfg, tmp_path)
    manifest = support.short_manifest(tmp_path)
    shape = packpipe.PipelineShape(stages=pp, chunks=chunks)
    options = packpipe.PartitionOptions(method=method, mbs=mbs, recompute=recompute)
    return pt.PlanLoader(manifest, cost_model=cm, rank=rank, iterations=iterations, shape=shape, options=options,
                         global_batch_tokens=tokens, seed=seed, schedule=schedule, loss=loss, dtype=dtype,
                         tied_embedding=tied, schedule_fallback=True), packpipe.MultiTaskDataset(manifest)


def train_and_compare(loader, dataset, full, loss_fn, encdec, loss, lr=0.05, tie=False):
    """Runs the loader's iterations on a LocalPipeline of `full`'s stages (one SGD per pipeline rank,
    stepped by OPT_STEP) and the same SGD steps on `full` over each sample alone. Returns the
    relative error of the first iteration's gradients, of the parameters at the end, and the
    schedules the plans used."""
    ref = full
    pipe_model = copy.deepcopy(full)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr)
    sink, stages, pipe, first_grad, seen = {}, None, None, None, []
    for it in loader:
        plan = it.plan
        seen.append(plan.schedule)
        if pipe is None:
            stages = {}
            for v in range(plan.vstages):  # tie: the last stage shares the first's tied weight
                stages[v] = pipe_model.stage(plan.stages[v], **({"tie": stages.get(0)} if tie else {}))
            pipe = pt.LocalPipeline(stages, loss_fn, lambda ps: support.RecordingSGD(ps, lr, sink), dtype=torch.float64,
                                    timeout_s=60)
        ref_opt.zero_grad()
        l_ref = support.reference_loss(ref, dataset, support.batch_samples([plan]), encdec, loss,
                                       plan.global_loss_tokens)
        l_ref.backward()
        result = pipe.run(it)
        assert abs(result.loss - float(l_ref)) <= 1e-9 * max(1.0, abs(float(l_ref))), (result.loss, float(l_ref))
        pairs = [pr for m in stages.values() for pr in support.param_pairs(m, ref)]
        assert len(sink) == len({id(a) for a, _ in pairs})
        if first_grad is None:
            first_grad = support.grad_error(pairs, sink)
        ref_opt.step()
    pairs = [pr for m in stages.values() for pr in support.param_pairs(m, ref)]
    return first_grad, support.relative_error(pairs, "data"), seen


GPT = models.GPTConfig(vocab_size=96, hidden=16, layers=4, heads=2, dtype=torch.float64, seed=3)
T5C = models.T5Config(vocab_size=96, hidden=16, encoder_layers=2, decoder_layers=2, heads=2, dtype=torch.float64,
                      seed=5)


@pytest.mark.parametrize("pp,chunks,schedule,method,loss", [
    (2, 1, "1f1b", "dp", "all"),
    (4, 1, "gpipe", "dp", "targets"),
    (2, 2, "interleaved-1f1b", "fixed", "all"),
    (4, 1, "zero-bubble", "packing", "all"),
    (4, 1, "cyclic", "dp", "targets"),
    (1, 1, "1f1b", "packing", "all"),
])
def test_gpt_pipeline_equals_the_whole_model(tmp_path, pp, chunks, schedule, method, loss):
    loader, data = make_loader(tmp_path, GPT, pp=pp, chunks=chunks, schedule=schedule, method=method,
                               mbs=4 if method != "dp" else 0, loss=loss, iterations=3)
    g, p, seen = train_and_compare(loader, data, models.GPT(GPT), models.gpt_loss, False, loss)
    assert seen[0] == schedule
    assert g <= 1e-10 and p <= 1e-10, (g, p)


def test_tied_embedding_and_recompute(tmp_path):
    cfg = models.GPTConfig(vocab_size=96, hidden=16, layers=4, heads=2, dtype=torch.float64, seed=3,
                           tied_embedding=True)
    loader, data = make_loader(tmp_path, cfg, pp=4, schedule="1f1b", tied=True, recompute="full", iterations=2)
    g, p, _ = train_and_compare(loader, data, models.GPT(cfg), models.gpt_loss, False, "all")
    assert g <= 1e-10 and p <= 1e-10, (g, p)


@pytest.mark.parametrize("pp", [1, 2])
def test_tied_embedding_with_both_ends_on_one_rank(tmp_path, pp):
    """Interleaved stages on one rank put the first and the last stage together: the plan has no REDUCE_TIED, so
    their modules must share one tied weight. Two copies (each got part of the gradient: off by 59% and 79%) are
    refused, naming the stages; GPT.stage(spec, tie=) shares it and the gradients are the whole model's. With the
    ends on two ranks, a shared weight is right too (REDUCE_TIED adds nothing in one process)."""
    cfg = models.GPTConfig(vocab_size=96, hidden=16, layers=4, heads=2, dtype=torch.float64, seed=3,
                           tied_embedding=True)
    loader, data = make_loader(tmp_path, cfg, pp=pp, chunks=2, schedule="search", tied=True, iterations=2)
    g, p, _ = train_and_compare(loader, data, models.GPT(cfg), models.gpt_loss, False, "all", tie=True)
    assert g <= 1e-10 and p <= 1e-10, (g, p)
    if pp == 1:
        loader, data = make_loader(tmp_path, cfg, pp=pp, chunks=2, schedule="search", tied=True)
        with pytest.raises(Exception, match="virtual stages 0 and 1 are both on pipeline rank 0, so the plan has no "
                                            "REDUCE_TIED"):
            train_and_compare(loader, data, models.GPT(cfg), models.gpt_loss, False, "all")
    with pytest.raises(TypeError, match="tie must be a GPTStage"):
        models.GPT(cfg).stage(loader.stages[0], tie="stage 0")


@pytest.mark.parametrize("pp,schedule,method", [(2, "1f1b", "dp"), (4, "1f1b", "packing"), (4, "zero-bubble", "dp")])
def test_t5_pipeline_equals_the_whole_model(tmp_path, pp, schedule, method):
    loader, data = make_loader(tmp_path, T5C, pp=pp, schedule=schedule, method=method,
                               mbs=4 if method != "dp" else 0, loss="targets", iterations=2)
    g, p, _ = train_and_compare(loader, data, models.T5(T5C), models.t5_loss, True, "targets")
    assert g <= 1e-10 and p <= 1e-10, (g, p)


def test_bad_runner_arguments_are_refused_naming_them():
    stage = {0: torch.nn.Linear(2, 2)}
    loss = models.gpt_loss
    for make, exc, message in [
        (lambda: pt.LocalPipeline({}, loss), TypeError, "LocalPipeline: stages must be a non-empty dict"),
        (lambda: pt.LocalPipeline([torch.nn.Linear(2, 2)], loss), TypeError, "stages must be a non-empty dict"),
        (lambda: pt.LocalPipeline({-1: torch.nn.Linear(2, 2)}, loss), ValueError, "a key of stages .* found -1"),
        (lambda: pt.LocalPipeline({0: "module"}, loss), TypeError, r"stages\[0\] must be a torch.nn.Module"),
        (lambda: pt.LocalPipeline(stage, None), TypeError, "LocalPipeline: loss_fn must be callable"),
        (lambda: pt.LocalPipeline(stage, loss, 5), TypeError, "LocalPipeline: optimizer must be None, a torch.optim"),
        (lambda: pt.LocalPipeline(stage, loss, timeout_s=-1), ValueError, "LocalPipeline: timeout_s must be a finite"),
        (lambda: pt.LocalPipeline(stage, loss, timeout_s=float("nan")), ValueError, "timeout_s must be a finite"),
        (lambda: pt.LocalPipeline(stage, loss, dtype="fp32"), ValueError, "LocalPipeline: dtype must be one of"),
        (lambda: pt.LocalPipeline(stage, loss, device="gpu9"), ValueError, "LocalPipeline: device 'gpu9' is not"),
        (lambda: pt.LocalPipeline(stage, loss, synchronize=1), TypeError, "synchronize must be True or False"),
        (lambda: pt.PipelineRunner(stage, loss, None, pp=0, dp=1), ValueError, r"PipelineRunner: pp must be in \[1"),
        (lambda: pt.PipelineRunner(stage, loss, None, pp=2, dp=2.0), TypeError, "PipelineRunner: dp must be an integer"),
        (lambda: pt.PipelineRunner(stage, loss, None, groups="g"), TypeError, "PipelineRunner: groups must be a "
                                                                               "ProcessGroups"),
        (lambda: pt.PipelineRunner(stage, loss, None, pp=1, dp=1, timeout_s=1e300), ValueError, "timeout_s must be"),
        (lambda: pt.PipelineRunner(stage, loss, "sgd", pp=1, dp=1), TypeError, "PipelineRunner: optimizer must be"),
        (lambda: pt.PipelineRunner(stage, loss, None, pp=1, dp=1, measure_pipeline="yes"), TypeError,
         "measure_pipeline must be True or False"),
    ]:
        with pytest.raises(exc, match=message):
            make()

"""Functions the multi-process tests run on spawned gloo ranks (importable by the children)."""
import copy
import os
import signal
import tempfile
import time

import torch

import packpipe
import packpipe.torch as pt
from packpipe import runtime as rt
from packpipe.torch import models

import support


def _model(case):
    dtype = torch.float64 if case.get("dtype", "fp64") == "fp64" else torch.float32
    if case["model"] == "gpt":
        cfg = models.GPTConfig(vocab_size=96, hidden=16, layers=case.get("layers", 4), heads=2, dtype=dtype, seed=3,
                               tied_embedding=case.get("tied", False))
        return cfg, models.GPT(cfg), models.gpt_loss, False
    cfg = models.T5Config(vocab_size=96, hidden=16, encoder_layers=2, decoder_layers=2, heads=2, dtype=dtype, seed=5)
    return cfg, models.T5(cfg), models.t5_loss, True


def _manifest(case, tmp):
    """The short paired tasks, or ("manifest": "long") manual-page text beside definitions."""
    return support.long_manifest(tmp) if case.get("manifest") == "long" else support.short_manifest(tmp)


def _options(case):
    return packpipe.PartitionOptions(method=case.get("method", "dp"), mbs=case.get("mbs", 0),
                                     capacity=case.get("capacity", 0))


def _loader(case, cfg, tmp, groups, rank=None, replica=None):
    cm = support.cost_model(cfg, tmp)
    manifest = _manifest(case, tmp)
    shape = _shape(case)
    options = _options(case)
    return pt.PlanLoader(manifest, cost_model=cm, replica=groups.replica if replica is None else replica,
                         rank=groups.pipeline_rank if rank is None else rank, iterations=case.get("iterations", 1),
                         shape=shape, options=options, **_batch_size(case), seed=11,
                         schedule=case["schedule"], schedule_fallback=True, loss=case.get("loss", "all"),
                         dtype=case.get("dtype", "fp64"), tied_embedding=case.get("tied", False))


def equivalence_case(case):
    """One configuration on this rank: the pipeline's gradients after the first iteration and its
    parameters after the last, against the whole model run on every sample alone (this rank's
    parameters only). Returns the relative errors and what ran."""
    import torch.distributed as dist
    tmp = tempfile.mkdtemp(prefix="pp-case-")
    groups = pt.ProcessGroups.create(case["pp"], case["dp"])
    cfg, full, loss_fn, encdec = _model(case)
    pipe_model = copy.deepcopy(full)
    loader = _loader(case, cfg, tmp, groups)
    # Every replica's plans, for the reference (the whole global batch).
    args, kwargs = _epoch_args(case, cfg, tmp)
    epoch = iter(packpipe.plan_epoch(*args, **kwargs))
    lr = 0.05
    ref_opt = torch.optim.SGD(full.parameters(), lr=lr)
    sink, runner, stages, first_grad, schedules, losses = {}, None, None, None, [], []
    sliced = False
    for it in loader:
        sliced = sliced or any(len(mb["prev"]) for mb in it.plan.microbatches)
        planned = next(epoch)
        assert planned.iteration == it.iteration
        plan = it.plan
        assert plan == planned.result.plans[groups.replica]
        schedules.append(plan.schedule)
        if runner is None:
            mine = pt.PipelineRunner.my_stages(plan, groups.pipeline_rank)
            stages = {v: pipe_model.stage(plan.stages[v]) for v in mine}
            params = [p for m in stages.values() for p in m.parameters()]
            runner = pt.PipelineRunner(stages, loss_fn, support.RecordingSGD(params, lr, sink), groups=groups,
                                       dtype=cfg.dtype, timeout_s=60)
        ref_opt.zero_grad()
        l_ref = support.reference_loss(full, loader.dataset, support.batch_samples(planned.result.plans), encdec,
                                       case.get("loss", "all"), plan.global_loss_tokens)
        l_ref.backward()
        result = runner.run(it)
        loss = runner.global_loss(result)
        if loss is not None:
            losses.append((loss, float(l_ref)))
        pairs = [pr for m in stages.values() for pr in support.param_pairs(m, full)]
        if first_grad is None:
            first_grad = support.grad_error(pairs, sink)
        ref_opt.step()
    pairs = [pr for m in stages.values() for pr in support.param_pairs(m, full)]
    param_err = support.relative_error(pairs, "data")
    runner.close()
    dist.barrier()
    return {"grad": first_grad, "param": param_err, "schedules": schedules, "losses": losses,
            "microbatches": len(it.plan.microbatches), "rank": groups.world_rank,
            "sliced": sliced}


def _epoch_args(case, cfg, tmp):
    cm = support.cost_model(cfg, tmp)
    data = packpipe.MultiTaskDataset(_manifest(case, tmp))
    shape = _shape(case)
    options = _options(case)
    return (cm, data), dict(shape=shape, options=options, **_batch_size(case), seed=11,
                            schedule=case["schedule"], schedule_fallback=True, loss=case.get("loss", "all"),
                            dtype=case.get("dtype", "fp64"), tied_embedding=case.get("tied", False),
                            iterations=case.get("iterations", 1))


def _shape(case):
    return packpipe.PipelineShape(stages=case["pp"], chunks=case.get("chunks", 1), dp=case["dp"],
                                  stage_layers=case.get("stage_layers", []))


def _batch_size(case):
    if "samples" in case:
        return {"global_batch_samples": case["samples"]}
    return {"global_batch_tokens": case.get("tokens", 700)}


def equivalence(rank, world, config):
    """Every case of `config` in turn on this rank."""
    return [equivalence_case(case) for case in config["cases"]]


def killed_rank(rank, world, config):
    """pp = world, dp = 1; pipeline rank `victim` kills itself (SIGKILL) in its forward of
    micro-batch 1; the others must end with an error naming it."""
    tmp = tempfile.mkdtemp(prefix="pp-kill-")
    case = {"model": "gpt", "pp": world, "dp": 1, "schedule": "1f1b", "tokens": 900, "method": "fixed", "mbs": 2}
    groups = pt.ProcessGroups.create(world, 1)
    cfg, full, loss_fn, _ = _model(case)
    loader = _loader(case, cfg, tmp, groups)
    it = next(iter(loader))
    mine = pt.PipelineRunner.my_stages(it.plan, groups.pipeline_rank)
    stages = {v: full.stage(it.plan.stages[v]) for v in mine}
    if groups.pipeline_rank == config["victim"]:
        for m in stages.values():
            inner = m.forward

            def dying(hidden, batch, inner=inner):
                if batch.index == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                return inner(hidden, batch)
            m.forward = dying
    runner = pt.PipelineRunner(stages, loss_fn, None, groups=groups, dtype=cfg.dtype, timeout_s=config["timeout"])
    t0 = time.monotonic()
    try:
        runner.run(it)
    except rt.PipelineError as e:
        return {"error": str(e), "seconds": time.monotonic() - t0}
    return {"error": None, "seconds": time.monotonic() - t0}


def failing_handler(rank, world, config):
    """A stage module that raises on one rank: every rank ends with an error naming the failure."""
    tmp = tempfile.mkdtemp(prefix="pp-fail-")
    case = {"model": "gpt", "pp": world, "dp": 1, "schedule": "1f1b", "tokens": 900, "method": "fixed", "mbs": 2,
            "layers": 6}
    groups = pt.ProcessGroups.create(world, 1)
    cfg, full, loss_fn, _ = _model(case)
    it = next(iter(_loader(case, cfg, tmp, groups)))
    mine = pt.PipelineRunner.my_stages(it.plan, groups.pipeline_rank)
    stages = {v: full.stage(it.plan.stages[v]) for v in mine}
    if groups.pipeline_rank == config["culprit"]:
        for m in stages.values():
            def boom(hidden, batch):
                raise ArithmeticError("the culprit's stage failed")
            m.forward = boom
    runner = pt.PipelineRunner(stages, loss_fn, None, groups=groups, dtype=cfg.dtype, timeout_s=config["timeout"])
    t0 = time.monotonic()
    try:
        runner.run(it)
        out = {"error": None}
    except rt.PipelineError as e:
        out = {"error": str(e), "cause": repr(e.__cause__)}
    out["seconds"] = time.monotonic() - t0
    return out


def calibration(rank, world, config):
    """A 2-rank pipeline of the small GPT with a Calibrator: the iterations at which the model
    changed, the calibration's text, each plan's fingerprint and whether it was calibrated."""
    tmp = tempfile.mkdtemp(prefix="pp-cal-")
    groups = pt.ProcessGroups.create(world, 1)
    cfg = models.GPTConfig(vocab_size=96, hidden=16, layers=2, heads=2, seed=3)
    cm = support.cost_model(cfg, tmp)
    manifest = support.short_manifest(tmp)
    loader = pt.PlanLoader(manifest, cost_model=cm, replica=0, rank=groups.pipeline_rank,
                           iterations=config["iterations"], shape=packpipe.PipelineShape(stages=world),
                           global_batch_tokens=600, seed=11, schedule="1f1b", schedule_fallback=True, dtype="fp32")
    if config.get("failing_fit") and rank == 0:
        def failing_fit(*args, **kwargs):
            raise ValueError("no fit today")
        packpipe.fit_calibration = failing_fit  # only rank 0 fits: the others must learn of it
    cal = pt.Calibrator(loader, fit_after=config["fit_after"], timeout_s=60)
    model = models.GPT(cfg)
    runner, out = None, {"boundaries": [], "fingerprints": [], "calibrated": [], "calibration": "", "error": None}
    try:
        for it in loader:
            if runner is None:
                mine = pt.PipelineRunner.my_stages(it.plan, groups.pipeline_rank)
                stages = {v: model.stage(it.plan.stages[v]) for v in mine}
                opt = torch.optim.SGD([p for m in stages.values() for p in m.parameters()], lr=1e-3)
                runner = pt.PipelineRunner(stages, models.gpt_loss, opt, groups=groups, timeout_s=60)
            out["calibrated"].append(cal.cost_model is not cal.base)
            out["fingerprints"].append(rt.plan_fingerprint(it.plan))
            r = runner.run(it)
            rep = cal.observe(it, r)
            if rep is not None:
                out["boundaries"].append(rep.iteration)
                out["calibration"] = rep.calibration_json
                out["ops"] = sorted(rep.ops)
                out["measurements"] = rep.measurements
                out["transfers_fitted"] = rep.transfers_fitted
    except RuntimeError as e:
        out["error"] = str(e)
    finally:
        if runner is not None:
            runner.close()
    return out

#!/usr/bin/python3
"""Your own model in a pipeline: the stages of a model of your own, on packpipe's plans.

    python3 examples/train_pipeline.py --pp 2                                          # every stage here
    python3 -m packpipe.torch.run --nproc-per-node 2 examples/train_pipeline.py --pp 2 # a process per stage
    python3 -m packpipe.torch.run --nproc-per-node 4 examples/train_pipeline.py --pp 2 # 2 pipelines x 2 stages
    python3 examples/train_pipeline.py --pp 2 --plan-file plans.ppln                   # plans made offline

Build the model, cut it into the loader's stages, wrap them in a runner, then iterate: the stage
layout is known before the first iteration (PlanLoader.stages). The embedding and the LM head are
tied; in one process the first and the last stage share the Parameter, across processes the plan
(tied_embedding=True) sums the two copies' gradients.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

import packpipe
import packpipe.torch as pt
from packpipe import _check
from packpipe.torch.models import CPU_DEVICE

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from my_model import TinyLM, loss_fn  # noqa: E402  (the model of your own)

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", default=os.path.join(HERE, "..", "data", "demo", "short.json"))
    ap.add_argument("--pp", type=_check.arg_int(1, _check.MAX_PIPELINE), default=2, help="pipeline stages")
    ap.add_argument("--iterations", type=_check.arg_int(0, _check.MAX_COUNT), default=4, help="iterations (0: the whole epoch)")
    ap.add_argument("--global-batch-tokens", type=_check.arg_int(1, _check.MAX_COUNT), default=2048)
    ap.add_argument("--plan-file", default="", help="read the plans from this file (examples/plan_offline.py) "
                                                     "instead of planning on every rank")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    world = dist.get_world_size() if distributed else a.pp  # one process: the whole pipeline
    if world % a.pp:
        sys.exit(f"train_pipeline: {world} ranks do not make pipelines of {a.pp} stages")

    model = TinyLM(layers=4)                          # every rank builds the whole model and keeps its stages
    if a.plan_file:
        loader = pt.PlanLoader(a.manifest, plan_file=a.plan_file, iterations=a.iterations)
    else:
        cost = pt.cost_model(model, CPU_DEVICE)
        loader = pt.PlanLoader(a.manifest, cost_model=cost, global_batch_tokens=a.global_batch_tokens,
                               iterations=a.iterations, tied_embedding=True,
                               shape=packpipe.PipelineShape(stages=a.pp, dp=world // a.pp, memory_mb=8))
    # The stage layout before the first iteration: this rank's virtual stages and their layer ranges.
    stages = {v: model.stage(loader.stages[v]) for v in loader.my_stages}
    if distributed:
        params = list({id(p): p for m in stages.values() for p in m.parameters()}.values())
        runner = pt.PipelineRunner(stages, loss_fn, torch.optim.AdamW(params, lr=3e-3), pp=a.pp, dp=world // a.pp)
    else:
        runner = pt.LocalPipeline(stages, loss_fn, torch.optim.AdamW(model.parameters(), lr=3e-3))
    print(f"rank {dist.get_rank() if distributed else 0}: virtual stages {loader.my_stages}, layers "
          f"{[loader.stages[v]['layers'] for v in loader.my_stages]}", flush=True)

    for it in loader:
        result = runner.run(it)
        loss = runner.global_loss(result) if distributed else result.loss  # the batch's (None without the head)
        if loss is not None and (not distributed or loader.replica == 0):
            print(f"iteration {it.iteration}: loss {loss:.4f}, schedule {it.plan.schedule}, "
                  f"{len(it.plan.microbatches)} micro-batches, {result.measured_ms:.0f} ms (predicted "
                  f"{result.predicted_ms:.0f})", flush=True)
    for report in loader.calibration_reports:  # PlanLoader calibrates by default: how far off the cost model was
        if not distributed or dist.get_rank() == 0:
            print(f"calibration of ops {', '.join(sorted(report.ops))}: {report.summary()}", flush=True)
    if distributed:
        runner.close()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Bring your own model: data parallelism and gradient accumulation over packpipe's micro-batches.

    python3 examples/train_dp.py                                              # one process
    python3 -m packpipe.torch.run --nproc-per-node 2 examples/train_dp.py     # 2 replicas (DDP over gloo)
    torchrun --nproc_per_node 2 examples/train_dp.py                          # the same with torchrun

Each rank plans every global batch (the same plans on every rank), takes its replica's micro-batches
and accumulates gradients over them; DDP reduces the gradients once per iteration (no_sync on every
micro-batch but the last) and the loss is scaled so that DDP's average is packpipe's sum.
GradientAccumulation does all of that; the loop below is the trainer's own.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

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
    ap.add_argument("--epochs", type=_check.arg_int(1, 10 ** 6), default=2)
    ap.add_argument("--iterations", type=_check.arg_int(0, _check.MAX_COUNT), default=3, help="iterations per epoch (0: the whole epoch)")
    ap.add_argument("--global-batch-tokens", type=_check.arg_int(1, _check.MAX_COUNT), default=2048)
    ap.add_argument("--memory-mb", type=_check.arg_float(0, 1e12), default=8,
                    help="memory per device (MB) the plans keep to: tiny here, so that this tiny model's batches take "
                         "several micro-batches; 0: the device's")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if "RANK" in os.environ:  # started by a launcher: one process per replica
        dist.init_process_group("gloo")
    world = dist.get_world_size() if dist.is_initialized() else 1

    model = TinyLM(layers=2)                          # the same weights on every rank (a fixed seed)
    cost = pt.cost_model(model, CPU_DEVICE)           # read from the module: layers, hidden, heads, FFN, dtype
    loader = pt.PlanLoader(a.manifest, cost_model=cost, global_batch_tokens=a.global_batch_tokens,
                           iterations=a.iterations,
                           shape=packpipe.PipelineShape(stages=1, dp=world, memory_mb=a.memory_mb))
    wrapped = DDP(model) if world > 1 else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step = pt.GradientAccumulation(wrapped, loss_fn, optimizer)

    for epoch in range(a.epochs):
        loader.set_epoch(epoch)                       # as DistributedSampler: every epoch, every rank
        for it in loader:
            result = step.run(it)                     # forward + backward of each micro-batch, DDP, optimizer
            loss = torch.tensor([result.loss])        # this replica's share of the batch's loss
            if world > 1:
                dist.all_reduce(loss)                 # the shares add up to the batch's loss
            if not dist.is_initialized() or dist.get_rank() == 0:
                print(f"epoch {epoch} iteration {it.iteration}: loss {float(loss):.4f}, "
                      f"{len(it.plan.microbatches)} micro-batches on this replica, {result.tokens} tokens, "
                      f"{result.measured_ms:.0f} ms (predicted {result.predicted_ms:.0f})", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

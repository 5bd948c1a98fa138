"""Data parallelism and gradient accumulation over packpipe's micro-batches in a trainer's own loop.

With one pipeline stage (``PipelineShape(stages=1, dp=world)``) a plan is a list of micro-batches
per data-parallel replica: each rank accumulates gradients over its replica's micro-batches, and the
replicas' gradients are reduced once per iteration. :class:`GradientAccumulation` does this for a
model of the trainer's, plain or wrapped in ``torch.nn.parallel.DistributedDataParallel``::

    model = DDP(MyModel())                           # or MyModel() in one process (dp = 1)
    step = GradientAccumulation(model, pt.summed_token_loss, optimizer)
    for it in loader:                                # PlanLoader(..., shape=PipelineShape(stages=1, dp=world))
        result = step.run(it)

The loss scale: packpipe weighs every loss token of the global batch alike, so each micro-batch's
summed token loss is divided by the global batch's loss tokens (over every replica) and the
replicas' gradients must be *summed*; DDP averages them, so under DDP the loss is also multiplied
by the number of replicas. DDP's all-reduce runs once per iteration: every micro-batch but the last
runs under ``no_sync()``. The same by hand::

    batches = it.microbatches()
    for i, batch in enumerate(batches):
        with model.no_sync() if i < len(batches) - 1 else contextlib.nullcontext():
            loss = loss_fn(model(None, batch), batch) * dist.get_world_size() / it.global_loss_tokens
            loss.backward()
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Callable, Dict

import numpy as np
import torch

from packpipe import _check
from packpipe.torch.data import Iteration
from packpipe.torch.loss import call_stage, evaluate_loss
from packpipe.torch.runner import StepResult, _observed, _op_times, _replica_tokens, check_step_arguments
from packpipe.torch.slices import SliceKV, plan_has_slices


def _any_replica(flag: bool, group) -> bool:
    """Whether `flag` holds on some rank of `group` (one small all-reduce)."""
    import torch.distributed as dist
    t = torch.tensor([1 if flag else 0], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(t.item())


def _sum_gradients(module: torch.nn.Module, group) -> None:
    """Sums every trainable parameter's gradient over `group` (zeros where a rank has none: a replica
    without a sample, or a parameter its micro-batches did not reach), in one flattened all-reduce."""
    import torch.distributed as dist
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    at = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[at:at + n].view_as(p.grad))
        at += n


@dataclasses.dataclass
class StepRecord:
    """What GradientAccumulation measured of one iteration, in the form of the executor's records
    (packpipe.runtime.RankRecord): each instruction of the replica's one-stage stream, in stream
    order, as (start_ns, end_ns) on the steady clock; instructions that do no work of their own
    (loads, frees, the reduction inside the last backward) take no time."""
    rank: int
    iteration: int
    times: np.ndarray
    start_ns: int
    end_ns: int


def _is_ddp(model) -> bool:
    return isinstance(model, torch.nn.parallel.DistributedDataParallel)


class GradientAccumulation:
    """Runs one-stage plans (``PipelineShape(stages=1, dp=...)``): forward and backward of every
    micro-batch of this rank's replica in turn, gradients accumulated, then the optimizer.

    ``model`` is the whole model, called as every stage module is, ``model(None, batch)`` with a
    :class:`packpipe.torch.MicroBatch` (its attention must keep the micro-batch's samples apart:
    ``packpipe.torch.attention.attention(q, k, v, batch, causal=...)``); it may be a
    ``DistributedDataParallel`` (then every micro-batch but the last runs under ``no_sync()`` and
    the loss is multiplied by the replicas, so that DDP's average is packpipe's sum). A plan with
    dp > 1 needs DDP (whose process group's size is dp and whose rank is the plan's replica).
    ``loss_fn(output, batch)`` returns the micro-batch's summed token loss (checked on the first
    micro-batch that can tell, unless ``check_loss=False``). ``optimizer``: stepped and zeroed
    after each iteration; None leaves the gradients in ``.grad`` (under DDP already reduced) for
    the trainer to step and zero. A micro-batch's recompute mode is honoured as the pipeline
    runners do ('full': the forward without grad, again before the backward). ``run(it)`` returns
    a :class:`StepResult` and hands it to the loader's calibration, as the runners do.
    """

    def __init__(self, model: torch.nn.Module, loss_fn: Callable, optimizer=None, *, device="cpu",
                 check_loss: bool = True):
        where = "GradientAccumulation"
        _check.instance(where, "model", model, torch.nn.Module, "a torch.nn.Module (or a DistributedDataParallel)")
        self.device = check_step_arguments(where, loss_fn, optimizer, device)
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.check_loss = _check.boolean(where, "check_loss", check_loss)

    def _replicas(self, plan) -> int:
        """DDP's replica count, checked against the plan (1 without DDP)."""
        where = "GradientAccumulation"
        if not _is_ddp(self.model):
            if plan.dp > 1:
                raise ValueError(f"{where}: the plan has {plan.dp} data-parallel replicas, but the model is not a "
                                 "DistributedDataParallel: wrap it in DDP so that the replicas' gradients are reduced, "
                                 "or plan with dp=1")
            return 1
        group = self.model.process_group
        size, rank = group.size(), group.rank()
        if size != plan.dp:
            raise ValueError(f"{where}: DDP's process group has {size} ranks, the plan {plan.dp} data-parallel replicas "
                             "(plan with PipelineShape(stages=1, dp=world size))")
        if rank != plan.replica:
            raise ValueError(f"{where}: DDP rank {rank} runs the plan of replica {plan.replica}: each rank must train its "
                             "own replica's micro-batches (PlanLoader(replica='auto'), or replica=the DDP rank)")
        return size

    def _forward(self, batch, mode: str):
        module = self.model.module if _is_ddp(self.model) else self.model
        selective = mode == "selective" and hasattr(module, "set_selective_recompute")
        if selective:
            module.set_selective_recompute(True)
        try:
            out = call_stage(self.model, None, batch, "GradientAccumulation")
        finally:
            if selective:
                module.set_selective_recompute(False)
        loss, self.check_loss = evaluate_loss(self.loss_fn, out, batch, "GradientAccumulation", self.check_loss)
        return loss

    def run(self, iteration: Iteration) -> StepResult:
        """Forward and backward of every micro-batch of the iteration's plan, then the optimizer."""
        plan = iteration.plan
        if plan.vstages != 1:
            raise ValueError(f"GradientAccumulation runs one-stage plans; this plan has {plan.vstages} virtual stages "
                             "(use LocalPipeline or PipelineRunner, or plan with PipelineShape(stages=1))")
        stream = plan.streams[0]
        if any(ins.op in ("BWD_I", "BWD_W") for ins in stream):
            raise ValueError("GradientAccumulation runs one backward per micro-batch; the plan splits them (plan with "
                             "split_backward=False, PlanLoader's default)")
        replicas = self._replicas(plan)
        ddp = _is_ddp(self.model)
        sliced = plan_has_slices(plan)
        # Slices under DDP: a sample's forwards all run before its backwards (reverse order), which
        # DDP's reducer (prepared by each forward for the next backward) cannot follow: every backward
        # runs under no_sync, and the gradients are summed over the replicas by hand at the end.
        manual = ddp and _any_replica(sliced or not plan.microbatches, self.model.process_group)
        scale = (1 if manual else replicas) / plan.global_loss_tokens
        batches = iteration.microbatches(self.device)
        fwd: Dict[int, tuple] = {}
        bwd: Dict[int, tuple] = {}
        loss_sum = None
        clock = time.perf_counter_ns
        store = SliceKV()
        # The one-stage stream's order of forwards and backwards (with slices: a sample's slices go
        # forward in order, then back in reverse; otherwise F0 B0 F1 B1 ...).
        ops = [(ins.op, int(ins.mb)) for ins in stream if ins.op in ("FWD", "BWD")]
        last_bwd = max((i for i, (op, _) in enumerate(ops) if op == "BWD"), default=-1)
        losses: Dict[int, torch.Tensor] = {}
        full_mode: Dict[int, bool] = {}
        module = self.model.module if ddp else self.model
        start = clock()
        synced = ops[last_bwd][1] if last_bwd >= 0 and not manual else -1  # DDP reduces in its backward
        # Gradients left in .grad (optimizer=None, the trainer has not zeroed): DDP adds this run's
        # reduced gradients to them; the sum by hand must too, not reduce the old ones again.
        kept = {}
        if manual:
            for p in module.parameters():
                if p.grad is not None:
                    kept[p] = p.grad
                    p.grad = None
        try:
            for i, (op, m) in enumerate(ops):
                batch = batches[m]
                sync = contextlib.nullcontext() if (not ddp or m == synced) else self.model.no_sync()
                with sync:
                    t0 = clock()
                    if op == "FWD":
                        mode = plan.microbatches[m]["recompute"][0]
                        holds = store.forward(batch, m, 0) is not None
                        full = mode == "full" or (mode == "selective" and (holds or not hasattr(
                            module, "set_selective_recompute")))
                        full_mode[m] = full
                        if full:
                            with torch.no_grad():
                                loss = self._forward(batch, "none")
                        else:
                            loss = self._forward(batch, mode)
                        losses[m] = loss
                        fwd[m] = (t0, clock())
                        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
                    else:
                        loss = losses.pop(m)
                        if full_mode[m]:
                            store.forward(batch, m, 0)
                            loss = self._forward(batch, "none")
                        roots, grads = store.roots(m, 0)
                        torch.autograd.backward([loss * scale] + roots, [None] + grads)
                        store.release(m, 0)
                        bwd[m] = (t0, clock())
            if manual:
                _sum_gradients(module, self.model.process_group)
        finally:
            for p, g in kept.items():
                p.grad = g if p.grad is None else g.add_(p.grad)
        t_step = clock()
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        end = clock()
        times = np.empty((len(stream), 2), dtype=np.int64)
        at = start
        for i, ins in enumerate(stream):
            if ins.op == "FWD":
                times[i] = fwd[ins.mb]
                at = fwd[ins.mb][1]
            elif ins.op == "BWD":
                times[i] = bwd[ins.mb]
                at = bwd[ins.mb][1]
            elif ins.op == "LOAD_MB":
                at = fwd[ins.mb][0]
                times[i] = (at, at)
            elif ins.op == "OPT_STEP":
                times[i] = (t_step, end)
                at = end
            else:
                times[i] = (at, at)
        record = StepRecord(0, iteration.iteration, times, start, end)
        tokens, loss_tokens = _replica_tokens(plan)
        total = float(loss_sum) if loss_sum is not None else 0.0
        result = StepResult(iteration.iteration, total / plan.global_loss_tokens, tokens, loss_tokens,
                            (end - start) / 1e6, (end - start) / 1e6, plan.makespan_ms, [record],
                            _op_times(plan, [record]), None, total, int(plan.global_loss_tokens))
        _observed(iteration, result)
        return result

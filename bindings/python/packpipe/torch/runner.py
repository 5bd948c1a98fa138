"""Running packpipe plans on torch modules: stage handlers for the runtime's executor.

:class:`PipelineRunner` runs one rank of a multi-process job (torchrun or
``python3 -m packpipe.torch.run``): the executor with :class:`TorchStageHandler` over the stage
modules of this rank, and :class:`~packpipe.torch.transport.TorchTransport` (gloo on CPU, NCCL on
GPU). :class:`LocalPipeline` runs every stage of a pipeline in one process (threads on the
runtime's in-process transport), for debugging and for a machine with one GPU.

What the handler does for each instruction:

* ``FWD``: the stage module on the received activation (detached, so each stage's autograd graph
  ends at its boundary) and the loaded tensors; on the last stage the loss function's summed token
  loss divided by the plan's global loss tokens. Recompute 'full' runs the forward without grad and
  again before the backward; 'selective' asks the module (``set_selective_recompute``) and falls
  back to 'full' for modules without it.
* ``BWD``: backward from the received output gradient; ``BWD_I`` / ``BWD_W``: the input gradient,
  then the weight gradients (the handler keeps the output gradient itself: the plan frees the slot
  between them).
* ``REDUCE_GRAD``: SUM all-reduce of the stage's gradients over the data-parallel group (the loss
  is already divided by the global loss tokens). ``REDUCE_TIED``: SUM of the tied weight's gradient
  between the first and the last stage. ``OPT_STEP``: the optimizer step, then zeroed gradients.

Receive buffers are allocated from the plan's shapes; nothing about shapes is exchanged.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist

from packpipe import _check
from packpipe import runtime as rt
from packpipe.torch.data import Iteration, MicroBatch
from packpipe.torch.loss import call_stage, evaluate_loss
from packpipe.torch.slices import SliceKV, plan_has_slices

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}

LossFn = Callable[[torch.Tensor, MicroBatch], torch.Tensor]


def module_dtype(where: str, modules: Sequence[torch.nn.Module]) -> torch.dtype:
    """The one floating-point dtype of the modules' parameters (the activations' dtype between
    stages); ValueError when they have none or several (then the caller must be told the dtype)."""
    dtypes = {p.dtype for m in modules for p in m.parameters() if p.is_floating_point()}
    if len(dtypes) == 1:
        return dtypes.pop()
    if not dtypes:
        raise ValueError(f"{where}: the modules have no floating-point parameter to take the activations' dtype from; "
                         "give dtype=")
    raise ValueError(f"{where}: the modules' parameters have several dtypes ({', '.join(sorted(map(str, dtypes)))}); "
                     "give dtype= (the dtype of the activations between stages)")


def check_step_arguments(where: str, loss_fn, optimizer, device) -> torch.device:
    """The checks every runner makes: a callable loss, None or an optimizer (step(), zero_grad()), a
    device torch knows. Returns the device."""
    if not callable(loss_fn):
        raise TypeError(f"{where}: loss_fn must be callable (output, batch) -> summed token loss, found "
                        f"{type(loss_fn).__name__}")
    if optimizer is not None and not (hasattr(optimizer, "step") and hasattr(optimizer, "zero_grad")):
        raise TypeError(f"{where}: optimizer must be None or an optimizer (step(), zero_grad()), found "
                        f"{type(optimizer).__name__}")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{where}: device {device!r} is not a torch device: {e}") from None


def _check_runner(where: str, stages, loss_fn, device, dtype, timeout_s) -> Tuple[torch.device, torch.dtype, float]:
    """The checks PipelineRunner and LocalPipeline share: stages a non-empty {virtual stage: Module},
    a callable loss, a device torch knows, an activation dtype (None: the modules' parameters'), a
    timeout in [0, 1e9] s (0: none). Returns (device, dtype, timeout_s)."""
    if not isinstance(stages, dict) or not stages:
        raise TypeError(f"{where}: stages must be a non-empty dict {{virtual stage: torch.nn.Module}}, found "
                        f"{type(stages).__name__} {stages!r}"[:200])
    for v, m in stages.items():
        _check.integer(where, "a key of stages (a virtual stage)", v, 0, _check.MAX_PIPELINE - 1)
        _check.instance(where, f"stages[{v}]", m, torch.nn.Module, "a torch.nn.Module")
    device = check_step_arguments(where, loss_fn, None, device)
    if dtype is None:
        dtype = module_dtype(where, list(stages.values()))
    if dtype not in _DTYPES.values():
        raise ValueError(f"{where}: dtype must be one of {', '.join(str(d) for d in _DTYPES.values())}, found "
                         f"{dtype!r}")
    return device, dtype, _check.number(where, "timeout_s", timeout_s, 0, _check.MAX_TIMEOUT_S)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a plan dtype name."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"plan dtype '{name}' is not an activation dtype ({', '.join(_DTYPES)})") from None


@dataclasses.dataclass
class StepResult:
    """What one iteration gave on this rank (or, for LocalPipeline, on the whole pipeline).

    ``loss`` means the same under every runner: this replica's summed token loss divided by the
    global batch's loss tokens (every replica's), i.e. this replica's share of the batch's loss. Over
    the replicas the shares add up to the batch's loss, so with one replica (LocalPipeline always,
    any runner with dp = 1) it is the batch's loss; with dp > 1, PipelineRunner.global_loss(result)
    adds them up. None on a rank that holds no head stage."""
    iteration: int
    loss: Optional[float]          # this replica's share of the batch's loss (see above); None without a head here
    tokens: int                    # real tokens of this replica's micro-batches
    loss_tokens: int               # loss tokens of this replica
    measured_ms: float             # first instruction start to last end over the pipeline's ranks
    rank_ms: float                 # the same on this rank alone (LocalPipeline: equal to measured_ms)
    predicted_ms: float            # the plan's simulated makespan (cost-model time)
    records: List[rt.RankRecord]   # the executor's records (one, or one per rank)
    op_times: List[tuple]          # (rank, op, mb, stage, ms) of every compute instruction, measured
    clock_ns: Optional[int] = None  # add to records' times for the host's steady clock, when every rank of the
                                    # pipeline runs on this host (their times then compare); None otherwise
    loss_sum: Optional[float] = None  # this replica's summed token loss (loss x global loss tokens); None as loss
    global_loss_tokens: int = 0     # the global batch's loss tokens (every replica)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / (self.measured_ms / 1e3) if self.measured_ms > 0 else 0.0


class TorchStageHandler(rt.StageHandler):
    """The executor's stage handler over torch modules (one per pipeline rank)."""

    def __init__(self, stages: Dict[int, torch.nn.Module], loss_fn: LossFn, device, dtype: torch.dtype,
                 optimizer=None, reduce_grad: Optional[Callable[[int, List[torch.Tensor]], None]] = None,
                 reduce_tied: Optional[Callable[[int, torch.Tensor], None]] = None,
                 synchronize: bool = False, check_loss: bool = True, where: str = "packpipe.torch"):
        super().__init__()
        synchronize = _check.boolean("TorchStageHandler", "synchronize", synchronize)
        check_loss = _check.boolean("TorchStageHandler", "check_loss", check_loss)
        self.check_loss = check_loss  # until a micro-batch showed loss_fn returns a sum (loss.check_summed_loss)
        self.where = where
        self.stages = stages
        self.loss_fn = loss_fn
        self.device = torch.device(device)
        self.dtype = dtype
        self.optimizer = optimizer
        self._reduce_grad = reduce_grad
        self._reduce_tied = reduce_tied
        self.synchronize = synchronize and self.device.type == "cuda"
        self.host_buffers = self.device.type == "cpu"
        self.iteration: Optional[Iteration] = None
        self.state: Dict[tuple, dict] = {}
        self.slices = SliceKV()  # keys and values of sliced samples, kept between micro-batches
        self.loss_sum: Optional[torch.Tensor] = None
        self.heads = 0

    # ---- helpers ----
    def _buffer(self, t: torch.Tensor) -> rt.Buffer:
        nbytes = t.numel() * t.element_size()
        if self.host_buffers:
            t = t.contiguous()
            return rt.Buffer(nbytes, t, t.data_ptr(), "host")
        return rt.Buffer(nbytes, t, t.data_ptr(), "opaque", self.device.index if self.device.index is not None else -1)

    def _module(self, ctx) -> torch.nn.Module:
        try:
            return self.stages[ctx.stage]
        except KeyError:
            raise KeyError(f"rank {ctx.rank} has no module for virtual stage {ctx.stage} (it holds "
                           f"{sorted(self.stages)})") from None

    def _batch(self, ctx, loaded) -> MicroBatch:
        return self.iteration.microbatch(ctx.mb, ctx.stage, device=self.device, loaded=loaded or {})

    def _check_out(self, ctx, out: torch.Tensor, what: str):
        shape = ctx.out_shape
        if shape is None:
            return
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"stage {ctx.stage}'s module returned {type(out).__name__}, expected a tensor")
        if tuple(out.shape) != tuple(shape.dims) or out.dtype != self.dtype:
            raise ValueError(f"stage {ctx.stage} {what} of micro-batch {ctx.mb} is {tuple(out.shape)} {out.dtype}; the "
                             f"plan's boundary tensor is {tuple(shape.dims)} {shape.dtype}")

    def _sync(self):
        if self.synchronize:
            torch.cuda.synchronize(self.device)

    # ---- the executor's calls ----
    def begin_iteration(self, plan, rank):
        if torch_dtype(plan.dtype) != self.dtype:
            raise ValueError(f"the plan's activations are {plan.dtype}, the runner's dtype is {self.dtype}: plan with "
                             f"dtype='{_name_of(self.dtype)}' or run with dtype={torch_dtype(plan.dtype)}")
        if plan.global_loss_tokens <= 0:
            raise ValueError(f"iteration {plan.iteration}: the plan counts no loss tokens (a format-1 plan, or a batch "
                             "with none); packpipe.torch needs plan format 2")
        if self.optimizer is None and (self._reduce_grad is not None or plan.tied_embedding):
            self._check_no_stale_gradients(plan)
        self._check_tied_on_one_rank(plan, rank)
        self.state.clear()
        self.slices.clear()
        self._sliced_plan = plan_has_slices(plan)
        self.head_stages = {v for v, spec in enumerate(plan.stages) if spec["head"]}
        self.loss_sum = None
        self.heads = 0
        self.global_loss_tokens = plan.global_loss_tokens

    def _check_tied_on_one_rank(self, plan, rank):
        """A tied embedding whose first and last stages are on one rank has no REDUCE_TIED (the plan
        leaves the sum to autograd): the two stage modules must hold one Parameter. Two copies would
        each get part of the gradient and be stepped apart: refused, naming the stages."""
        last = int(plan.vstages) - 1
        if not plan.tied_embedding or last < 1 or not plan.stage_rank[0] == plan.stage_rank[last] == rank:
            return
        if 0 not in self.stages or last not in self.stages:
            return
        ends = [getattr(self.stages[v], "tied_weight", None) for v in (0, last)]
        if ends[0] is not None and ends[1] is not None and ends[0] is not ends[1]:
            raise ValueError(
                f"{self.where}: iteration {plan.iteration}: virtual stages 0 and {last} are both on pipeline rank "
                f"{rank}, so the plan has no REDUCE_TIED, but their tied_weight are two Parameters: each would get "
                f"part of the tied weight's gradient and be stepped apart. Make them one Parameter (the reference "
                f"GPT: model.stage(spec, tie=stages[0]) for the last stage)")

    def _check_no_stale_gradients(self, plan):
        """With optimizer=None the trainer steps and zeroes; gradients left from an earlier run would be
        reduced over the replicas (or the tied pair) again, so a run must start from zero gradients."""
        for v, m in self.stages.items():
            for name, p in m.named_parameters():
                if p.grad is not None and bool(p.grad.any()):
                    raise ValueError(
                        f"{self.where}: iteration {plan.iteration}: stage {v}'s parameter {name} still holds a gradient "
                        "from an earlier run; with optimizer=None the runner neither steps nor zeroes, and this plan "
                        f"reduces gradients ({'over the replicas' if self._reduce_grad is not None else 'of the tied weight'}"
                        "), which would count the old ones again: step and zero them (optimizer.zero_grad()) before "
                        "run(), or give the runner the optimizer")

    def load(self, ctx):
        tensors = self.iteration.loaded(ctx.mb, ctx.stage)
        moved = {k: v.to(self.device, non_blocking=True) for k, v in tensors.items()}
        return rt.Buffer(ctx.shape.nbytes, moved)

    def _run_forward(self, ctx, module, inp, loaded):
        batch = self._batch(ctx, loaded)
        self.slices.forward(batch, ctx.mb, ctx.stage)  # slices: what the attention calls keep and read
        out = call_stage(module, inp, batch, f"{self.where}: stage {ctx.stage}")
        if ctx.stage in self.head_stages:
            loss, self.check_loss = evaluate_loss(self.loss_fn, out, batch, f"{self.where}: stage {ctx.stage}",
                                                  self.check_loss)
            return out, loss
        return out, None

    def forward(self, ctx, x, loaded):
        module = self._module(ctx)
        inp = None
        if x is not None:
            inp = x.obj.detach().requires_grad_(torch.is_floating_point(x.obj))
        loaded_t = loaded.obj if loaded is not None else None
        key = (ctx.mb, ctx.stage)
        mode = ctx.recompute
        if mode == "selective" and self._holds_slices(ctx.mb):
            # A checkpointed attention core would run the slices' attention calls again in backward,
            # out of their order: a micro-batch with slices recomputes fully instead.
            mode = "full"
        st = {"inp": inp, "loaded": loaded_t, "mode": mode}
        selective = mode == "selective" and hasattr(module, "set_selective_recompute")
        if mode == "none" or selective:
            if selective:
                module.set_selective_recompute(True)
            try:
                out, loss = self._run_forward(ctx, module, inp, loaded_t)
            finally:
                if selective:
                    module.set_selective_recompute(False)
            st["mode"] = "none"
        else:  # full recompute: nothing kept but the input
            with torch.no_grad():
                out, loss = self._run_forward(ctx, module, inp, loaded_t)
        if loss is not None:
            scaled = loss / self.global_loss_tokens
            st["out"] = scaled
            self.loss_sum = loss.detach() if self.loss_sum is None else self.loss_sum + loss.detach()
            self.heads += 1
            self.state[key] = st
            self._sync()
            return None
        st["out"] = out
        self.state[key] = st
        self._check_out(ctx, out, "output")
        self._sync()
        if ctx.instruction.out is None:
            return None
        return self._buffer(out.detach())

    def _outputs(self, ctx):
        st = self.state.get((ctx.mb, ctx.stage))
        if st is None:
            raise RuntimeError(f"backward of micro-batch {ctx.mb} stage {ctx.stage} without its forward")
        if st["mode"] != "none":  # recompute the forward with grad
            module = self._module(ctx)
            inp = st["inp"]
            out, loss = self._run_forward(ctx, module, inp, st["loaded"])
            st["out"] = loss / self.global_loss_tokens if loss is not None else out
            st["mode"] = "none"
        return st

    def _holds_slices(self, mb: int) -> bool:
        lay = self.iteration.layout(mb)
        if lay.encdec or lay.layout != "packed" or not self._sliced_plan:
            return False
        native = lay.native(False)
        return bool(np.any(native["prefix"]) or np.any(native["continues"]))

    def backward(self, ctx, grad):
        st = self._outputs(ctx)
        out, inp = st["out"], st["inp"]
        g = grad.obj if grad is not None else None
        if g is None and out.dim() != 0:
            raise RuntimeError(f"backward of micro-batch {ctx.mb} stage {ctx.stage}: no output gradient for a stage "
                               "without the loss")
        # Slices: the keys and values this micro-batch kept go back too, with the gradients the later
        # slices' backwards (already run: reverse order) gave their leaves.
        roots, root_grads = self.slices.roots(ctx.mb, ctx.stage)
        outs, grads = [out] + roots, [g] + root_grads
        split = ctx.op == "BWD_I"
        if split:
            st["grad"] = g  # kept for BWD_W: the plan frees the gradient's slot in between
            st["roots"] = (roots, root_grads)
            wanted = ([inp] if inp is not None and inp.requires_grad else []) + \
                self.slices.used_leaves(ctx.mb, ctx.stage)
            got = torch.autograd.grad(outs, wanted, grads, retain_graph=True, allow_unused=True) if wanted else ()
            gi = got[0] if inp is not None and inp.requires_grad else None
            for leaf, gl in zip(wanted[1 if gi is not None else 0:], got[1 if gi is not None else 0:]):
                if gl is not None:  # the earlier slices' keys and values receive this slice's gradient
                    leaf.grad = gl if leaf.grad is None else leaf.grad + gl
        else:
            torch.autograd.backward(outs, grads)
            gi = inp.grad if inp is not None else None
            self.state.pop((ctx.mb, ctx.stage), None)
            self.slices.release(ctx.mb, ctx.stage)
        self._sync()
        if ctx.instruction.out is None:
            return None
        if gi is None:
            raise RuntimeError(f"stage {ctx.stage} produced no input gradient for micro-batch {ctx.mb}")
        self._check_out(ctx, gi, "input gradient")
        return self._buffer(gi)

    def backward_weight(self, ctx):
        st = self.state.pop((ctx.mb, ctx.stage), None)
        if st is None:
            raise RuntimeError(f"BWD_W of micro-batch {ctx.mb} stage {ctx.stage} without its BWD_I")
        params = [p for p in self._module(ctx).parameters() if p.requires_grad]
        roots, root_grads = st.get("roots", ([], []))
        if params:
            torch.autograd.backward([st["out"]] + roots, [st.get("grad")] + root_grads, inputs=params)
        self.slices.release(ctx.mb, ctx.stage)
        self._sync()

    def reduce_grad(self, ctx):
        if self._reduce_grad is not None:
            # Every trainable parameter takes part, a zero gradient where this replica has none (a
            # replica without a sample, or a parameter its micro-batches did not reach): the replicas'
            # all-reduces must have the same size.
            params = [p for p in self._module(ctx).parameters() if p.requires_grad]
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            self._reduce_grad(ctx.stage, [p.grad for p in params])

    def reduce_tied(self, ctx):
        weight = getattr(self._module(ctx), "tied_weight", None)
        if weight is None:
            raise RuntimeError(f"the plan ties the embedding and the LM head, but stage {ctx.stage}'s module has no "
                               "tied_weight attribute (the parameter whose gradient REDUCE_TIED sums)")
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        if self._reduce_tied is None:
            raise RuntimeError("REDUCE_TIED: no group to reduce the tied weight over")
        self._reduce_tied(ctx.stage, weight.grad)

    def optimizer_step(self, ctx):
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self._sync()

    def allocate(self, ctx):
        t = torch.empty(ctx.shape.dims, dtype=self.dtype, device=self.device)
        return self._buffer(t)


def _name_of(dtype: torch.dtype) -> str:
    for k, v in _DTYPES.items():
        if v == dtype:
            return k
    return str(dtype)


def _op_times(plan, records: Sequence[rt.RankRecord]) -> List[tuple]:
    out = []
    for rec in records:
        times = rec.times
        stream = plan.streams[rec.rank]
        for i, ins in enumerate(stream):
            if ins.is_compute:
                out.append((rec.rank, ins.op, ins.mb, ins.stage, (times[i, 1] - times[i, 0]) / 1e6))
    return out


def _replica_tokens(plan):
    return (sum(int(m["tokens"]) for m in plan.microbatches), sum(int(m.get("loss_tokens", 0)) for m in plan.microbatches))


class PipelineRunner:
    """Runs this process's pipeline rank of each iteration's plan on the runtime's executor.

    ``stages`` maps each virtual stage this rank runs to its module (the plan's ``stage_rank`` says
    which: ``loader.my_stages`` or ``runner.my_stages(plan)``); ``loss_fn(output, batch)`` returns
    the summed token loss of a micro-batch (checked on the first micro-batch that can tell, unless
    ``check_loss=False``: packpipe.torch.loss.check_summed_loss); ``optimizer`` steps this rank's
    parameters after each iteration and zeroes their gradients (None: the runner leaves the reduced
    gradients in ``.grad`` and the trainer steps and zeroes them before the next run). ``dtype``
    (None: the stage modules' parameters') is the activations' between stages. ``groups`` are the
    job's process groups (:meth:`ProcessGroups.create`, collective), made from ``pp`` and ``dp``
    when not given. With ``measure_pipeline`` (default), each iteration ends with a tiny
    all-reduce over the pipeline so that ``StepResult.measured_ms`` is the pipeline's makespan,
    comparable with the plan's simulated one.
    """

    def __init__(self, stages: Dict[int, torch.nn.Module], loss_fn: LossFn, optimizer, *, groups=None,
                 pp: Optional[int] = None, dp: Optional[int] = None, device="cpu", dtype: Optional[torch.dtype] = None,
                 timeout_s: float = 300.0, check_agreement: bool = True, synchronize: bool = False,
                 measure_pipeline: bool = True, check_loss: bool = True):
        from packpipe.torch.transport import Monitor, ProcessGroups, TorchTransport, default_store
        where = "PipelineRunner"
        device, dtype, timeout_s = _check_runner(where, stages, loss_fn, device, dtype, timeout_s)
        check_step_arguments(where, loss_fn, optimizer, device)
        for name, flag in (("check_agreement", check_agreement), ("synchronize", synchronize),
                           ("measure_pipeline", measure_pipeline), ("check_loss", check_loss)):
            _check.boolean(where, name, flag)
        if groups is None:
            if pp is None or dp is None:
                raise ValueError("PipelineRunner: give groups, or pp and dp to create them")
            groups = ProcessGroups.create(_check.integer(where, "pp", pp, 1, _check.MAX_PIPELINE),
                                          _check.integer(where, "dp", dp, 1, _check.MAX_PIPELINE))
        else:
            _check.instance(where, "groups", groups, ProcessGroups, "a ProcessGroups (ProcessGroups.create)")
        self.groups = groups
        self.device = device
        self.dtype = dtype
        self.timeout_s = timeout_s
        self.monitor = Monitor(default_store(), groups.world_rank, groups.pp * groups.dp)
        self.handler = TorchStageHandler(stages, loss_fn, self.device, dtype, optimizer,
                                         reduce_grad=self._reduce_grad if groups.dp > 1 else None,
                                         reduce_tied=self._reduce_tied, synchronize=synchronize,
                                         check_loss=check_loss, where=where)
        self.transport = TorchTransport(groups, self.monitor, self.device)
        self.executor = rt.Executor(self.handler, self.transport,
                                    rt.ExecutorOptions(timeout_s=timeout_s, check_agreement=check_agreement))
        self._checked_iteration = None
        self.measure_pipeline = measure_pipeline
        self.single_host = len({h for h, _ in self.monitor.peers.values()}) == 1
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)

    @staticmethod
    def my_stages(plan, pipeline_rank: int) -> List[int]:
        """The virtual stages pipeline rank `pipeline_rank` runs in `plan`."""
        return [v for v, r in enumerate(plan.stage_rank) if r == pipeline_rank]

    def _wait(self, work, what: str):
        import datetime
        try:
            work.wait(datetime.timedelta(seconds=self.timeout_s) if self.timeout_s > 0 else datetime.timedelta(0))
        except RuntimeError as e:
            known = self.monitor.diagnose(settle_s=2.0)
            raise RuntimeError(f"{what} failed: {e}" + (f" [{known}]" if known else "")) from e

    def _check_replicas(self):
        """Once per iteration: every replica of this pipeline rank runs the same iteration."""
        it = self.handler.iteration
        if self._checked_iteration == it.iteration:
            return
        mine = torch.tensor([it.iteration, self.groups.replica], dtype=torch.int64)
        everyone = [torch.zeros_like(mine) for _ in range(self.groups.dp)]
        self._wait(dist.all_gather(everyone, mine, group=self.groups.data, async_op=True),
                   "the data-parallel check of the iteration")
        its = [int(t[0]) for t in everyone]
        if len(set(its)) != 1:
            raise RuntimeError(f"data-parallel replicas run different iterations: {its} (replica by replica)")
        self._checked_iteration = it.iteration

    def _reduce_grad(self, stage: int, grads: List[torch.Tensor]):
        self._check_replicas()
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._wait(dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.groups.data, async_op=True),
                   f"REDUCE_GRAD of stage {stage} over the data-parallel group")
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n

    def _reduce_tied(self, stage: int, grad: torch.Tensor):
        if self.groups.tied is None:
            return
        self._wait(dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=self.groups.tied, async_op=True),
                   f"REDUCE_TIED of stage {stage} between the first and the last pipeline rank")

    def run(self, iteration: Iteration) -> StepResult:
        """Runs this rank's stream of the iteration's plan; raises PipelineError naming the rank,
        iteration, instruction and cause when any rank fails."""
        plan = iteration.plan
        if plan.ranks != self.groups.pp or plan.dp != self.groups.dp or plan.replica != self.groups.replica:
            raise ValueError(f"the plan is for replica {plan.replica} of {plan.dp} with {plan.ranks} pipeline ranks; this "
                             f"rank is pipeline rank {self.groups.pipeline_rank} of replica {self.groups.replica} "
                             f"({self.groups.pp} x {self.groups.dp})")
        self.handler.iteration = iteration
        try:
            rec = self.executor.run(plan)
        except Exception:
            # The pipeline failed: stay until every other rank has its error too (or is gone), a few
            # seconds at most, so that this rank's exit never takes the reason away from a slower one.
            self.monitor.linger()
            raise
        finally:
            self.handler.iteration = None
        loss = loss_sum = None
        if self.handler.loss_sum is not None:
            loss_sum = float(self.handler.loss_sum)
            loss = loss_sum / plan.global_loss_tokens
        tokens, loss_tokens = _replica_tokens(plan)
        rank_ms = (rec.end_ns - rec.start_ns) / 1e6
        measured_ms = rank_ms
        if self.measure_pipeline and self.groups.pp > 1:
            # One steady clock for every process of a machine (CLOCK_MONOTONIC): the pipeline's first
            # start and last end; across machines, each rank's own span bounds it from below.
            base = self.executor.epoch_ns
            span = torch.tensor([-(base + rec.start_ns), base + rec.end_ns, rank_ms], dtype=torch.float64)
            self._wait(dist.all_reduce(span, op=dist.ReduceOp.MAX, group=self.groups.pipeline["control"],
                                       async_op=True), "the pipeline's iteration time")
            measured_ms = (float(span[1]) + float(span[0])) / 1e6 if self.single_host else float(span[2])
        result = StepResult(iteration.iteration, loss, tokens, loss_tokens, measured_ms, rank_ms, plan.makespan_ms,
                            [rec], _op_times(plan, [rec]), self.executor.epoch_ns if self.single_host else None,
                            loss_sum, int(plan.global_loss_tokens))
        _observed(iteration, result)
        return result

    def global_loss(self, result: StepResult) -> Optional[float]:
        """The whole global batch's loss (the sum of the replicas' StepResult.loss) on the ranks holding
        the head (collective over the data-parallel group of those ranks); None elsewhere."""
        if result.loss is None:
            return None
        if self.groups.data is None:
            return result.loss
        t = torch.tensor([result.loss], dtype=torch.float64)
        self._wait(dist.all_reduce(t, group=self.groups.data, async_op=True), "the loss all-reduce")
        return float(t)

    def close(self):
        self.monitor.close()


class _TiedExchange:
    """REDUCE_TIED between two rank threads of one process: the first to arrive waits for the other,
    then both gradients become their sum."""

    def __init__(self, timeout_s: float):
        self.cv = threading.Condition()
        self.timeout_s = timeout_s
        self.pending: Dict[int, torch.Tensor] = {}
        self.round = 0

    def __call__(self, stage: int, grad: torch.Tensor):
        with self.cv:
            r = self.round
            self.pending[stage] = grad
            if len(self.pending) == 2:
                a, b = self.pending.values()
                # Stages that share one Parameter (a tie within one process) share its gradient, which
                # autograd already summed over both: adding it to itself would double it.
                if a is not b and a.data_ptr() != b.data_ptr():
                    total = a + b
                    a.copy_(total)
                    b.copy_(total)
                self.pending.clear()
                self.round += 1
                self.cv.notify_all()
                return
            if not self.cv.wait_for(lambda: self.round != r, timeout=self.timeout_s or None):
                self.pending.clear()
                raise TimeoutError(f"REDUCE_TIED of stage {stage}: the other stage did not arrive in {self.timeout_s} s")


class LocalPipeline:
    """Every stage of one pipeline in this process: one executor thread per pipeline rank on the
    runtime's in-process transport (host copies on CPU; tensor copies on a GPU).

    ``stages`` maps every virtual stage to its module; ``optimizer`` is either one optimizer over
    every stage's parameters (stepped once the iteration's streams have all run), a callable
    ``optimizer(params) -> Optimizer`` making one per pipeline rank (stepped by OPT_STEP), or None
    (the trainer steps and zeroes after run()). Stage modules may share parameters, as the modules
    of one model in one process do: a tied embedding shared by the first and the last stage gets its
    gradient once (autograd sums both uses; REDUCE_TIED adds nothing), and a per-rank optimizer
    steps a shared parameter on the first rank that holds it. ``dtype`` (None: the modules'
    parameters') and ``check_loss`` as for PipelineRunner."""

    def __init__(self, stages: Dict[int, torch.nn.Module], loss_fn: LossFn, optimizer=None, *, device="cpu",
                 dtype: Optional[torch.dtype] = None, timeout_s: float = 300.0, synchronize: bool = False,
                 check_loss: bool = True):
        where = "LocalPipeline"
        device, dtype, timeout_s = _check_runner(where, stages, loss_fn, device, dtype, timeout_s)
        if optimizer is not None and not callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"{where}: optimizer must be None, a torch.optim.Optimizer or a callable making one per "
                            f"rank from its parameters, found {type(optimizer).__name__}")
        _check.boolean(where, "synchronize", synchronize)
        self.check_loss = _check.boolean(where, "check_loss", check_loss)
        self.stages = stages
        self.loss_fn = loss_fn
        self.device = device
        self.dtype = dtype
        self.timeout_s = timeout_s
        self.synchronize = synchronize
        self.optimizer = optimizer
        self._per_rank: Dict[int, Any] = {}
        self._handlers: Dict[tuple, TorchStageHandler] = {}
        self._tied = _TiedExchange(timeout_s)
        if isinstance(optimizer, torch.optim.Optimizer):
            optimizer.zero_grad(set_to_none=True)

    def _handlers_for(self, plan) -> List[TorchStageHandler]:
        key = tuple(plan.stage_rank)
        hs = self._handlers.get(key)
        if hs is None:
            hs = []
            missing = [v for v, rr in enumerate(plan.stage_rank) if v not in self.stages]
            if missing:
                raise KeyError(f"LocalPipeline has no module for virtual stages {missing}")
            per_rank = callable(self.optimizer) and not isinstance(self.optimizer, torch.optim.Optimizer)
            owner = self._parameter_owners(plan) if per_rank else {}
            for r in range(plan.ranks):
                mine = {v: self.stages[v] for v, rr in enumerate(plan.stage_rank) if rr == r}
                opt = None
                if per_rank:
                    if r not in self._per_rank:
                        params = [p for m in mine.values() for p in m.parameters() if owner[id(p)] == r]
                        self._per_rank[r] = self.optimizer(list({id(p): p for p in params}.values()))
                    opt = self._per_rank[r]
                hs.append(TorchStageHandler(mine, self.loss_fn, self.device, self.dtype, opt,
                                            reduce_tied=self._tied, synchronize=self.synchronize,
                                            check_loss=self.check_loss, where="LocalPipeline"))
            self._handlers[key] = hs
        return hs

    def _parameter_owners(self, plan) -> Dict[int, int]:
        """The pipeline rank whose per-rank optimizer steps each parameter (by id): the first rank that
        holds it. A parameter shared by several ranks is safe to step there only when the plan meets
        both ranks after their backward passes: the tied weight (REDUCE_TIED) is; any other shared
        parameter is refused (one optimizer over every stage steps it after every rank is done)."""
        owner: Dict[int, int] = {}
        holders: Dict[int, set] = {}
        names: Dict[int, str] = {}
        for v, r in enumerate(plan.stage_rank):
            for name, p in self.stages[v].named_parameters():
                owner.setdefault(id(p), r)
                holders.setdefault(id(p), set()).add(r)
                names.setdefault(id(p), f"stage {v}'s {name}")
        tied = set()
        if plan.tied_embedding:
            ends = [getattr(self.stages[v], "tied_weight", None) for v in (0, plan.vstages - 1)]
            if ends[0] is not None and ends[0] is ends[1]:
                tied.add(id(ends[0]))
        for pid, ranks in holders.items():
            if len(ranks) > 1 and pid not in tied:
                raise ValueError(
                    f"LocalPipeline: {names[pid]} is shared by the modules of pipeline ranks "
                    f"{', '.join(map(str, sorted(ranks)))}; a per-rank optimizer would step it before the other rank's "
                    "backward has added its gradient. Give LocalPipeline one torch.optim.Optimizer over every stage's "
                    "parameters (stepped once every rank is done), or tie it as the plan's tied weight "
                    "(tied_embedding=True and the stages' tied_weight)")
        return owner

    def run(self, iteration: Iteration) -> StepResult:
        """Runs every rank of the iteration's plan (dp must be 1)."""
        plan = iteration.plan
        if plan.dp != 1:
            raise ValueError(f"LocalPipeline runs one pipeline; the plan has {plan.dp} data-parallel replicas (plan "
                             "with dp=1, or run one process per rank)")
        hs = self._handlers_for(plan)
        for h in hs:
            h.iteration = iteration
        copy = None if self.device.type == "cpu" else _copy_tensor
        try:
            records = rt.run_local(plan, hs, rt.ExecutorOptions(timeout_s=self.timeout_s), copy)
        finally:
            for h in hs:
                h.iteration = None
        if isinstance(self.optimizer, torch.optim.Optimizer):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        loss_sum = sum(float(h.loss_sum) for h in hs if h.loss_sum is not None)
        start = min(r.start_ns for r in records)
        end = max(r.end_ns for r in records)
        tokens, loss_tokens = _replica_tokens(plan)
        result = StepResult(iteration.iteration, loss_sum / plan.global_loss_tokens, tokens, loss_tokens,
                            (end - start) / 1e6, (end - start) / 1e6, plan.makespan_ms, list(records),
                            _op_times(plan, records), None, loss_sum, int(plan.global_loss_tokens))
        _observed(iteration, result)
        return result


def _observed(iteration: Iteration, result: StepResult) -> None:
    """Hands a step's result to its loader's calibration (PlanLoader(calibrate=)), if it has one:
    at the boundary a collective fit, and calibrated plans from the next iteration."""
    observer = getattr(iteration, "_observer", None)
    if observer is not None:
        iteration._observer = None  # once per step
        observer(iteration, result)


def _copy_tensor(dst: rt.Buffer, src: rt.Buffer) -> None:
    dst.obj.copy_(src.obj)

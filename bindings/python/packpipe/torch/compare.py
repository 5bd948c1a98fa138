"""Is packpipe faster on my model? A measured comparison on the trainer's own model, data and ranks.

:func:`compare` trains the user's model for real with packpipe's plans and with the baselines a user
runs today, each family at every setting of a small grid, on the same global batches:

* ``fixed``: a fixed number of samples per micro-batch, padded to the longest (Megatron, DDP);
* ``fixed-packed``: the same counts packed into one row (HF ``DataCollatorWithFlattening``);
* ``tokens``: a token budget per micro-batch;
* ``packing``: varlen packing into rows of the longest sample's power of 2 (Megatron THD);
* ``wlb``: WLB-LLM's attention-balanced packing.

Every side plans with one cost model: the given one, calibrated first (by default) on packpipe's own
steps so that its plans are the kind that will run. The sides then run round by round, in alternating
order, each round timing every side's iterations back to back (the slowest rank's wall time). The
result holds measured tokens/s (median over rounds) per setting, packpipe's speed-up over each
family's best setting and over the best of all, its round-by-round range (the machine's noise), and
whether the two sides ran the same plan (the same micro-batches in the same order on every rank: a
tie by construction). Data parallel (one pipeline stage per rank, DDP over the ranks, as
:class:`GradientAccumulation` runs it); the model from ``model_fn()`` must start from the same
weights on every call (a fixed seed).
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

import packpipe
from packpipe import _check

FAMILIES = ("fixed", "fixed-packed", "tokens", "packing", "wlb")


@dataclasses.dataclass
class Side:
    """One measured configuration: its name, baseline family ("packpipe" for packpipe's own) and
    figures. ``ms`` is each round's time of all its iterations (the slowest rank's)."""
    name: str
    family: str
    tokens: int
    ms: List[float]
    simulated_ms: float
    microbatches: List[int]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.ms)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / (self.median_ms / 1e3)


@dataclasses.dataclass
class Comparison:
    """What :func:`compare` measured. ``best[family]`` (and ``best["any"]``) holds the family's fastest
    setting, packpipe's measured speed-up over it (median tokens/s ratio), the round-by-round median
    and range, the simulated speed-up of the same plans, and ``same_plans``."""
    sides: List[Side]
    best: Dict[str, Dict[str, Any]]
    rounds: int
    iterations: int
    ranks: int
    calibration: Optional[str]
    skipped: Dict[str, str] = dataclasses.field(default_factory=dict)  # setting -> why it could not plan

    def table(self) -> str:
        """The comparison as a text table (one line per setting, then the verdict)."""
        pp = self.sides[0]
        lines = [f"{'setting':40s} {'tokens/s':>10s} {'packpipe':>9s}  micro-batches per iteration"]
        for s in self.sides:
            ratio = "" if s is pp else f"{pp.tokens_per_s / s.tokens_per_s:8.3f}x"
            lines.append(f"{s.name:40s} {s.tokens_per_s:10.0f} {ratio:>9s}  {s.microbatches}")
        b = self.best["any"]
        lines.append("")
        lines.append(f"packpipe {b['speedup']:.3f}x the best baseline measured, {b['setting']} (round by round "
                     f"{b['paired_median']:.3f}x, range {b['paired_range'][0]:.3f}x to {b['paired_range'][1]:.3f}x; "
                     f"simulated {b['simulated_speedup']:.3f}x)"
                     + (": the same plans, a tie by construction" if b["same_plans"] else ""))
        for name, why in self.skipped.items():
            lines.append(f"{name}: not run, it cannot plan these batches: {why}")
        lines.append(f"{self.iterations} iterations x {self.rounds} rounds on {self.ranks} rank(s), alternating"
                     + (f"; every side planned with the calibration fitted first ({self.calibration})"
                        if self.calibration else "; uncalibrated cost model"))
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({"sides": [dict(dataclasses.asdict(s), tokens_per_s=s.tokens_per_s, median_ms=s.median_ms)
                                     for s in self.sides],
                           "best": self.best, "rounds": self.rounds, "iterations": self.iterations,
                           "ranks": self.ranks, "calibration": self.calibration, "skipped": self.skipped}, indent=1)


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _timed(fn) -> float:
    """The slowest rank's wall time of fn(), ms."""
    if _world() > 1:
        dist.barrier()
    t0 = time.perf_counter()
    fn()
    t = torch.tensor([(time.perf_counter() - t0) * 1e3], dtype=torch.float64)
    if _world() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _signature(it) -> list:
    """An iteration's plan as a comparable value: this replica's micro-batches in order (samples, row
    offsets, layout, recompute)."""
    return [(tuple(m["refs"]), tuple(m["offsets"]), tuple(m["row_offsets"]), m["layout"], tuple(m["recompute"]))
            for m in it.plan.microbatches]


def longest_sample(dataset) -> int:
    """The longest sample of a MultiTaskDataset, input + target tokens (as planned for a decoder-only
    model); at least 1."""
    longest = 1
    for t in range(dataset.num_tasks):
        inp, tgt = dataset.lengths(t)
        n = np.asarray(inp, dtype=np.int64) + (np.asarray(tgt, dtype=np.int64) if len(tgt) else 0)
        if n.size:
            longest = max(longest, int(n.max()))
    return longest


def baseline_settings(dataset, families: Sequence[str] = FAMILIES, grid: Sequence[int] = (1, 2, 4, 8),
                      budgets: Sequence[int] = (1, 2, 4)) -> List[tuple]:
    """(name, family, PartitionOptions) of each baseline family at every setting: counts from `grid`,
    token budgets and WLB capacities at `budgets` times the longest sample's power of 2, packing rows of
    that capacity."""
    longest = longest_sample(dataset)
    cap = 1
    while cap < longest:
        cap *= 2
    out = []
    for fam in families:
        if fam == "fixed":
            out += [(f"fixed (mbs {k})", fam, packpipe.PartitionOptions(method="fixed", mbs=k)) for k in grid]
        elif fam == "fixed-packed":
            out += [(f"fixed-packed (mbs {k})", fam, packpipe.PartitionOptions(method="fixed", mbs=k, layout="packed"))
                    for k in grid]
        elif fam == "tokens":
            out += [(f"tokens (budget {f * cap})", fam, packpipe.PartitionOptions(method="tokens", tokens=f * cap))
                    for f in budgets]
        elif fam == "packing":
            out += [(f"packing (capacity {cap} x {k} rows)", fam,
                     packpipe.PartitionOptions(method="packing", mbs=k, capacity=cap)) for k in grid]
        elif fam == "wlb":
            out += [(f"wlb (capacity {f * cap})", fam, packpipe.PartitionOptions(method="wlb", capacity=f * cap))
                    for f in budgets]
        else:
            raise ValueError(f"compare: baselines: unknown family {fam!r} (families: {', '.join(FAMILIES)})")
    return out


def compare(model_fn: Callable[[], torch.nn.Module], loss_fn: Callable, dataset, cost_model, *,
            global_batch_tokens: int, iterations: int = 4, rounds: int = 3, baselines: Sequence[str] = FAMILIES,
            grid: Sequence[int] = (1, 2, 4, 8), budgets: Sequence[int] = (1, 2, 4), seed: int = 0,
            calibrate_steps: int = 6, memory_mb: float = 0, lr: float = 1e-3,
            progress: Optional[Callable[[str], None]] = None) -> Comparison:
    """Measures packpipe against each baseline family at every setting on the trainer's own model
    (`model_fn()` makes it, the same weights every call; called as ``module(None, batch)``), loss
    (`loss_fn`, a summed token loss), data (a MultiTaskDataset or manifest path) and ranks (every
    rank of the initialised process group calls it: one replica each, DDP), on `iterations` global
    batches of `global_batch_tokens`, `rounds` timed rounds after a warm-up round. `calibrate_steps`
    of packpipe's own steps calibrate the cost model every side plans with first (0: plan with
    `cost_model` as given). `memory_mb` is PipelineShape's (0: the device's). A baseline setting that
    cannot plan the batches (a padded sample over the memory) is skipped and named in
    ``Comparison.skipped``. Returns a
    :class:`Comparison` (``.table()``, ``.to_json()``), the same on every rank."""
    from packpipe.torch.data import PlanLoader
    from packpipe.torch.dataparallel import GradientAccumulation

    where = "compare"
    if not callable(model_fn) or not callable(loss_fn):
        raise TypeError(f"{where}: model_fn and loss_fn must be callables (model_fn() -> nn.Module)")
    global_batch_tokens = _check.integer(where, "global_batch_tokens", global_batch_tokens, 1, _check.MAX_COUNT)
    iterations = _check.integer(where, "iterations", iterations, 1, _check.MAX_COUNT)
    rounds = _check.integer(where, "rounds", rounds, 1, 10 ** 6)
    calibrate_steps = _check.integer(where, "calibrate_steps", calibrate_steps, 0, _check.MAX_COUNT)
    seed = _check.integer(where, "seed", seed, 0, 2 ** 63 - 1)
    for name, values in (("grid", grid), ("budgets", budgets)):
        if not values:
            raise ValueError(f"{where}: {name} must hold at least one setting")
        for v in values:
            _check.integer(where, name, v, 1, 2 ** 31)
    if isinstance(dataset, str):
        dataset = packpipe.MultiTaskDataset(dataset)
    world = _world()
    replica = dist.get_rank() if world > 1 else 0
    shape = packpipe.PipelineShape(stages=1, dp=world, memory_mb=memory_mb)
    say = progress or (lambda text: None)
    common = dict(replica=replica, rank=0, shape=shape, global_batch_tokens=global_batch_tokens, seed=seed)
    # What a module's cost model knows beside its costs (a calibrated model is a plain CostModel)
    if getattr(cost_model, "torch_dtype", None) is not None:
        common["dtype"] = cost_model.torch_dtype
    if getattr(cost_model, "max_positions", None) is not None:
        common["max_seq_len"] = cost_model.max_positions

    def trainer():
        model = model_fn()
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{where}: model_fn() must return an nn.Module, found {type(model).__name__}")
        wrapped = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
        return GradientAccumulation(wrapped, loss_fn, torch.optim.SGD(model.parameters(), lr=lr))

    # 1. Calibration on packpipe's own steps (another epoch's batches), one fit shared by every side.
    model_for_plans, calibration = cost_model, None
    if calibrate_steps:
        loader = PlanLoader(dataset, cost_model=cost_model, epoch=1, iterations=calibrate_steps + 2,
                            calibrate={"warmup": 1, "fit_after": calibrate_steps}, **common)
        step = trainer()
        for it in loader:
            step.run(it)
        reports = loader.calibration_reports
        if reports:
            cal = packpipe.Calibration.from_json(reports[-1].calibration_json, "compare's fit")
            model_for_plans = packpipe.CalibratedCostModel(cost_model, cal)
            calibration = reports[-1].summary()
            say(f"calibrated: {calibration}")
    # 2. Every side's plans of the same global batches (epoch 0), and a trainer each.
    configs = [("packpipe", "packpipe", packpipe.PartitionOptions(method="dp"))] + \
        baseline_settings(dataset, baselines, grid, budgets)
    runs, skipped = [], {}
    for name, family, options in configs:
        try:
            its = list(PlanLoader(dataset, cost_model=model_for_plans, iterations=iterations, calibrate=False,
                                  options=options, **common))
        except ValueError as e:  # a baseline setting that cannot plan these batches (planning is the same
            if family == "packpipe":  # on every rank, so every rank skips it)
                raise
            skipped[name] = str(e).split(" (", 1)[0]
            say(f"{name}: skipped: {skipped[name]}")
            continue
        # tokens over every replica; simulated time of the slowest replica (they run side by side)
        figures = torch.tensor([float(sum(it.tokens for it in its)), sum(it.plan.makespan_ms for it in its)],
                               dtype=torch.float64)
        if world > 1:
            total = figures[:1].clone()
            dist.all_reduce(total)
            slowest = figures[1:].clone()
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            figures = torch.cat([total, slowest])
        runs.append({"side": Side(name, family, int(figures[0]), [], float(figures[1]),
                                  [len(it.plan.microbatches) for it in its]),
                     "its": its, "step": trainer()})
    if len(runs) < 2:
        raise ValueError(f"{where}: no baseline setting could plan these batches: {skipped}")
    # 3. Rounds, alternating order; round 0 warms up.
    for rnd in range(rounds + 1):
        order = runs if rnd % 2 == 0 else list(reversed(runs))
        for r in order:
            ms = _timed(lambda: [r["step"].run(it) for it in r["its"]])
            if rnd > 0:
                r["side"].ms.append(ms)
        say(f"round {rnd}/{rounds}{' (warm-up)' if rnd == 0 else ''} done")
    # 4. The verdict per family and overall.
    pp = runs[0]
    mine = [_signature(it) for it in pp["its"]]
    best: Dict[str, Dict[str, Any]] = {}
    for fam in list(dict.fromkeys(r["side"].family for r in runs[1:])) + ["any"]:
        cands = [r for r in runs[1:] if fam in ("any", r["side"].family)]
        top = max(cands, key=lambda r: r["side"].tokens_per_s)
        o, p = top["side"], pp["side"]
        paired = [(p.tokens / pm) / (o.tokens / om) for om, pm in zip(o.ms, p.ms)]
        agree = torch.tensor([int(mine == [_signature(it) for it in top["its"]])])
        if world > 1:
            dist.all_reduce(agree, op=dist.ReduceOp.MIN)
        best[fam] = {"setting": o.name, "speedup": p.tokens_per_s / o.tokens_per_s,
                     "paired_median": statistics.median(paired), "paired_range": [min(paired), max(paired)],
                     "simulated_speedup": o.simulated_ms / p.simulated_ms if p.simulated_ms else float("nan"),
                     "same_plans": bool(agree.item())}
    return Comparison([r["side"] for r in runs], best, rounds, iterations, world, calibration, skipped)

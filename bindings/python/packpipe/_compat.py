"""The call forms of packpipe 0.1 before the one argument order, kept for this release only.

packpipe 0.1 took ``partition(input_lengths, cost_model, ...)`` (the data first), flat keywords
(``stages=``, ``zero_stage=``, ``method=``, ...) instead of ``shape=PipelineShape(...)`` and
``options=PartitionOptions(...)``, and returned dicts. Each old form still works here, with a
DeprecationWarning; packpipe 0.2 removes them (and this module). Nothing here plans: every call
ends in the native function with the new arguments, so the results are the same bits.
"""
import functools
import sys
import warnings

from packpipe import _core, _errors

REMOVAL = "the old form works in packpipe 0.1 only and is removed in packpipe 0.2"

SHAPE_FIELDS = ("stages", "chunks", "layers_per_stage", "dp", "tp", "zero", "memory_mb")
OPTION_FIELDS = ("method", "mbs", "tokens", "round_multiple", "recompute", "oversize", "cost_basis", "order",
                 "pack_windows", "threads")
RENAMED = {"zero_stage": "zero"}  # old keyword -> PipelineShape field

# packpipe 0.1 positional parameters, by position.
OLD_PARTITION_PARAMS = ("input_lengths", "cost_model", "target_lengths", "stages", "layers_per_stage", "chunks", "dp",
                        "tp", "memory_mb", "zero_stage", "method", "mbs", "tokens", "round_multiple", "recompute",
                        "oversize", "cost_basis", "pack_windows", "cache", "order", "threads")
OLD_SCHEDULE_PARAMS = ("stages", "chunks", "layers_per_stage", "tp", "dp", "zero", "memory_mb")


def warn(old, new):
    """A DeprecationWarning pointing at the caller's line (the first frame outside this module)."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        level, frame = level + 1, frame.f_back
    warnings.warn(f"packpipe: {old} is deprecated; use {new} ({REMOVAL})", DeprecationWarning, stacklevel=level)


def fields(obj, names):
    return {n: getattr(obj, n) for n in names}


def merge(where, kwargs, named):
    """kwargs plus the parameters `named` (from old positions); a name given twice is a TypeError."""
    twice = sorted(set(named) & set(kwargs))
    if twice:
        raise TypeError(f"{where}: got multiple values for {', '.join(twice)}")
    return {**named, **kwargs}


def fold_flat(where, kwargs, default_shape):
    """Moves flat shape and option keywords of `kwargs` into shape= and options= (warning once)."""
    flat = sorted(k for k in kwargs if RENAMED.get(k, k) in SHAPE_FIELDS or k in OPTION_FIELDS)
    shape = {RENAMED.get(k, k): kwargs.pop(k) for k in flat if RENAMED.get(k, k) in SHAPE_FIELDS}
    options = {k: kwargs.pop(k) for k in flat if k in OPTION_FIELDS}
    if not flat:
        return kwargs
    for key, given in (("shape", shape), ("options", options)):
        if given and key in kwargs:
            raise TypeError(f"{where}: give {key}= or the keywords {', '.join(sorted(given))}, not both")
    old = ", ".join(f"{k}=" for k in flat)
    new = []
    if shape:
        kwargs["shape"] = _core.PipelineShape(**{**fields(default_shape, SHAPE_FIELDS), **shape})
        new.append("shape=packpipe.PipelineShape(...)")
    if options:
        kwargs["options"] = _core.PartitionOptions(**options)
        new.append("options=packpipe.PartitionOptions(...)")
    warn(f"{where}({old}...)", f"{where}(..., {', '.join(new)})")
    return kwargs


@functools.wraps(_core.partition)
def partition(*args, **kwargs):
    # 0.1 order: the lengths first, the cost model second (positional or cost_model=).
    if args and not isinstance(args[0], _core.CostModel) and (
            "cost_model" in kwargs or (len(args) >= 2 and isinstance(args[1], _core.CostModel))):
        if len(args) > len(OLD_PARTITION_PARAMS):
            raise TypeError(f"partition: at most {len(OLD_PARTITION_PARAMS)} positional arguments, got {len(args)}")
        warn("partition(input_lengths, cost_model, ...)", "partition(cost_model, input_lengths, ...)")
        kwargs = merge("partition", kwargs, dict(zip(OLD_PARTITION_PARAMS, args)))
        args = ()
    return _errors.wrap(_core.partition, "partition")(*args, **fold_flat("partition", kwargs, _core.PipelineShape()))


@functools.wraps(_core.plan_batch)
def plan_batch(*args, **kwargs):
    return _errors.wrap(_core.plan_batch, "plan_batch")(*args, **fold_flat("plan_batch", kwargs,
                                                                           _core.PipelineShape(stages=4)))


@functools.wraps(_core.static_memory)
def static_memory(*args, **kwargs):
    if "zero_stage" in kwargs:
        warn("static_memory(zero_stage=)", "static_memory(zero=)")
        kwargs = merge("static_memory", kwargs, {"zero": kwargs.pop("zero_stage")})
    return _errors.wrap(_core.static_memory, "static_memory")(*args, **kwargs)


native_schedule_init = _core.ScheduleProblem.__init__


@functools.wraps(native_schedule_init)
def schedule_problem_init(self, cost_model, microbatches, *args, **kwargs):
    if args:
        if any(isinstance(a, _core.PipelineShape) for a in args):
            raise TypeError("ScheduleProblem: shape is keyword-only: ScheduleProblem(cost_model, microbatches, "
                            "shape=...)")
        if len(args) > len(OLD_SCHEDULE_PARAMS):
            raise TypeError(f"ScheduleProblem: at most {2 + len(OLD_SCHEDULE_PARAMS)} positional arguments")
        kwargs = merge("ScheduleProblem", kwargs, dict(zip(OLD_SCHEDULE_PARAMS, args)))
    kwargs = fold_flat("ScheduleProblem", kwargs, _core.PipelineShape(stages=4))
    native_schedule_init(self, cost_model, microbatches, **kwargs)


_core.ScheduleProblem.__init__ = schedule_problem_init


def figures_dict(f, mbs=None):
    d = {"feasible": f.feasible, "microbatches": f.microbatches, "efficiency": f.efficiency,
         "iteration_ms": f.iteration_ms, "peak_mb": f.peak_mb, "schedule": f.schedule, "why": f.why}
    if mbs is not None:
        d["mbs"] = mbs
    return d


class BaselineGrid:
    """One baseline family's entries of IterationResult.baselines: their micro-batch sizes (fixed)
    or rows (packing) and their MethodFigures, in grid order (as IterationResult.fixed and .packing
    gave them before the grid held every family)."""

    def __init__(self, entries):
        self.mbs = [b.mbs for b in entries]
        self.figures = [b.figures for b in entries]
        self.settings = [b.setting for b in entries]

    def __len__(self):
        return len(self.mbs)

    def __repr__(self):
        return f"BaselineGrid(mbs={self.mbs})"


def family_grid(family):
    return property(lambda self: BaselineGrid([b for b in self.baselines if b.family == family]),
                    doc=f"The {family} entries of baselines (a BaselineGrid: mbs, figures, settings)")


_core.IterationResult.fixed = family_grid("fixed")
_core.IterationResult.packing = family_grid("packing")


def result_item(self, key):
    """result[key]: the attribute `key`, as the dicts of packpipe 0.1 answered (deprecated)."""
    if not isinstance(key, str) or key.startswith("_") or not hasattr(self, key):
        raise KeyError(key)
    warn(f"{type(self).__name__}[{key!r}]", f"the attribute .{key}")
    value = getattr(self, key)
    if isinstance(value, BaselineGrid):  # 0.1: a list of figure dicts with their 'mbs'
        return [figures_dict(f, m) for m, f in zip(value.mbs, value.figures)]
    return value


for cls in (_core.MicroBatch, _core.Partition, _core.MethodFigures, _core.IterationResult):
    cls.__getitem__ = result_item

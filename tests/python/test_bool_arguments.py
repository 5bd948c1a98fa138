"""Bool arguments, module-wide: no bound function or property takes a native C++ bool (pybind11 takes 0,
1, 2.5 or None by their truth value, and refuses "no" with its "incompatible function arguments"
signature dump). Each is taken as a BoolArg (shown as builtins.bool) or an object and converted by the
one checked helper of bindings/bind.h: "no", "False", 1, 0, 2.5 and None raise a ValueError that names
the argument, as a bad integer does; True, False and numpy bools are bools."""
import re

import numpy as np
import pytest

import packpipe
import packpipe.runtime
from test_integer_arguments import parameters, world  # noqa: F401 (world: the module's objects, a fixture)

NATIVE_BOOL = re.compile(r"(?<![\w.])bool(?![\w])")  # bool, Optional[bool]; not builtins.bool, not numpy.bool_
CHECKED = "builtins.bool"  # what a parameter converted by bool_arg shows


def test_no_bound_function_takes_a_native_bool():
    native = sorted({f"{q}({p}: {a})" for q, p, a in parameters() if NATIVE_BOOL.search(a)})
    assert not native, f"take these as BoolArg (def_ints, def_field, bool_of in bindings/bind.h): {native}"
    assert sum(1 for _, _, a in parameters() if a == CHECKED) > 20  # the scan found the converted ones


def plan_batch(w, **kw):
    return packpipe.plan_batch(w.gpt, [10, 20], shape=w.shape, **kw)


def plan_epoch(w, **kw):
    return packpipe.plan_epoch(w.gpt, w.ds, global_batch_tokens=2000, iterations=1, **kw)


def keyword(call, name):
    """A case: call(w, name=v)."""
    return lambda w, v: call(w, **{name: v})


# name -> a call with value v of the bool parameter the name ends with: "(name)", or a property's
# name for a setter ("(arg1)"). Every parameter shown as builtins.bool is here
# (test_every_checked_bool_is_swept), and the bools taken as objects.
CASES = {
    "FitOptions.__init__(regions)": lambda w, v: packpipe.FitOptions(regions=v),
    "FitOptions.regions(arg1)": lambda w, v: setattr(packpipe.FitOptions(), "regions", v),
    "CostModel.stage_cost(has_embedding)": lambda w, v: w.gpt.stage_cost(encoder_layers=1, seq=128, has_embedding=v),
    "CostModel.stage_cost(has_postprocess)":
        lambda w, v: w.gpt.stage_cost(encoder_layers=1, seq=128, has_postprocess=v),
    "CostModel.stage_static_memory(has_embedding)":
        lambda w, v: w.gpt.stage_static_memory(encoder_layers=1, has_embedding=v),
    "CostModel.stage_static_memory(has_postprocess)":
        lambda w, v: w.gpt.stage_static_memory(encoder_layers=1, has_postprocess=v),
    "CostModel.p2p_ms(inter_node)": lambda w, v: w.gpt.p2p_ms(1e6, inter_node=v),
    "CostModel.all_reduce_ms(inter_node)": lambda w, v: w.gpt.all_reduce_ms(1e6, n=2, inter_node=v),
    "CostModel.all_gather_ms(inter_node)": lambda w, v: w.gpt.all_gather_ms(1e6, n=2, inter_node=v),
    "CostModel.reduce_scatter_ms(inter_node)": lambda w, v: w.gpt.reduce_scatter_ms(1e6, n=2, inter_node=v),
    "IndexedDatasetBuilder.__init__(multimodal)":
        lambda w, v: packpipe.IndexedDatasetBuilder(str(w.tmp / "modes"), np.uint16, multimodal=v),
    "check_outputs(probe)": lambda w, v: packpipe.check_outputs({"--out": str(w.tmp / "probe.json")}, probe=v),
    "microbatch_layout(decoder)": lambda w, v: packpipe.microbatch_layout(w.plan, 0, decoder=v),
    "PartitionOptions.__init__(pack_windows)": lambda w, v: packpipe.PartitionOptions(pack_windows=v),
    "PartitionOptions.pack_windows(arg1)": lambda w, v: setattr(packpipe.PartitionOptions(), "pack_windows", v),
    "Plan.validate(count_buffers)": lambda w, v: w.plan.validate(count_buffers=v),
    "Plan.to_bytes(compress)": lambda w, v: w.plan.to_bytes(compress=v),
    "PlanFileWriter.__init__(compress)": lambda w, v: packpipe.PlanFileWriter(str(w.tmp / "c.plans"), compress=v),
    "RankLoader.__init__(allow_incomplete)":
        lambda w, v: packpipe.RankLoader(w.ds, plan_file=w.path, allow_incomplete=v),
    "ScheduleProblem.search(reference)": lambda w, v: w.problem.search(reference=v),
    "runtime.ExecutorOptions.__init__(validate)": lambda w, v: packpipe.runtime.ExecutorOptions(validate=v),
    "runtime.ExecutorOptions.__init__(check_agreement)":
        lambda w, v: packpipe.runtime.ExecutorOptions(check_agreement=v),
    "runtime.ExecutorOptions.__init__(record)": lambda w, v: packpipe.runtime.ExecutorOptions(record=v),
    "runtime.ExecutorOptions.validate(arg1)": lambda w, v: setattr(packpipe.runtime.ExecutorOptions(), "validate", v),
    "runtime.ExecutorOptions.check_agreement(arg1)":
        lambda w, v: setattr(packpipe.runtime.ExecutorOptions(), "check_agreement", v),
    "runtime.ExecutorOptions.record(arg1)": lambda w, v: setattr(packpipe.runtime.ExecutorOptions(), "record", v),
    # taken as objects
    "Measurement.embedding(arg1)": lambda w, v: setattr(packpipe.Measurement(), "embedding", v),
    "Measurement.postprocess(arg1)": lambda w, v: setattr(packpipe.Measurement(), "postprocess", v),
}
CASES.update({f"plan_batch({p})": keyword(plan_batch, p)
              for p in ("validate", "baselines", "tied_embedding", "split_backward", "schedule_fallback")})
CASES.update({f"plan_epoch({p})": keyword(plan_epoch, p)
              for p in ("validate", "baselines", "encode", "compress", "tied_embedding", "split_backward",
                        "schedule_fallback")})


def argument(case):
    """The argument a case's error must name: the parameter, or the property a setter sets."""
    qual, param = re.fullmatch(r"(.+)\((\w+)\)", case).groups()
    return qual.rsplit(".", 1)[1] if param in ("arg0", "arg1") else param


def test_every_checked_bool_is_swept():
    swept = {k.replace("CalibratedCostModel.", "CostModel.") for k in CASES}
    missing = sorted({f"{q}({p})" for q, p, a in parameters() if a == CHECKED} - swept)
    assert not missing, f"add them to CASES: {missing}"


@pytest.mark.parametrize("case, value", [(c, v) for c in sorted(CASES) for v in ("no", "False", 1, 0, 2.5, None)])
def test_bad_bools_raise_a_value_error_naming_the_argument(world, case, value):  # noqa: F811
    with pytest.raises(ValueError) as e:
        CASES[case](world, value)
    assert argument(case) in str(e.value) and "True or False" in str(e.value), str(e.value)
    assert "incompatible function arguments" not in str(e.value)


@pytest.mark.parametrize("case", sorted(CASES))
def test_numpy_bools_are_bools(world, case):  # noqa: F811
    for value in (np.False_, np.True_, False, True):
        try:
            CASES[case](world, value)
        except (ValueError, RuntimeError, IndexError) as e:  # what the call does with it is its own business
            assert "True or False" not in str(e), f"{case}={value!r}: {e}"

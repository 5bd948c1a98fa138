"""Bool arguments of the Python layer, module-wide: every public function, method and constructor of
packpipe's Python modules and packpipe.torch that takes a bool (a parameter with a bool default or a
bool annotation) checks it where it enters, as the integers are checked: "no", "False", 1, 0, 2.5
and None (where None is not the default) raise a TypeError naming the argument, never a truth-value
cast; numpy bools are bools. A parameter that takes a bool or something else (PlanLoader's calibrate:
'auto', True, False or a dict) refuses what is not in its set, naming it."""
import inspect
import re

import numpy as np
import pytest
import torch

import packpipe
import packpipe.plots
import packpipe.runtime
import packpipe.torch as pt
from packpipe.torch import attention, calibrate, data, dataparallel, describe, loss, models, profile, run, runner, \
    transport

import support

MODULES = [packpipe.plots, packpipe.runtime, attention, calibrate, data, dataparallel, describe, loss, models, profile,
           run, runner, transport]
GPT = models.GPTConfig(vocab_size=96, hidden=16, layers=4, heads=2, dtype=torch.float64)


def public_functions():
    """(module.qualified name, function) of every public function, and every public method and
    constructor of every public class, defined in MODULES."""
    for mod in MODULES:
        short = mod.__name__.rsplit(".", 1)[1]
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                continue
            if inspect.isfunction(obj):
                yield f"{short}.{name}", obj
            elif inspect.isclass(obj):
                for m, fn in sorted(vars(obj).items()):
                    if inspect.isfunction(fn) and (not m.startswith("_") or m == "__init__"):
                        yield f"{short}.{name}.{m}", fn


def bool_parameters():
    """{'module.function(parameter)': its default} of every parameter with a bool default or annotation."""
    out = {}
    for qual, fn in public_functions():
        for p in inspect.signature(fn).parameters.values():
            if isinstance(p.default, bool) or re.search(r"\bbool\b", str(p.annotation)):
                out[f"{qual}({p.name})"] = p.default
    return out


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bools")
    o = type("World", (), {})()
    o.manifest = support.short_manifest(tmp)
    o.cost_model = support.cost_model(GPT, tmp)
    o.stage = {0: torch.nn.Linear(2, 2)}
    return o


def plan_loader(w, **kw):
    return pt.PlanLoader(w.manifest, cost_model=w.cost_model, global_batch_tokens=500, dtype="fp64", rank=None,
                         iterations=1, **kw)


# name -> a call with value v of the bool parameter the name ends with. Every parameter of
# bool_parameters() is here (test_every_bool_parameter_is_swept), and the bool-or-something ones.
CASES = {
    "attention.attention(causal)": lambda w, v: attention.attention(None, None, None, None, causal=v),
    "attention.attention(decoder)": lambda w, v: attention.attention(None, None, None, None, causal=True, decoder=v),
    "data.MicroBatch.__init__(labels_shifted)": lambda w, v: pt.MicroBatch(None, "cpu", labels_shifted=v),
    "data.MicroBatch.attention_mask(causal)": lambda w, v: pt.MicroBatch.attention_mask(None, causal=v),
    "data.MicroBatch.attention_mask(decoder)": lambda w, v: pt.MicroBatch.attention_mask(None, decoder=v),
    "data.Iteration.__init__(encdec)": lambda w, v: pt.Iteration(None, v),
    "data.Iteration.__init__(labels_shifted)": lambda w, v: pt.Iteration(None, False, labels_shifted=v),
    "data.PlanLoader.__init__(allow_incomplete)": lambda w, v: plan_loader(w, allow_incomplete=v),
    "data.PlanLoader.__init__(split_backward)": lambda w, v: plan_loader(w, split_backward=v),
    "data.PlanLoader.__init__(calibrate)": lambda w, v: plan_loader(w, calibrate=v),  # 'auto', True, False, a dict
    "dataparallel.GradientAccumulation.__init__(check_loss)":
        lambda w, v: pt.GradientAccumulation(w.stage[0], models.gpt_loss, check_loss=v),
    "describe.describe_model(gated_mlp)": lambda w, v: pt.describe_model(w.stage[0], gated_mlp=v),
    "loss.evaluate_loss(check)": lambda w, v: loss.evaluate_loss(models.gpt_loss, None, None, "test", v),
    "models.Attention.forward(causal)": lambda w, v: models.Attention.forward(None, None, None, v),
    "models.Attention.forward(decoder)": lambda w, v: models.Attention.forward(None, None, None, True, decoder=v),
    "models.EncoderBlock.forward(causal)": lambda w, v: models.EncoderBlock.forward(None, None, None, causal=v),
    "models.MaskedBatch.attention_mask(causal)": lambda w, v: models.MaskedBatch(None).attention_mask(causal=v),
    "models.MaskedBatch.attention_mask(decoder)": lambda w, v: models.MaskedBatch(None).attention_mask(decoder=v),
    "models.GPTStage.set_selective_recompute(on)": lambda w, v: models.GPTStage.set_selective_recompute(None, v),
    "models.T5Stage.set_selective_recompute(on)": lambda w, v: models.T5Stage.set_selective_recompute(None, v),
    "profile.profile(progress)": lambda w, v: profile.profile([], [], [], [], [], "cpu", progress=v),
    "runner.TorchStageHandler.__init__(synchronize)":
        lambda w, v: pt.TorchStageHandler(w.stage, models.gpt_loss, "cpu", torch.float32, synchronize=v),
    "runner.TorchStageHandler.__init__(check_loss)":
        lambda w, v: pt.TorchStageHandler(w.stage, models.gpt_loss, "cpu", torch.float32, check_loss=v),
    "runner.PipelineRunner.__init__(check_agreement)":
        lambda w, v: pt.PipelineRunner(w.stage, models.gpt_loss, None, pp=1, dp=1, check_agreement=v),
    "runner.PipelineRunner.__init__(synchronize)":
        lambda w, v: pt.PipelineRunner(w.stage, models.gpt_loss, None, pp=1, dp=1, synchronize=v),
    "runner.PipelineRunner.__init__(measure_pipeline)":
        lambda w, v: pt.PipelineRunner(w.stage, models.gpt_loss, None, pp=1, dp=1, measure_pipeline=v),
    "runner.PipelineRunner.__init__(check_loss)":
        lambda w, v: pt.PipelineRunner(w.stage, models.gpt_loss, None, pp=1, dp=1, check_loss=v),
    "runner.LocalPipeline.__init__(synchronize)": lambda w, v: pt.LocalPipeline(w.stage, models.gpt_loss, synchronize=v),
    "runner.LocalPipeline.__init__(check_loss)": lambda w, v: pt.LocalPipeline(w.stage, models.gpt_loss, check_loss=v),
    "models.GPTConfig.__init__(tied_embedding)": lambda w, v: models.GPTConfig(tied_embedding=v),
    "calibrate.CalibrationReport.__init__(transfers_fitted)":
        lambda w, v: pt.CalibrationReport(iteration=0, measurements=0, iterations=0, transfers_fitted=v),
}
DEFAULTS = bool_parameters()


def test_every_bool_parameter_is_swept():
    missing = sorted(set(DEFAULTS) - set(CASES))
    assert not missing, f"check them with _check.boolean where they enter, and add them to CASES: {missing}"
    assert len(DEFAULTS) > 20  # the scan found them


@pytest.mark.parametrize("case, value", [(c, v) for c in sorted(CASES) for v in ("no", "False", 1, 0, 2.5, None)
                                          if not (v is None and DEFAULTS.get(c, False) is None)])
def test_bad_bools_are_refused_naming_the_argument(w, case, value):
    arg = re.fullmatch(r".+\((\w+)\)", case).group(1)
    with pytest.raises((TypeError, ValueError)) as e:
        CASES[case](w, value)
    assert re.search(rf"\b{arg}\b", str(e.value)), str(e.value)
    assert "incompatible function arguments" not in str(e.value)


@pytest.mark.parametrize("case", sorted(CASES))
def test_numpy_bools_are_bools(w, case):
    for value in (np.False_, np.True_):
        try:
            CASES[case](w, value)
        except Exception as e:  # noqa: BLE001 - the call may fail later (None tensors); never at the bool
            assert "True or False" not in str(e) and "calibrate must be" not in str(e), f"{case}={value!r}: {e}"


def test_calibrate_names_its_set(w):
    with pytest.raises(TypeError, match=r"PlanLoader: calibrate must be 'auto', True, False or a dict of Calibrator "
                                        r"settings, found NoneType None"):
        plan_loader(w, calibrate=None)
    with pytest.raises(ValueError, match=r"calibrate must be 'auto', True, False or a dict .* found 'yes'"):
        plan_loader(w, calibrate="yes")
    assert plan_loader(w, calibrate=np.False_)._auto_settings is None
    assert plan_loader(w, calibrate=np.True_)._auto_settings == data.AUTO_CALIBRATION

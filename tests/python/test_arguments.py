"""What every entry point shares: one argument order (the cost model, the data, then shape= and
options=) and lengths checked, never cast."""
import inspect
import json
import os
import re

import numpy as np
import pytest

import packpipe
from packpipe import _core


def gpt():
    return packpipe.CostModel("gpt-1.3b", "A100-40GB")


SHAPE = packpipe.PipelineShape(stages=4, layers_per_stage=4, memory_mb=36000)


def parameters(fn):
    """Parameter names of a native function or constructor, from its pybind11 signature line."""
    line = fn.__doc__.strip().splitlines()[0]
    return re.findall(r"(?:^|[(,] ?\*?,? ?)(\w+):", line.split("(", 1)[1])


def test_one_argument_order_across_the_entry_points():
    orders = {
        "partition": parameters(_core.partition),
        "plan_batch": parameters(_core.plan_batch),
        "plan_epoch": parameters(_core.plan_epoch),
        "ScheduleProblem": [p for p in parameters(_core.ScheduleProblem.__init__) if p != "self"],
    }
    for name, params in orders.items():
        assert params[0] == "cost_model", (name, params)
        assert params[1] in ("input_lengths", "dataset", "microbatches"), (name, params)
        assert params.index("shape") > 1, (name, params)
        if "options" in params:
            assert params.index("options") == params.index("shape") + 1, (name, params)
    # shape and options are keyword-only everywhere: nothing to put in the wrong place
    for fn in (packpipe.partition, packpipe.plan_batch):
        with pytest.raises(TypeError):
            fn(gpt(), [10, 20], None, SHAPE)
    with pytest.raises(TypeError, match="shape is keyword-only"):
        packpipe.ScheduleProblem(gpt(), [(1, 128)], SHAPE)


def test_one_spelling_of_each_parameter():
    """zero (not zero_stage), memory_mb, mbs, tokens, cost_basis: the CLI's names, on the option classes."""
    shape_fields = {"stages", "chunks", "layers_per_stage", "dp", "tp", "zero", "memory_mb", "stage_layers"}
    option_fields = {"method", "mbs", "tokens", "round_multiple", "recompute", "oversize", "cost_basis", "order",
                     "pack_windows", "threads", "layouts", "layout", "capacity", "slicing", "min_slice_tokens"}
    assert set(parameters(_core.PipelineShape.__init__)) - {"self"} == shape_fields
    assert set(parameters(_core.PartitionOptions.__init__)) - {"self"} == option_fields
    for fn in (_core.partition, _core.plan_batch, _core.plan_epoch, _core.ScheduleProblem.__init__):
        flat = set(parameters(fn)) & (shape_fields | option_fields | {"zero_stage"})
        assert flat <= {"threads"}, (fn, flat)  # plan_epoch's threads: planning threads, not the partitioner's
    assert "zero" in parameters(_core.static_memory)
    assert "zero" in parameters(_core.CostModel.stage_static_memory)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64,
                                   np.int64])
def test_every_integer_dtype_gives_the_same_partition(dtype):
    x = np.arange(1, 101, dtype=np.int64)
    ref = packpipe.partition(gpt(), x.astype(np.uint32), shape=SHAPE)
    r = packpipe.partition(gpt(), x.astype(dtype), shape=SHAPE)
    assert r.objective_ms == ref.objective_ms
    assert [m.samples.tolist() for m in r.microbatches] == [m.samples.tolist() for m in ref.microbatches]


def test_lists_and_strided_views_are_lengths():
    x = np.arange(1, 201, dtype=np.int64)
    ref = packpipe.partition(gpt(), x[::2].copy(), shape=SHAPE)
    for arg in (x[::2], x[::2].tolist(), tuple(x[::2].tolist()), x.reshape(100, 2)[:, 0]):
        r = packpipe.partition(gpt(), arg, shape=SHAPE)
        assert r.objective_ms == ref.objective_ms and r.input_tokens == int(x[::2].sum())
    assert len(packpipe.partition(gpt(), [], shape=SHAPE).microbatches) == 0  # an empty list has no dtype


@pytest.mark.parametrize("value, found", [
    (np.array([1.0, 2.0]), "float64"),
    (np.array([1.5, 2.0], dtype=np.float32), "float32"),
    (np.array([True, False]), "bool"),
    (np.array([1 + 0j, 2]), "complex128"),
    (np.array([1, "a"], dtype=object), "object"),
    ([1.5, 2.5], "float64"),  # a list numpy makes floats of
    (np.array([], dtype=np.float64), "float64"),
    (np.array(["12", "3"]), "<U2"),
])
@pytest.mark.parametrize("entry", ["partition", "plan_batch"])
def test_non_integer_lengths_name_the_argument_and_the_dtype(entry, value, found):
    fn = getattr(packpipe, entry)
    with pytest.raises(ValueError, match=rf"input_lengths must have an integer dtype \(lengths in tokens\), "
                                         rf"found {re.escape(found)}"):
        fn(gpt(), value, shape=SHAPE)
    t5 = packpipe.CostModel("t5-770m", "A100-40GB")
    with pytest.raises(ValueError, match=rf"target_lengths must have an integer dtype .*found {re.escape(found)}"):
        fn(t5, [10, 20], value, shape=packpipe.PipelineShape(stages=2))


def test_dimensions_and_ranges_name_the_argument():
    for value, msg in [
        (np.ones((2, 2), dtype=np.uint32), "input_lengths must be one-dimensional, found 2 dimensions"),
        (np.uint32(5), "input_lengths must be one-dimensional, found 0 dimensions"),
        (np.array([5, -1]), r"input_lengths\[1\] = -1 is out of range \[0, 4294967295\]"),
        (np.array([5, 2**32], dtype=np.uint64), r"input_lengths\[1\] = 4294967296 is out of range"),
        ([3, -4], r"input_lengths\[1\] = -4 is out of range"),
        (np.array([5, 6], dtype=">i4"), "input_lengths must have an integer dtype in native byte order, found >i4"),
    ]:
        with pytest.raises(ValueError, match=msg):
            packpipe.partition(gpt(), value, shape=SHAPE)
    with pytest.raises(ValueError, match="input_lengths must be one-dimensional"):
        packpipe.plan_batch(gpt(), np.ones((3, 1), dtype=np.int64))


def test_the_wrapped_functions_keep_their_names_and_docs():
    for name in ("partition", "plan_batch", "static_memory"):
        fn = getattr(packpipe, name)
        assert fn.__name__ == name and fn.__doc__ == getattr(_core, name).__doc__
        assert inspect.unwrap(fn) is getattr(_core, name)


CPP_SPELLINGS = re.compile(r"zero_stage|microbatch_size|token_budget|memory_limit_mb|allow_split_backward|"
                           r"options forbid")


def _t5():
    return packpipe.CostModel("t5-770m", "A100-40GB")


@pytest.mark.parametrize("call, message", [
    (lambda: packpipe.plan_batch(gpt(), [100, 200], options=packpipe.PartitionOptions(method="packing")),
     r"method 'packing' needs a micro-batch size \(mbs / --mbs\) of at least 1, found 0"),
    (lambda: packpipe.partition(gpt(), [100, 200], options=packpipe.PartitionOptions(method="tokens")),
     r"method 'tokens' needs a token budget per micro-batch \(tokens / --tokens\) of at least 1, found 0"),
    (lambda: packpipe.partition(gpt(), [100], options=packpipe.PartitionOptions(round_multiple=0)),
     r"\(round_multiple / --round-multiple\) must be in \[1, 65536\], found 0"),
    (lambda: packpipe.PipelineShape(zero=4), r"ZeRO stage \(zero / --zero\) must be 0-3, found 4"),
    (lambda: packpipe.PipelineShape(memory_mb=-1.0), r"memory limit \(memory_mb / --memory-mb\) must be in"),
    (lambda: packpipe.static_memory(1e9, zero=4), r"ZeRO stage \(zero / --zero\) must be 0, 1, 2 or 3, found 4"),
    (lambda: packpipe.plan_batch(gpt(), [100, 200], shape=packpipe.PipelineShape(stages=5)),
     r"do not divide into 5 virtual stages .*set layers_per_stage \(--layers-per-stage\) or an uneven split "
     r"\(stage_layers / --layer-split\)"),
    (lambda: packpipe.plan_batch(gpt(), [100] * 2, shape=packpipe.PipelineShape(stages=4, chunks=2),
                                 schedule="interleaved-1f1b"),
     r"allow a fallback to the search, schedule_fallback=True / --schedule-fallback"),
    (lambda: packpipe.plan_batch(gpt(), [100, 200], schedule="zero-bubble", split_backward=False),
     r"which split_backward=False \(--no-split-backward\) forbids"),
    (lambda: packpipe.plan_batch(gpt(), [100, 200], schedule="gpipe", schedule_family="1f1b"),
     r"not in the required family '1f1b' \(schedule_family / --schedule-family\)"),
    (lambda: packpipe.plan_batch(gpt(), [100, 200], baselines=True, baseline_mbs=[0]),
     r"\(entry 0 of baseline_mbs / --baseline-mbs\)"),
    (lambda: packpipe.plan_batch(gpt(), [100, 200], dtype="int32"), r"dtype \(--dtype\): activations are"),
    (lambda: packpipe.plan_batch(_t5(), [100, 200], [10, 20], tied_embedding=True),
     r"plan without tied_embedding \(--tied-embedding\)"),
    (lambda: packpipe.plan_batch(gpt(), [100, 200], shape=packpipe.PipelineShape(stages=4, memory_mb=1000)),
     r"or a larger memory limit \(memory_mb / --memory-mb;"),
])
def test_messages_name_what_to_set_as_python_and_the_cli_spell_it(call, message):
    with pytest.raises(ValueError, match=message) as e:
        call()
    assert not CPP_SPELLINGS.search(str(e.value)), str(e.value)


class _Wrong:
    def __repr__(self):
        return "<wrong>"


def test_an_argument_of_the_wrong_type_is_named_by_every_native_entry_point():
    """Every function, constructor and static method of the core with one signature: an object of no
    use in its first argument is a TypeError naming the function and that argument, never pybind11's
    dump of the signature (a sweep, so that a new entry point is covered too)."""
    checked = 0
    entries = [(n, getattr(packpipe, n)) for n, v in vars(_core).items()
               if not n.startswith("_") and type(v).__name__ == "builtin_function_or_method"]
    for cname, cls in vars(_core).items():
        if isinstance(cls, type) and not cname.startswith("_"):
            entries.append((cname, cls))
            entries += [(f"{cname}.{a}", getattr(cls, a)) for a, m in vars(cls).items() if isinstance(m, staticmethod)]
    for where, fn in entries:
        native = inspect.unwrap(fn.__init__ if isinstance(fn, type) else fn)
        doc = (native.__doc__ or "").strip().splitlines()
        if not doc or "(*args, **kwargs)" in doc[0]:  # overloaded: pybind's message lists the forms
            continue
        params = [p for p in parameters(native) if p != "self"]
        if not params:
            continue
        with pytest.raises(TypeError) as e:
            fn(_Wrong())
        text = str(e.value)
        assert "incompatible" not in text and "Invoked with" not in text, (where, text)
        # the wrapper's message, or the binding's own check naming the argument
        assert (text.startswith(f"{where}: {params[0]} must be ") and "found _Wrong <wrong>" in text) or \
            text.startswith(f"{where}: missing argument") or text.startswith(f"{params[0]}: ") or \
            "missing 1 required positional argument" in text or \
            re.match(rf"{re.escape(where)}: takes 0 positional argument\(s\), found 1 \(keyword-only: {params[0]}", text), \
            (where, text)
        checked += 1
    assert checked >= 20, checked
    # keywords and methods of an instance
    with pytest.raises(TypeError, match=r"^plan_epoch: seq_policy must be str, found NoneType None$"):
        packpipe.plan_epoch(gpt(), _demo(),
                            iterations=1, seq_policy=None)
    problem = packpipe.ScheduleProblem(gpt(), [(1, 128), (1, 256)], shape=packpipe.PipelineShape(stages=2))
    with pytest.raises(TypeError, match=r"^ScheduleProblem.search: margin must be float, found str 'x'$"):
        problem.search(margin="x")
    with pytest.raises(TypeError, match=r"^plan_epoch: unknown keyword argument 'bogus' \(the keywords are cost_model"):
        packpipe.plan_epoch(gpt(), _demo(), bogus=1)
    assert problem.search(margin=0.0).feasible  # the right types still reach the core


def _demo():
    import os
    return packpipe.MultiTaskDataset(os.path.join(os.path.dirname(__file__), "..", "..", "data", "demo", "manifest.json"))


def test_a_memory_limit_over_the_device_is_refused():
    # Plans under a limit the device does not have would be called feasible and could not run.
    with pytest.raises(ValueError, match=r"memory limit \(memory_mb / --memory-mb\) of 50000 MB is above the 40000 MB "
                                         r"of the device \(A100-40GB\)"):
        packpipe.plan_batch(packpipe.CostModel("gpt-1.3b", "A100-40GB"), [100, 200],
                            shape=packpipe.PipelineShape(stages=2, memory_mb=50000))


def test_hostile_round_inputs_are_refused_by_name(tmp_path):
    """Inputs a hostile round found crashing or passing silently: each is refused naming what is wrong."""
    cm = packpipe.CostModel("gpt-350m", "A100-80GB")
    shape = packpipe.PipelineShape(stages=2)
    plan = packpipe.plan_batch(cm, [10, 20], shape=shape).plans[0]
    assert json.loads(plan.to_json(indent=64))["ranks"] == 2
    for indent in (65, 5000, 10**6):  # (a fixed buffer was read past its end: garbage, then SIGSEGV)
        with pytest.raises(ValueError, match=rf"indent must be in \[-1, 64\].*found {indent}"):
            plan.to_json(indent=indent)
    with pytest.raises(ValueError, match=r"rank must be -1 \(every rank\) or one of the plan's 2 ranks .* found 99"):
        plan.to_json(rank=99)
    # A device whose figures make a time infinite: an error naming them, not every sample dropped.
    device = dict(name="slow", peak_tflops=1e-300, memory_gb=16.0, hbm_gbps=1000.0, intra_node_gbps=100.0,
                  intra_node_latency_us=10.0, inter_node_gbps=10.0, inter_node_latency_us=20.0, gpus_per_node=8)
    (tmp_path / "slow.json").write_text(json.dumps(device))
    slow = packpipe.CostModel("gpt-350m", str(tmp_path / "slow.json"))
    for call in (lambda: packpipe.partition(slow, [100, 200, 50, 300], shape=shape),
                 lambda: packpipe.plan_batch(slow, [100, 200, 50, 300], shape=shape)):
        with pytest.raises(RuntimeError, match=r"gives a forward of inf ms.*check the device's figures \(peak_tflops"):
            call()
    # ScheduleProblem.from_costs: every time and size in [0, 1e15], a finite limit, a bounded rank count.
    F = np.ones((4, 2))
    for kw, message in [(dict(forward_ms=F * 1e308, backward_ms=F), r"forward_ms\[0, 0\] must be in \[0, 1e\+15\]"),
                        (dict(forward_ms=F, backward_ms=F, transfer_ms=np.full((4, 2), np.nan)), r"transfer_ms\[0, 0\]"),
                        (dict(forward_ms=F, backward_ms=F, static_bytes=np.full(2, np.nan)), r"static_bytes\[0\]"),
                        (dict(forward_ms=F, backward_ms=F, stored_bytes=-F), r"stored_bytes\[0, 0\] .* found -1"),
                        (dict(forward_ms=F, backward_ms=F, memory_limit_bytes=float("nan")), "memory_limit_bytes"),
                        (dict(forward_ms=F, backward_ms=F, ranks=2**40), r"ranks must be in \[1, 65536\]")]:
        with pytest.raises(ValueError, match=message):
            packpipe.ScheduleProblem.from_costs(**{"ranks": 2, **kw})
    # More loss tokens than a sample has.
    with pytest.raises(ValueError, match=r"loss_tokens\[0\] is 105, more than the 100 tokens of sample 0"):
        packpipe.plan_batch(cm, [100, 200, 300], shape=shape, loss_tokens=np.array([105, 205, 305]))
    # A profile's NaN would read back as "not measured"; a wrong type names its point and field.
    point = ["encoder", 1, "none", 0, 1, 64, 0, 1.0, 1.0, None, None]
    for k, value, message in [(7, float("nan"), r"points\[0\] fwd_ms must be finite"),
                              (1, "x", r"points\[0\] tp: expected an integer, found 'x'"),
                              (8, 1e308, r"backward time \(ms\) is 1e\+308; expected a time in \(0, 1e\+09\] ms"),
                              (9, 1e30, r"stored activation bytes is 1e\+30; expected a value in \[0, 1e\+18\]")]:
        bad = list(point)
        bad[k] = value
        with pytest.raises((ValueError, RuntimeError), match=message):
            packpipe.write_profile(str(tmp_path / "p.json"), [tuple(bad)], model="gpt-350m")
        assert not (tmp_path / "p.json").exists()


def test_plan_file_writer_refuses_its_inputs(tmp_path):
    """PlanFileWriter(inputs=): a path that is the manifest or a dataset file is refused before anything is written;
    a pathlib.Path is taken."""
    import shutil
    demo = tmp_path / "demo"
    shutil.copytree(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                 "data", "demo"), demo)
    ds = packpipe.MultiTaskDataset(str(demo / "short.json"))
    before = {f: open(f, "rb").read() for f in packpipe.dataset_files(ds) if os.path.exists(f)}
    for path, inputs in [(demo / "short.json", ds), (demo / "demo_define_inputs_document.bin", ds),
                         (str(demo / "short.json"), [str(demo / "short.json")])]:
        with pytest.raises(ValueError, match="PlanFileWriter path .* is the input"):
            packpipe.PlanFileWriter(path, inputs=inputs)
    assert {f: open(f, "rb").read() for f in before} == before
    with packpipe.PlanFileWriter(tmp_path / "plans.ppln", inputs=ds):
        pass
    assert (tmp_path / "plans.ppln").exists()


def test_refs_into_a_dataset_are_checked_against_its_lengths_and_paths_may_be_pathlike():
    """plan_batch(dataset=, refs=): planned tokens past a sample's end are refused at the call, naming the ref
    (before, only assembling the micro-batch noticed); MultiTaskDataset takes a pathlib.Path."""
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    ds = packpipe.MultiTaskDataset(root / "data" / "demo" / "short.json")
    cm = packpipe.CostModel("gpt-350m", "A100-80GB")
    with pytest.raises(ValueError, match=r"refs\[0\] = \(0, 0, offset 0\): input_lengths\[0\] is 5000, but the sample "
                                         r"has \d+ tokens from that offset"):
        packpipe.plan_batch(cm, [5000, 20], shape=packpipe.PipelineShape(stages=2), refs=[(0, 0), (0, 1)], dataset=ds)
    inputs, targets = ds.lengths(0)  # the samples' own tokens plan
    own = [int(inputs[k]) + int(targets[k]) for k in (0, 1)]
    r = packpipe.plan_batch(cm, own, shape=packpipe.PipelineShape(stages=2), refs=[(0, 0), (0, 1)], dataset=ds)
    assert r.samples == 2


def test_measurement_and_profile_writers_refuse_their_inputs(tmp_path):
    """write_measurements and write_profile take inputs= (as write_file_atomic and PlanFileWriter do) and refuse a
    path that is one of them, through a hard link too, leaving it as it was; both take os.PathLike."""
    import pathlib
    ms = packpipe.MeasurementSet()
    ms.model = "gpt-350m"
    src = tmp_path / "measured.jsonl"
    packpipe.write_measurements(src, ms)  # a pathlib.Path
    before = src.read_bytes()
    os.link(src, tmp_path / "linked.jsonl")
    for out in (src, str(src), tmp_path / "linked.jsonl"):
        with pytest.raises(ValueError, match="write_measurements path .* is the input"):
            packpipe.write_measurements(out, ms, inputs=[str(src)])
    assert src.read_bytes() == before
    packpipe.write_measurements(tmp_path / "other.jsonl", ms, inputs=[str(src)])
    assert packpipe.read_measurements(str(tmp_path / "other.jsonl")).model == "gpt-350m"
    point = ("encoder", 1, "none", 0, 1, 128, 0, 1.0, 2.0, None, None)
    prof = tmp_path / "p.json"
    packpipe.write_profile(pathlib.Path(prof), [point], model="gpt-350m")
    before = prof.read_bytes()
    with pytest.raises(ValueError, match="write_profile path .* is the input"):
        packpipe.write_profile(prof, [point, point], model="gpt-350m", inputs=prof)
    assert prof.read_bytes() == before
    with pytest.raises(TypeError, match="path"):
        packpipe.write_profile(3, [point])


def test_second_hostile_round_messages(tmp_path):
    """A directory as a manifest is named as one (it read as malformed JSON); a non-finite iteration time says
    finite (it said 'must be positive, found inf')."""
    (tmp_path / "m.json").mkdir()
    with pytest.raises(RuntimeError, match="m.json': is a directory \\(expected a JSON file\\)"):
        packpipe.MultiTaskDataset(str(tmp_path / "m.json"))
    with pytest.raises(ValueError, match="iteration time must be a finite number > 0 \\(seconds\\), found inf"):
        packpipe.throughput_report(1e15, 512, 512 * 2048, float("inf"), 4, "A100-40GB")

"""Integer arguments, module-wide: no bound function takes a native C++ integer (pybind11 would refuse
-1, 2**64 or 2.7 with its "incompatible function arguments" signature dump); each is converted by the
one checked helper of bindings/bind.h, and -1 (where unsigned), 2**64, 2**70, True and 2.7 raise a
ValueError that names the argument."""
import inspect
import pathlib
import re

import numpy as np
import pytest

import packpipe
import packpipe.runtime
from packpipe import _core

DEMO = pathlib.Path(__file__).resolve().parents[2] / "data" / "demo"
NATIVE_INT = re.compile(r"(?<![\w.])int(?![\w])")  # int, List[int], Optional[int]; not numpy.int32
CHECKED = "typing.SupportsIndex"  # what a parameter converted by int_of shows


def split_params(text):
    """The parameters of a signature's argument list, split at top-level commas."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[("
        depth -= ch in "])"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + ([cur.strip()] if cur.strip() else [])


def bound_callables():
    """(qualified name, function) of every function, method, constructor and property setter of the
    native modules, each function once (an inherited method is its base class's)."""
    seen, out = set(), []

    def visit(obj, prefix, depth):
        for name, value in sorted(vars(obj).items()):
            if inspect.isclass(value) and value.__module__.startswith("packpipe") and depth < 2:
                visit(value, f"{prefix}{name}.", depth + 1)
                continue
            fn = value.fset if isinstance(value, property) else value
            if fn is None or not callable(fn) or id(fn) in seen:
                continue
            seen.add(id(fn))
            out.append((f"{prefix}{name}", fn))

    visit(_core, "", 0)
    visit(_core._runtime, "runtime.", 0)
    return out


def parameters():
    """(qualified name, parameter, annotation) of every parameter of every overload."""
    for qual, fn in bound_callables():
        for line in (getattr(fn, "__doc__", None) or "").splitlines():
            m = re.match(r"^(?:\d+\. )?\w*\((.*)\) -> ", line.strip())
            if not m:
                continue
            for p in split_params(m.group(1)):
                pm = re.match(r"\*?(\w+): (.+?)(?: = .*)?$", p)
                if pm and pm.group(1) != "self":
                    yield qual, pm.group(1), pm.group(2)


def test_no_bound_function_takes_a_native_integer():
    native = sorted({f"{q}({p}: {a})" for q, p, a in parameters() if NATIVE_INT.search(a)})
    assert not native, ("take these as py::object (int_of / int_list_arg) or define them with def_ints "
                        f"(bindings/bind.h): {native}")
    assert sum(1 for _, _, a in parameters() if a == CHECKED) > 40  # the scan found the converted ones


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One object of each kind the bound functions take."""
    tmp = tmp_path_factory.mktemp("ints")
    w = type("World", (), {})()
    w.ds = packpipe.MultiTaskDataset(str(DEMO / "manifest.json"))
    w.ix = packpipe.IndexedDataset(str(DEMO / "demo_man_text"))
    w.gpt = packpipe.CostModel("gpt-350m", "A100-40GB")
    w.shape = packpipe.PipelineShape(stages=2)
    its = list(packpipe.plan_epoch(w.gpt, w.ds, shape=w.shape, global_batch_tokens=2000, iterations=2))
    w.plan = its[0].result.plans[0]
    w.path = str(tmp / "e.plans")
    with packpipe.PlanFileWriter(w.path) as pw:
        for it in its:
            pw.append(it.result.plans[0])
    w.reader = packpipe.PlanFileReader(w.path)
    w.tmp = tmp
    w.problem = packpipe.ScheduleProblem(w.gpt, [(1, 128)] * 4, shape=w.shape)
    w.schedule = w.problem.simulate("1f1b")
    w.packing = packpipe.pack(np.array([5, 6, 7], np.uint32), 16)
    w.sampler = lambda: packpipe.Sampler(w.ds, global_batch_tokens=2000)
    w.batch = w.sampler().next_batch()
    w.builder = packpipe.IndexedDatasetBuilder(str(tmp / "b"), np.uint16)
    return w


# name -> (the integer parameter's name, a call with value v). Every parameter shown as
# typing.SupportsIndex is here (test_every_checked_parameter_is_swept), and the integer parameters
# taken as objects.
CASES = {
    "CostModel.query(mbs)": lambda w, v: w.gpt.query(mbs=v, seq=128),
    "CostModel.query(seq)": lambda w, v: w.gpt.query(seq=v),
    "CostModel.query(dec_seq)": lambda w, v: w.gpt.query(seq=128, dec_seq=v),
    "CostModel.query(tp)": lambda w, v: w.gpt.query(seq=128, tp=v),
    "CostModel.query(layers)": lambda w, v: w.gpt.query(seq=128, layers=v),
    "CostModel.stage_cost(encoder_layers)": lambda w, v: w.gpt.stage_cost(encoder_layers=v, seq=128),
    "CostModel.stage_cost(decoder_layers)": lambda w, v: w.gpt.stage_cost(decoder_layers=v, seq=128),
    "CostModel.stage_cost(mbs)": lambda w, v: w.gpt.stage_cost(encoder_layers=1, mbs=v, seq=128),
    "CostModel.stage_cost(seq)": lambda w, v: w.gpt.stage_cost(encoder_layers=1, seq=v),
    "CostModel.stage_cost(dec_seq)": lambda w, v: w.gpt.stage_cost(encoder_layers=1, seq=128, dec_seq=v),
    "CostModel.stage_cost(tp)": lambda w, v: w.gpt.stage_cost(encoder_layers=1, seq=128, tp=v),
    "CostModel.stage_static_memory(encoder_layers)": lambda w, v: w.gpt.stage_static_memory(encoder_layers=v),
    "CostModel.stage_static_memory(decoder_layers)": lambda w, v: w.gpt.stage_static_memory(decoder_layers=v),
    "CostModel.stage_static_memory(tp)": lambda w, v: w.gpt.stage_static_memory(encoder_layers=1, tp=v),
    "CostModel.stage_static_memory(dp)": lambda w, v: w.gpt.stage_static_memory(encoder_layers=1, dp=v),
    "CostModel.stage_static_memory(zero)": lambda w, v: w.gpt.stage_static_memory(encoder_layers=1, zero=v),
    "CostModel.all_reduce_ms(n)": lambda w, v: w.gpt.all_reduce_ms(1e6, n=v),
    "CostModel.all_gather_ms(n)": lambda w, v: w.gpt.all_gather_ms(1e6, n=v),
    "CostModel.reduce_scatter_ms(n)": lambda w, v: w.gpt.reduce_scatter_ms(1e6, n=v),
    "static_memory(dp)": lambda w, v: packpipe.static_memory(1e9, dp=v),
    "static_memory(zero)": lambda w, v: packpipe.static_memory(1e9, zero=v),
    "bigscience_params(seq)": lambda w, v: packpipe.bigscience_params("gpt-350m", seq=v),
    "bigscience_tflops_per_gpu(seq)": lambda w, v: packpipe.bigscience_tflops_per_gpu(1e9, v, 8, 1.0, 8),
    "bigscience_tflops_per_gpu(global_batch)": lambda w, v: packpipe.bigscience_tflops_per_gpu(1e9, 128, v, 1.0, 8),
    "bigscience_tflops_per_gpu(gpus)": lambda w, v: packpipe.bigscience_tflops_per_gpu(1e9, 128, 8, 1.0, v),
    "bigscience_tflops_per_gpu(factor)": lambda w, v: packpipe.bigscience_tflops_per_gpu(1e9, 128, 8, 1.0, 8, v),
    "training_flops(mbs)": lambda w, v: packpipe.training_flops("gpt-350m", v, 128),
    "training_flops(seq)": lambda w, v: packpipe.training_flops("gpt-350m", 1, v),
    "training_flops(dec_seq)": lambda w, v: packpipe.training_flops("gpt-350m", 1, 128, dec_seq=v),
    "throughput_report(gpus)": lambda w, v: packpipe.throughput_report(1e12, 8, 1e4, 1.0, v, "A100-40GB"),
    "IndexedDataset.get(idx)": lambda w, v: w.ix.get(v),
    "IndexedDataset.get(offset)": lambda w, v: w.ix.get(0, offset=v),
    "IndexedDataset.get(length)": lambda w, v: w.ix.get(0, length=v),
    "IndexedDataset.__getitem__(index)": lambda w, v: w.ix[v],
    "IndexedDataset.verify(max_problems)": lambda w, v: w.ix.verify(max_problems=v),
    "IndexedDatasetBuilder.add_item(mode)": lambda w, v: w.builder.add_item(np.array([1], np.uint16), mode=v),
    "MultiTaskDataset.task_size(task)": lambda w, v: w.ds.task_size(v),
    "MultiTaskDataset.encoder_decoder(task)": lambda w, v: w.ds.encoder_decoder(v),
    "MultiTaskDataset.has_targets(task)": lambda w, v: w.ds.has_targets(v),
    "MultiTaskDataset.lengths(task)": lambda w, v: w.ds.lengths(v),
    "MultiTaskDataset.sample(task)": lambda w, v: w.ds.sample(v, 0),
    "MultiTaskDataset.sample(index)": lambda w, v: w.ds.sample(0, v),
    "compress_dataset(level)": lambda w, v: packpipe.compress_dataset(str(w.tmp / "none"), level=v),
    "compress_dataset(frame_size)": lambda w, v: packpipe.compress_dataset(str(w.tmp / "none"), frame_size=v),
    "Sampler.__init__(seed)": lambda w, v: packpipe.Sampler(w.ds, seed=v, global_batch_tokens=2000),
    "Sampler.__init__(global_batch_tokens)": lambda w, v: packpipe.Sampler(w.ds, global_batch_tokens=v),
    "Sampler.__init__(epoch)": lambda w, v: packpipe.Sampler(w.ds, global_batch_tokens=2000, epoch=v),
    "Sampler.set_epoch(epoch)": lambda w, v: w.sampler().set_epoch(v),
    "Prefetcher.__init__(depth)": lambda w, v: packpipe.Prefetcher(w.ds, w.sampler(), depth=v),
    "shard_batch(rank)": lambda w, v: packpipe.shard_batch(w.batch, w.ds, v, 2),
    "shard_batch(world)": lambda w, v: packpipe.shard_batch(w.batch, w.ds, 0, v),
    "Packing.row(r)": lambda w, v: w.packing.row(v),
    "Plan.instructions(rank)": lambda w, v: w.plan.instructions(v),
    "Plan.to_json(indent)": lambda w, v: w.plan.to_json(indent=v),
    "Plan.to_json(rank)": lambda w, v: w.plan.to_json(rank=v),
    "Plan.world_rank(replica)": lambda w, v: w.plan.world_rank(v, 0),
    "Plan.world_rank(rank)": lambda w, v: w.plan.world_rank(0, v),
    "PlanFileReader.read(iteration)": lambda w, v: w.reader.read(v),
    "PlanFileReader.read(replica)": lambda w, v: w.reader.read(0, v),
    "PlanFileReader.__getitem__(position)": lambda w, v: w.reader[v],
    "PlanFileWriter.expect_iterations(first_iteration)":
        lambda w, v: packpipe.PlanFileWriter(str(w.tmp / "x.plans")).expect_iterations(v, 1),
    "PlanFileWriter.expect_iterations(count)":
        lambda w, v: packpipe.PlanFileWriter(str(w.tmp / "x.plans")).expect_iterations(0, v),
    "Schedule.ops(rank)": lambda w, v: w.schedule.ops(v),
    "Schedule.op_list(rank)": lambda w, v: w.schedule.op_list(v),
    "ScheduleProblem.search(local_rounds)": lambda w, v: w.problem.search(local_rounds=v),
    "ScheduleProblem.search(seed)": lambda w, v: w.problem.search(seed=v),
    "ScheduleProblem.simulate(order)": lambda w, v: w.problem.simulate("1f1b", order=[0, 1, 2, v]),
    "ScheduleProblem.from_costs(ranks)": lambda w, v: packpipe.ScheduleProblem.from_costs([[1.0]], [[2.0]], ranks=v),
    "plan_batch(seed)": lambda w, v: packpipe.plan_batch(w.gpt, [10, 20], shape=w.shape, seed=v),
    "plan_batch(iteration)": lambda w, v: packpipe.plan_batch(w.gpt, [10, 20], shape=w.shape, iteration=v),
    "plan_batch(baseline_mbs)": lambda w, v: packpipe.plan_batch(w.gpt, [10, 20], shape=w.shape, baseline_mbs=[1, v]),
    "plan_epoch(global_batch_tokens)": lambda w, v: packpipe.plan_epoch(w.gpt, w.ds, global_batch_tokens=v),
    "plan_epoch(seed)": lambda w, v: packpipe.plan_epoch(w.gpt, w.ds, global_batch_tokens=2000, seed=v),
    "plan_epoch(epoch)": lambda w, v: packpipe.plan_epoch(w.gpt, w.ds, global_batch_tokens=2000, epoch=v),
    "plan_epoch(iterations)": lambda w, v: packpipe.plan_epoch(w.gpt, w.ds, global_batch_tokens=2000, iterations=v),
    "plan_epoch(depth)": lambda w, v: packpipe.plan_epoch(w.gpt, w.ds, global_batch_tokens=2000, depth=v),
    "RankLoader(first_iteration)": lambda w, v: packpipe.RankLoader(w.ds, plan_file=w.path, first_iteration=v),
    "RankLoader(iterations)": lambda w, v: packpipe.RankLoader(w.ds, plan_file=w.path, iterations=v),
    "RankLoader(replica)": lambda w, v: packpipe.RankLoader(w.ds, plan_file=w.path, replica=v),
    "RankLoader(rank)": lambda w, v: packpipe.RankLoader(w.ds, plan_file=w.path, rank=v),
    "RankLoader(depth)": lambda w, v: packpipe.RankLoader(w.ds, plan_file=w.path, depth=v),
    "RankLoader(ignore_index)": lambda w, v: packpipe.RankLoader(w.ds, plan_file=w.path, ignore_index=v),
    "RankLoader(pad_id)": lambda w, v: packpipe.RankLoader(w.ds, plan_file=w.path, pad_id=v),
    "RankLoader(decoder_start_id)": lambda w, v: packpipe.RankLoader(w.ds, plan_file=w.path, decoder_start_id=v),
    "assemble_microbatch(mb)": lambda w, v: packpipe.assemble_microbatch(w.ds, w.plan, v, 0),
    "assemble_microbatch(stage)": lambda w, v: packpipe.assemble_microbatch(w.ds, w.plan, 0, v),
    "assemble_microbatch(ignore_index)": lambda w, v: packpipe.assemble_microbatch(w.ds, w.plan, 0, 0, ignore_index=v),
    "assemble_microbatch(pad_id)": lambda w, v: packpipe.assemble_microbatch(w.ds, w.plan, 0, 0, pad_id=v),
    "assemble_microbatch(decoder_start_id)":
        lambda w, v: packpipe.assemble_microbatch(w.ds, w.plan, 0, 0, decoder_start_id=v),
    "Measurement.peer": lambda w, v: setattr(packpipe.Measurement(), "peer", v),
    "runtime.Buffer.__init__(nbytes)": lambda w, v: packpipe.runtime.Buffer(v),
    "runtime.Buffer.__init__(data)": lambda w, v: packpipe.runtime.Buffer(8, data=v),
    "runtime.Buffer.__init__(device)": lambda w, v: packpipe.runtime.Buffer(8, device=v),
    "runtime.Buffer.host(nbytes)": lambda w, v: packpipe.runtime.Buffer.host(v),
    "runtime.Transport.__init__(rank)": lambda w, v: packpipe.runtime.Transport(v, 2),
    "runtime.Transport.__init__(ranks)": lambda w, v: packpipe.runtime.Transport(0, v),
}


NONE_ALLOWED = {"RankLoader(rank)"}  # None: every rank


def test_every_checked_parameter_is_swept():
    swept = {k.replace("CalibratedCostModel.", "CostModel.") for k in CASES}
    missing = sorted({f"{q}({p})" for q, p, a in parameters() if a == CHECKED} - swept)
    assert not missing, f"add them to CASES: {missing}"


@pytest.mark.parametrize("case, value", [(c, v) for c in sorted(CASES)
                                          for v in (2 ** 64, 2 ** 70, -2 ** 70, True, 2.7, "3", None)
                                          if not (v is None and c in NONE_ALLOWED)])
def test_bad_integers_raise_a_value_error_naming_the_argument(world, case, value):
    arg = re.search(r"\((\w+)\)$", case)
    arg = arg.group(1) if arg else case.rsplit(".", 1)[1]
    with pytest.raises(ValueError) as e:
        CASES[case](world, value)
    assert arg in str(e.value), str(e.value)
    assert "incompatible function arguments" not in str(e.value)


@pytest.mark.parametrize("case", sorted(CASES))
def test_minus_one_is_never_a_signature_dump(world, case):
    try:
        CASES[case](world, -1)
    except TypeError as e:
        pytest.fail(f"{case}: {e}")
    except (ValueError, IndexError, RuntimeError) as e:
        assert "incompatible function arguments" not in str(e)


def test_numpy_integers_are_integers(world):
    assert world.reader.read(np.uint64(1)).iteration == 1
    assert world.ds.task_size(np.int32(0)) == world.ds.task_size(0)
    assert world.gpt.query(mbs=np.int64(2), seq=np.uint16(128)).forward_ms > 0

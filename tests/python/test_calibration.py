"""Calibration from Python: measurements built, written and read, a calibration fitted, saved and
rebuilt from its bytes (as a trainer broadcasts it from rank 0), applied over the cost model, and
measurements of a plan executed by the runtime."""
import copy
import json
import pickle
import random

import numpy as np
import pytest

import packpipe
from packpipe import runtime as rt
from test_runtime import PayloadHandler, plan_of

CM = packpipe.CostModel("gpt-350m", "A100-40GB")


def synthetic(a=1.3, b=0.2, seed=7):
    rng = random.Random(seed)
    out = []
    for layers in (1, 2, 4):
        for rows in (1, 2, 4, 8):
            for seq in (128, 256, 512, 1024, 2048):
                for op in ("F", "B"):
                    m = packpipe.Measurement(op, encoder_layers=layers, rows=rows, seq=seq, index=len(out))
                    m.ms = (a * packpipe.predict_ms(CM, m) + b) * (1 + rng.gauss(0, 0.002))
                    out.append(m)
    return packpipe.MeasurementSet(out, model="gpt-350m", device="A100-40GB", source="test")


def test_measurements_are_built_checked_and_round_trip(tmp_path):
    m = packpipe.Measurement("send", encoder_layers=2, rows=3, seq=64, bytes=1 << 20, ms=0.5, peer=1)
    assert (m.op, m.rows, m.bytes, m.peer, m.tokens) == ("send", 3, 1 << 20, 1, 192.0)
    assert copy.deepcopy(m) == m and m != packpipe.Measurement("recv")
    with pytest.raises(ValueError, match="rows"):
        packpipe.Measurement("F", rows=-1)
    with pytest.raises(ValueError, match="measured op"):
        packpipe.Measurement("Q")
    s = synthetic()
    s.iterations = [packpipe.IterationMeasurement(iteration=0, measured_ms=12.5, predicted_ms=10.0)]
    path = str(tmp_path / "m.jsonl")
    packpipe.write_measurements(path, s)
    r = packpipe.read_measurements(path)
    assert len(r) == len(s) and r.ops == s.ops and r.iterations == s.iterations and r.model == "gpt-350m"
    assert packpipe.parse_measurements(s.to_jsonl()).ops == s.ops
    assert pickle.loads(pickle.dumps(s)).ops == s.ops
    with pytest.raises(RuntimeError, match=r"x\.jsonl line 2: field 'op': unknown op 'Z'"):
        packpipe.parse_measurements(s.to_jsonl().replace('"op":"F"', '"op":"Z"', 1), "x.jsonl")
    with pytest.raises(RuntimeError, match="line 1: field 'version': expected 1, found 3"):
        packpipe.parse_measurements(s.to_jsonl().replace('"version":1', '"version":3', 1))


def test_a_calibration_is_fitted_saved_and_rebuilt_from_its_bytes(tmp_path):
    s = synthetic()
    cal = packpipe.fit_calibration(CM, s, packpipe.FitOptions())
    f = cal.compute[0]
    assert f["op"] == "F" and f["fitted"] and abs(f["global"]["a"] - 1.3) < 0.026 and abs(f["global"]["b"] - 0.2) < 0.004
    assert cal.base["fingerprint"] == packpipe.cost_model_fingerprint(CM) and cal.measurements == len(s)
    assert [t["link"] for t in cal.transfers] == ["intra", "inter"]
    # any order: the same bytes; the file form round-trips exactly
    ops = s.ops
    random.Random(1).shuffle(ops)
    text = cal.to_json()
    assert packpipe.fit_calibration(CM, ops).to_json() == text
    # rank 0 broadcasts the bytes, every rank builds the same model
    model = packpipe.CalibratedCostModel(CM, packpipe.Calibration.from_json(text, "broadcast from rank 0"))
    assert model.calibration.to_json() == text and model.base.describe() == CM.describe()
    m = s.ops[5]
    assert packpipe.predict_ms(model, m) == pytest.approx(1.3 * packpipe.predict_ms(CM, m) + 0.2, rel=0.01)
    path = str(tmp_path / "cal.json")
    cal.save(path)
    assert packpipe.Calibration.load(path).to_json() == text and packpipe.Calibration.load(path).source == path
    from_file = packpipe.CostModel("gpt-350m", "A100-40GB", calibration=path)
    assert "calibrated by " + path in from_file.describe() and CM.calibration is None
    assert packpipe.predict_ms(from_file, m) == packpipe.predict_ms(model, m)
    # a calibrated model plans with its times
    lens = np.random.default_rng(0).integers(16, 1000, size=64).astype(np.uint32)
    shape = packpipe.PipelineShape(stages=2)
    slow = packpipe.plan_batch(model, lens, shape=shape).packpipe.iteration_ms
    assert slow > 1.25 * packpipe.plan_batch(CM, lens, shape=shape).packpipe.iteration_ms


def test_refusals_name_what_is_wrong(tmp_path):
    cal = packpipe.fit_calibration(CM, synthetic())
    other = packpipe.CostModel("gpt-1.3b", "A100-40GB")
    with pytest.raises(ValueError, match="fitted over gpt-350m on A100-40GB.*this cost model is gpt-1.3b"):
        packpipe.CalibratedCostModel(other, cal)
    with pytest.raises(ValueError, match="already calibrated"):
        packpipe.fit_calibration(packpipe.CalibratedCostModel(CM, cal), synthetic())
    with pytest.raises(RuntimeError, match="bytes: /version: expected 1 to 2, found 3"):
        packpipe.Calibration.from_json(cal.to_json().replace('"version": 1', '"version": 3'), "bytes")
    with pytest.raises(ValueError, match=r"outlier_mads \(--outlier-mads\) must be in"):
        packpipe.FitOptions(outlier_mads=0.5)
    o = packpipe.FitOptions()
    with pytest.raises(ValueError, match="transfer_quantile"):
        o.transfer_quantile = 3.0
    assert o.transfer_quantile == 0.1
    bad = synthetic().ops
    bad[3].ms = float("nan")
    with pytest.raises(ValueError, match=r"measurement 3 \(B, .*ms must be a finite duration, found nan"):
        packpipe.fit_calibration(CM, bad)
    bad[3].ms, bad[3].decoder_layers, bad[3].dec_seq = 1.0, 2, 16
    with pytest.raises(ValueError, match="measurement 3 .*refuses its shape"):
        packpipe.fit_calibration(CM, bad)


def test_measurements_of_a_plan_executed_by_the_runtime():
    for plan in plan_of(4, 1, "zero-bubble", n=24):
        records = rt.run_local(plan, [PayloadHandler() for _ in range(plan.ranks)], rt.ExecutorOptions(timeout_s=30))
        s = packpipe.measurements_from(plan, [r.times for r in records], tp=1)
        counts = {}
        for m in s.ops:
            counts[m.op] = counts.get(m.op, 0) + 1
        computes = [i for st in plan.streams for i in st if i.is_compute]
        assert counts["F"] == sum(1 for i in computes if i.op == "FWD") == len(plan.microbatches) * plan.vstages
        assert counts.get("I", 0) + counts.get("B", 0) == len(plan.microbatches) * plan.vstages
        assert counts["send"] == counts["recv"] > 0
        assert len(s.iterations) == 1 and s.iterations[0].measured_ms > 0
        # lists of pairs work too; an unrecorded rank leaves the iteration out
        pairs = [[tuple(map(int, t)) for t in r.times] for r in records]
        assert packpipe.measurements_from(plan, pairs).ops == s.ops
        partial = packpipe.measurements_from(plan, [records[0].times, None, [], records[3].times])
        assert not partial.iterations and {m.rank for m in partial.ops} == {0, 3}
        with pytest.raises(ValueError, match=r"times\[1\]: expected \(start_ns, end_ns\) integer pairs"):
            packpipe.measurements_from(plan, [records[0].times, np.zeros((3, 3)), [], []])
        # unsigned times that do not fit a signed 64-bit time are refused, not wrapped to negative ones
        huge = np.full((len(plan.streams[0]), 2), 2**64 - 1, dtype=np.uint64)
        with pytest.raises(ValueError, match=r"times\[0\]\[0\]: 18446744073709551615 ns does not fit"):
            packpipe.measurements_from(plan, [huge, None, [], []])
        ok = np.asarray(records[0].times).astype(np.uint64)  # unsigned but in range: accepted
        assert packpipe.measurements_from(plan, [ok, None, [], []]).ops == \
            packpipe.measurements_from(plan, [records[0].times, None, [], []]).ops
        assert min(m.ms for m in s.ops if m.op in "FBIW") >= 1e-6  # at least the clock's resolution
        ops = s.ops  # a copy: changed, it is assigned back
        ops[0].start_ms = 0.0
        s.ops = ops
        fixed = packpipe.MeasurementSet(s.ops, s.iterations)
        report = packpipe.validate_measurements(CM, fixed)
        assert [e.op for e in report.ops] == ["F", "I", "W", "send", "recv"]
        assert len(report.iterations) == 1 and report.iterations[0].ops == 3 * len(plan.microbatches) * plan.vstages
        plot = json.loads(packpipe.validation_plot_json(report, fixed))
        assert plot["format"] == "packpipe-validation-plot" and len(plot["iterations"]) == 1


def test_schedule_factors_from_python():
    """Iteration lines name their plan's schedule; fit_schedule_factors fits a kind measured at
    least three times (measured / re-simulated makespan); the planner ranks schedules by it."""
    assert packpipe.IterationMeasurement(schedule="1f1b").schedule == "1f1b"
    assert packpipe.IterationMeasurement().schedule == ""
    with pytest.raises(ValueError, match="schedule must be '' .*found 'fast'"):
        packpipe.IterationMeasurement(schedule="fast")
    ops, lines = [], []
    plans = [plan_of(4, 1, kind, n=24, seed=seed)[0] for kind in ("zero-bubble", "1f1b") for seed in range(3)]
    for k, plan in enumerate(plans):
        records = rt.run_local(plan, [PayloadHandler() for _ in range(plan.ranks)], rt.ExecutorOptions(timeout_s=30))
        s = packpipe.measurements_from(plan, [r.times for r in records], iteration=k)
        assert [i.schedule for i in s.iterations] == [plan.schedule]
        for m in s.ops:
            if m.op in ("F", "B", "I", "W"):
                m.ms = packpipe.predict_ms(CM, m)  # the model's own times: the op fit is the identity
                ops.append(m)
        lines.append(s.iterations[0])
    raw = packpipe.validate_measurements(CM, packpipe.MeasurementSet(ops, lines))
    factor = {"zero-bubble": 1.2, "1f1b": 1.05}
    lines = [packpipe.IterationMeasurement(iteration=i.iteration, replica=i.replica, predicted_ms=i.predicted_ms,
                                           measured_ms=c.predicted_ms * factor[i.schedule], schedule=i.schedule)
             for i, c in zip(lines, raw.iterations)]
    mset = packpipe.MeasurementSet(ops, lines)
    text = mset.to_jsonl()
    assert '"schedule":"zero-bubble"' in text
    assert [i.schedule for i in packpipe.parse_measurements(text).iterations] == [i.schedule for i in lines]
    cal = packpipe.fit_schedule_factors(CM, packpipe.fit_calibration(CM, mset), mset)
    got = {f["schedule"]: f["factor"] for f in cal.schedules}
    assert got.keys() == {"1f1b", "zero-bubble"}
    assert got["zero-bubble"] == pytest.approx(1.2, rel=0.01) and got["1f1b"] == pytest.approx(1.05, rel=0.01)
    assert cal.schedule_factor("gpipe") == got["zero-bubble"]  # never measured: the largest
    again = packpipe.Calibration.from_json(cal.to_json(), "broadcast")
    assert again.schedules == cal.schedules
    model = packpipe.CalibratedCostModel(CM, again)
    after = packpipe.validate_measurements(model, mset)
    assert all(abs(c.predicted_ms / c.measured_ms - 1) < 0.01 for c in after.iterations)
    assert [c.schedule for c in after.iterations] == [i.schedule for i in lines]
    # planned with the factors: a zero-bubble plan's makespan is 1.2 x the uncalibrated one's
    lens = np.random.default_rng(0).integers(16, 1000, size=64).astype(np.uint32)
    shape = packpipe.PipelineShape(stages=2)
    zb = packpipe.plan_batch(model, lens, shape=shape, schedule="zero-bubble").plans[0]
    ident = packpipe.CalibratedCostModel(CM, packpipe.fit_calibration(CM, mset))
    plain = packpipe.plan_batch(ident, lens, shape=shape, schedule="zero-bubble").plans[0]
    # the timeline's starts are stretched 1.2x, every op keeps its duration
    assert 1.1 * plain.makespan_ms < zb.makespan_ms <= 1.2 * plain.makespan_ms * (1 + 1e-9)
    assert [round(e - s, 9) for r in zb.timeline for (_, _, _, s, e) in r] == \
        [round(e - s, 9) for r in plain.timeline for (_, _, _, s, e) in r]


def test_nul_characters_and_wrong_types_get_whole_named_errors(tmp_path):
    """A NUL in a path is refused by name (the message stopped at it: "'a"); a NUL quoted from a file is shown as \\0
    (the message ended there); a lone surrogate in written text is UnicodeEncodeError, and fit_calibration's
    measurements of a wrong type a TypeError naming them (both were pybind11's cast error)."""
    with pytest.raises(ValueError, match=r"path: a path cannot hold a NUL character, found 'a\\x00b'"):
        packpipe.write_file_atomic("a\0b", "x")
    with pytest.raises(ValueError, match=r"outputs\['--o'\]: a path cannot hold a NUL"):
        packpipe.check_outputs({"--o": "a\0b"})
    text = synthetic().to_jsonl().replace('"op":"F"', '"op":"F\\u0000x"', 1)
    with pytest.raises(RuntimeError, match=r"unknown op 'F\\0x' \(expected"):
        packpipe.parse_measurements(text, "m.jsonl")
    with pytest.raises(UnicodeEncodeError):
        packpipe.write_file_atomic(str(tmp_path / "o.txt"), "\ud800")
    assert not (tmp_path / "o.txt").exists()
    with pytest.raises(TypeError, match="measurements: expected a MeasurementSet or a sequence of Measurement, found int"):
        packpipe.fit_calibration(CM, 5)
    with pytest.raises(TypeError, match=r"measurements\[1\]: expected a Measurement, found str"):
        packpipe.fit_calibration(CM, [synthetic().ops[0], "F"])

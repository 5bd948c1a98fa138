"""packpipe.torch.Calibrator on real CPU runs of the small GPT: the calibrated plans predict the
measured iteration time better than the analytic model did, every rank switches to the same
calibrated model at the same iteration (identical plans after it), a failed fit ends every rank,
and the loader's state carries the calibration so a resume plans as an uninterrupted run."""
import json
import math
import os

import pytest
import torch

import packpipe
import packpipe.torch as pt
from packpipe import runtime as rt
from packpipe.torch import models

import support
import workers

torch.set_num_threads(1)


def _median(xs):
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])


def _log_errors(cost_model, measurements, keep):
    """|ln(predicted / measured)| of every measured iteration `keep(iteration)` accepts, the
    prediction re-simulated by `cost_model` from the iteration's measured op order."""
    report = packpipe.validate_measurements(cost_model, measurements)
    return [abs(math.log(c.predicted_ms / c.measured_ms)) for c in report.iterations if keep(c.iteration)]


@pytest.mark.timing
def test_calibration_on_real_cpu_runs_reduces_the_iteration_time_error(tmp_path):
    """The calibrated model predicts the measured iteration times far better than the mis-set
    analytic one. Other processes may load the machine, and change how much they do during the run:
    so both models are judged on the same measured iterations (each prediction re-simulated from the
    iteration's measured op order), in log space (a load change of a few times either way moves both
    errors alike instead of flipping the comparison), in the fitted window and after it."""
    cfg = models.GPTConfig(vocab_size=256, hidden=64, layers=4, heads=4, seed=1)
    # A device ten times faster than the CPU presets: the analytic model is clearly off on any machine
    # (on one that happened to match the preset, "calibration helps" would be a coin toss).
    cm = models.cost_model(cfg, str(tmp_path), dict(support.CPU_DEVICE, name="cpu-10x", peak_tflops=0.5, hbm_gbps=200))
    manifest = support.short_manifest(tmp_path)
    warmup, fit_after, after = 1, 8, 8
    loader = pt.PlanLoader(manifest, cost_model=cm, rank=None, iterations=warmup + fit_after + after,
                           shape=packpipe.PipelineShape(stages=2), global_batch_tokens=1500, seed=3,
                           schedule="1f1b", schedule_fallback=True, dtype="fp32")
    saved = tmp_path / "calibration.json"
    cal = pt.Calibrator(loader, fit_after=fit_after, warmup=warmup, save=str(saved))
    model = models.GPT(cfg)
    pipe, rows, reports = None, [], []
    for it in loader:
        if pipe is None:
            stages = {v: model.stage(it.plan.stages[v]) for v in range(it.plan.vstages)}
            pipe = pt.LocalPipeline(stages, models.gpt_loss, lambda ps: torch.optim.SGD(ps, lr=1e-3), timeout_s=120)
        calibrated = cal.cost_model is not cal.base
        r = pipe.run(it)
        rows.append((it.iteration, calibrated, r.predicted_ms, r.measured_ms))
        rep = cal.observe(it, r)
        if rep is not None:
            reports.append(rep)
    boundary = warmup + fit_after - 1
    assert len(reports) == 1 and reports[0].iteration == boundary
    assert [c for _, c, _, _ in rows] == [False] * (warmup + fit_after) + [True] * after
    # Both models on the same measured iterations: the fitted window (what the fit achieved) and the
    # iterations planned after the boundary with the calibration (what it predicts).
    assert cal.cost_model is loader.cost_model and cal.cost_model is not cal.base
    fit = reports[0]
    assert fit.iteration_error_after < fit.iteration_error_before, fit.summary()
    # Every iteration line names its plan's schedule, and the kind measured has its factor (013).
    kinds = {i.schedule for i in cal.measurements.iterations}
    assert kinds <= set(packpipe.schedule_names()) and "1f1b" in kinds, kinds
    assert "1f1b" in fit.schedules, fit.summary()
    # The factor is the median of measured / re-simulated makespan over the fitted 1F1B steps, with
    # the fit's op and transfer times (at least 1): recomputed here from the same measurements.
    ops_only = json.loads(fit.calibration_json)
    ops_only.update(schedules=[], version=1)
    model = packpipe.CalibratedCostModel(cal.base, packpipe.Calibration.from_json(json.dumps(ops_only), "ops only"))
    ratios = [c.measured_ms / c.predicted_ms for c in packpipe.validate_measurements(model, cal.measurements).iterations
              if c.schedule == "1f1b" and c.iteration <= warmup + fit_after and c.measured_ms > 0]
    assert fit.schedules["1f1b"] == pytest.approx(max(1.0, _median(ratios)), rel=1e-12), (fit.schedules, ratios)
    assert "schedule factors 1f1b x" in fit.summary()
    errors = {}
    for window, keep in (("fitted", lambda i: i <= boundary), ("after", lambda i: i > boundary)):
        errors[window] = [_median(_log_errors(m, cal.measurements, keep)) for m in (cal.base, cal.cost_model)]
    print(f"iteration time |ln(predicted / measured)|, analytic and calibrated: {errors}; {fit.summary()}; plan vs "
          f"measured ms {[(round(p), round(m)) for _, _, p, m in rows]}")
    for window, (base_err, cal_err) in errors.items():
        assert base_err > math.log(2), f"{window}: the mis-set device should predict far too fast: {base_err:.2f}"
        assert cal_err < 0.5 * base_err, f"{window}: calibrated {cal_err:.3f} against uncalibrated {base_err:.3f}"
    # The saved file is the calibration the loader plans with, and it round-trips.
    text = saved.read_text()
    assert json.loads(text)["format"] == "packpipe-calibration"
    assert loader.state_dict()["calibration"] == reports[0].calibration_json
    again = packpipe.Calibration.from_json(text, str(saved))
    assert again.to_json() == packpipe.Calibration.from_json(reports[0].calibration_json, "report").to_json()


def test_a_resumed_loader_plans_with_the_saved_calibration(tmp_path):
    cfg = models.GPTConfig(vocab_size=256, hidden=32, layers=2, heads=2, seed=1)
    cm = support.cost_model(cfg, tmp_path)
    manifest = support.short_manifest(tmp_path)

    def loader():
        return pt.PlanLoader(manifest, cost_model=cm, rank=None, iterations=6,
                             shape=packpipe.PipelineShape(stages=2), global_batch_tokens=900, seed=5,
                             schedule="1f1b", schedule_fallback=True, dtype="fp32")

    # A calibration that changes the cost model a lot (forward and backward three times slower):
    # every compute op takes three times its planned duration.
    base = loader()
    first = next(base)
    planned = {(kind, mb, v): end - start for ops in first.plan.timeline for kind, mb, v, start, end in ops}
    synthetic = []
    for r in range(first.plan.ranks):
        times, t = [], 0
        for ins in first.plan.streams[r]:
            if ins.is_compute:
                kind = {"FWD": "F", "BWD": "B", "BWD_I": "I", "BWD_W": "W"}[ins.op]
                d = int(3e6 * planned[(kind, ins.mb, ins.stage)])
            else:
                d = 10_000
            times.append((t, t + d))
            t += d
        synthetic.append(times)
    ops = packpipe.measurements_from(first.plan, synthetic).ops
    calibration = packpipe.fit_calibration(cm, ops, packpipe.FitOptions(regions=False))
    text = calibration.to_json()

    a = loader()
    fps = [rt.plan_fingerprint(next(a).plan) for _ in range(2)]
    a.set_calibration(text)
    state = a.state_dict()
    fps += [rt.plan_fingerprint(it.plan) for it in a]
    b = loader()
    b.load_state_dict(state)
    assert [rt.plan_fingerprint(it.plan) for it in b] == fps[2:]
    assert state["calibration"] == text and b.cost_model is not cm
    # The calibrated plans differ from the uncalibrated ones (their predicted times at least).
    c = loader()
    for _ in range(2):
        next(c)
    plain = [it.plan for it in c]
    b2 = loader()
    b2.load_state_dict(state)
    assert any(p.makespan_ms != q.plan.makespan_ms for p, q in zip(plain, b2))


def test_every_rank_switches_to_the_same_calibration_at_the_same_iteration():
    results = support.spawn(workers.calibration, 2, {"fit_after": 3, "iterations": 6}, timeout_s=300)
    assert sorted(results) == [0, 1], results
    outs = {r: out for r, (status, out) in results.items()}
    for r, (status, out) in results.items():
        assert status == "ok", out
    assert outs[0]["boundaries"] == outs[1]["boundaries"] == [3]  # warm-up 1 + 3 measured: after iteration 3
    assert outs[0]["calibration"] == outs[1]["calibration"] and outs[0]["calibration"]
    assert outs[0]["fingerprints"] == outs[1]["fingerprints"]
    assert outs[0]["calibrated"] == [False] * 4 + [True] * 2
    # The ranks share this host's clock: rank 0 joined their times, so both ends of every transfer
    # were measured and reached the fit beside the compute ops. Whether the fit is kept depends on the
    # measured times (it is dropped when the iterations re-simulate closer without it, as on a loaded
    # machine): the calibration and the report agree on it either way.
    assert outs[0]["ops"] == ["B", "F", "recv", "send"], outs[0]["ops"]
    intra = json.loads(outs[0]["calibration"])["transfers"][0]
    assert intra["points"] > 0 and intra["sizes"] > 0, intra
    assert intra["fitted"] == outs[0]["transfers_fitted"], (intra, outs[0]["transfers_fitted"])


def test_a_fit_that_fails_on_rank_0_ends_every_rank_with_its_error():
    results = support.spawn(workers.calibration, 2, {"fit_after": 2, "iterations": 4, "failing_fit": True},
                            timeout_s=300)
    assert sorted(results) == [0, 1], results
    for r, (status, out) in results.items():
        assert status == "ok", out
        assert "calibration after iteration 2 failed on rank 0: ValueError: no fit today" in out["error"], out["error"]


def test_bad_calibrator_settings_and_calibrations_are_refused(tmp_path):
    cfg = models.GPTConfig(vocab_size=96, hidden=16, layers=2, heads=2, seed=1)
    cm = support.cost_model(cfg, tmp_path)
    manifest = support.short_manifest(tmp_path)
    loader = pt.PlanLoader(manifest, cost_model=cm, rank=None, iterations=2, shape=packpipe.PipelineShape(stages=2),
                           global_batch_tokens=600, seed=1, schedule="1f1b", schedule_fallback=True, dtype="fp32")
    with pytest.raises(ValueError, match=r"Calibrator: fit_after must be in \[1, "):
        pt.Calibrator(loader, fit_after=0)
    with pytest.raises(ValueError, match=r"Calibrator: warmup must be in \[0, "):
        pt.Calibrator(loader, warmup=-1)
    # a file that is not a calibration, and one fitted over another model
    with pytest.raises(RuntimeError, match='the calibration: /format: expected "packpipe-calibration"'):
        loader.set_calibration('{"format": "packpipe-measurements"}')
    other = packpipe.CostModel("gpt-1.3b", "A100-40GB")
    it = next(pt.PlanLoader(manifest, cost_model=other, rank=None, iterations=1,
                            shape=packpipe.PipelineShape(stages=2), global_batch_tokens=600, seed=1,
                            schedule="1f1b", schedule_fallback=True, dtype="fp32"))
    times = []
    for r in range(it.plan.ranks):
        t, rows = 0, []
        for ins in it.plan.streams[r]:
            rows.append((t, t + (2_000_000 if ins.is_compute else 1000)))
            t = rows[-1][1]
        times.append(rows)
    foreign = packpipe.fit_calibration(other, packpipe.measurements_from(it.plan, times),
                                       packpipe.FitOptions(regions=False)).to_json()
    with pytest.raises(ValueError, match="fitted over"):
        loader.set_calibration(foreign)
    assert loader.cost_model is cm  # nothing changed
    state = loader.state_dict()
    state["calibration"] = "{"
    with pytest.raises(RuntimeError, match="the loader state's calibration"):
        loader.load_state_dict(state)
    # a plan-file loader does not plan, so it cannot be calibrated
    plan_file = tmp_path / "p.plan"
    with packpipe.PlanFileWriter(str(plan_file)) as writer:
        writer.append(it.plan)
    reading = pt.PlanLoader(manifest, plan_file=str(plan_file), rank=None)
    with pytest.raises(ValueError, match="reads a plan file"):
        pt.Calibrator(reading)
    with pytest.raises(ValueError, match="reads a plan file"):
        reading.set_calibration(foreign)


def _small_loader(tmp_path, iterations=3):
    import shutil
    demo = tmp_path / "demo"
    if not demo.exists():
        shutil.copytree(support.DEMO, demo)
    cfg = models.GPTConfig(vocab_size=96, hidden=16, layers=2, heads=2, seed=1)
    loader = pt.PlanLoader(str(demo / "manifest.json"), cost_model=support.cost_model(cfg, tmp_path), rank=None,
                           iterations=iterations, shape=packpipe.PipelineShape(stages=2), global_batch_tokens=600,
                           seed=1, schedule="1f1b", schedule_fallback=True, dtype="fp32")
    return cfg, loader, demo


@pytest.mark.parametrize("kw, exc, message", [
    (dict(timeout_s=-1), ValueError, r"Calibrator: timeout_s must be a finite number in \(0, 1e\+09\], found -1"),
    (dict(timeout_s=0), ValueError, r"timeout_s must be a finite number in \(0, 1e\+09\], found 0"),
    (dict(timeout_s=float("nan")), ValueError, "timeout_s must be a finite number .* found nan"),
    (dict(timeout_s=float("inf")), ValueError, "timeout_s must be a finite number .* found inf"),
    (dict(timeout_s="10"), TypeError, "timeout_s must be a number .* found str '10'"),
    (dict(timeout_s=True), TypeError, "timeout_s must be a number"),
    (dict(tp=0), ValueError, r"Calibrator: tp must be in \[1, 2147483648\], found 0"),
    (dict(tp=2.0), TypeError, "tp must be an integer"),
    (dict(fit_after=2.5), TypeError, "Calibrator: fit_after must be an integer .* found float 2.5"),
    (dict(fit_after=True), TypeError, "fit_after must be an integer .* found bool True"),
    (dict(fit_after=10 ** 18), ValueError, r"fit_after must be in \[1, \d+\], found 1000000000000000000"),
    (dict(refit_every=-1), ValueError, "refit_every must be in"),
    (dict(warmup=1.0), TypeError, "warmup must be an integer"),
    (dict(options="regions"), TypeError, "Calibrator: options must be FitOptions, found str"),
    (dict(inputs="model.json"), TypeError, "Calibrator: inputs must be a sequence of paths"),
    (dict(inputs=[3]), TypeError, r"Calibrator: inputs\[0\] must be a path"),
    (dict(save=3), TypeError, "Calibrator: save must be a path"),
    (dict(save=""), ValueError, "Calibrator: save is an empty path"),
])
def test_calibrator_settings_are_checked_at_construction(tmp_path, kw, exc, message):
    _, loader, _ = _small_loader(tmp_path)
    with pytest.raises(exc, match=message):
        pt.Calibrator(loader, **kw)


def test_calibrator_save_is_refused_before_training_when_it_cannot_or_must_not_be_written(tmp_path):
    _, loader, demo = _small_loader(tmp_path)
    before = {p.name: p.read_bytes() for p in demo.iterdir() if p.is_file()}
    with pytest.raises(ValueError, match="Calibrator: save: cannot write .* is a directory"):
        pt.Calibrator(loader, save=str(tmp_path))
    with pytest.raises(ValueError, match="Calibrator: save: cannot write .*No such file or directory"):
        pt.Calibrator(loader, save=str(tmp_path / "missing" / "c.json"))
    for name in ("manifest.json", "demo_define_inputs_document.idx", "demo_translate_targets_document.bin"):
        with pytest.raises(ValueError, match=f"Calibrator: save '.*{name}' is the input .* destroy the input"):
            pt.Calibrator(loader, save=str(demo / name))
    script = tmp_path / "train.py"
    script.write_text("# the trainer\n")
    with pytest.raises(ValueError, match="destroy the input"):
        pt.Calibrator(loader, save=str(tmp_path / "." / "train.py"), inputs=[str(script)])
    assert {p.name: p.read_bytes() for p in demo.iterdir() if p.is_file()} == before
    assert script.read_text() == "# the trainer\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo", "device.json", "model.json", "train.py"]


def test_the_calibration_is_written_atomically_and_never_over_an_input(tmp_path):
    cfg, loader, demo = _small_loader(tmp_path, iterations=3)
    saved = tmp_path / "cal.json"
    cal = pt.Calibrator(loader, fit_after=1, warmup=1, save=str(saved))
    # The output turns into a name of the manifest after construction: the fit's write still refuses it.
    os.link(demo / "manifest.json", saved)
    manifest = (demo / "manifest.json").read_text()
    model = models.GPT(cfg)
    pipe = None
    with pytest.raises(RuntimeError, match="failed on rank 0: ValueError: Calibrator: save .* destroy the input"):
        for it in loader:
            if pipe is None:
                stages = {v: model.stage(it.plan.stages[v]) for v in range(it.plan.vstages)}
                pipe = pt.LocalPipeline(stages, models.gpt_loss, lambda ps: torch.optim.SGD(ps, lr=1e-3),
                                        timeout_s=120)
            cal.observe(it, pipe.run(it))
    assert (demo / "manifest.json").read_text() == manifest


def test_transfer_fits_that_make_the_iterations_worse_are_dropped():
    """Send and recv waits are upper bounds of the transfers (013). When the fitted links make the
    re-simulated iterations worse than the base communication model does, the Calibrator keeps the
    base model's links (and the compute fits): here every wait is inflated 10,000 times, as waits
    that hold the peer's compute are."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from test_runtime import PayloadHandler, plan_of
    from packpipe.torch.calibrate import _fit_checked, _iteration_error
    cm = packpipe.CostModel("gpt-350m", "A100-40GB")
    sets = []
    for k, plan in enumerate(plan_of(2, 1, "1f1b", n=40) + plan_of(2, 1, "1f1b", n=40, seed=1)):
        records = rt.run_local(plan, [PayloadHandler() for _ in range(plan.ranks)], rt.ExecutorOptions(timeout_s=30))
        sets.append(packpipe.measurements_from(plan, [r.times for r in records], iteration=k))
    ops = [m for s in sets for m in s.ops]
    iterations = [i for s in sets for i in s.iterations]
    honest = packpipe.MeasurementSet(ops, iterations, model="gpt-350m", device="A100-40GB", source="test")
    inflated = []
    for m in ops:
        if m.op in ("send", "recv"):
            m.ms = m.ms * 1e4 + 5.0
        inflated.append(m)
    bad = packpipe.MeasurementSet(inflated, iterations, model="gpt-350m", device="A100-40GB", source="test")
    full = packpipe.fit_calibration(cm, bad, packpipe.FitOptions())
    assert any(t["fitted"] for t in full.transfers)
    cal, report, kept = _fit_checked(cm, bad, packpipe.FitOptions())
    assert not kept and not any(t["fitted"] for t in cal.transfers)
    assert [f["global"] for f in cal.compute] == [f["global"] for f in full.compute]  # compute fits unchanged
    with_links = packpipe.validate_measurements(packpipe.CalibratedCostModel(cm, full), bad)
    assert _iteration_error(report) < _iteration_error(with_links)
    # whichever it keeps, its iteration error is the lower of the two
    cal, report, kept = _fit_checked(cm, honest, packpipe.FitOptions())
    full = packpipe.fit_calibration(cm, honest, packpipe.FitOptions())
    with_links = packpipe.validate_measurements(packpipe.CalibratedCostModel(cm, full), honest)
    assert _iteration_error(report) <= _iteration_error(with_links)

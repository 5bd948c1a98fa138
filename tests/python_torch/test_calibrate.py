"""packpipe.torch.Calibrator on real CPU runs of the small GPT: the calibrated plans predict the
measured iteration time better than the analytic model did, every rank switches to the same
calibrated model at the same iteration (identical plans after it), a failed fit ends every rank,
and the loader's state carries the calibration so a resume plans as an uninterrupted run."""
import json

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


def _error(rows):
    return _median([abs(p - m) / m for p, m in rows])


def test_calibration_on_real_cpu_runs_reduces_the_iteration_time_error(tmp_path):
    cfg = models.GPTConfig(vocab_size=256, hidden=64, layers=4, heads=4, seed=1)
    # A device ten times faster than the CPU presets: the analytic model is clearly off on any machine
    # (on one that happened to match the preset, "calibration helps" would be a coin toss).
    cm = models.cost_model(cfg, str(tmp_path), dict(support.CPU_DEVICE, name="cpu-10x", peak_tflops=0.5, hbm_gbps=200))
    manifest = support.short_manifest(tmp_path)
    warmup, fit_after, after = 1, 8, 6
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
    assert len(reports) == 1 and reports[0].iteration == warmup + fit_after - 1
    assert [c for _, c, _, _ in rows] == [False] * (warmup + fit_after) + [True] * after
    before = _error([(p, m) for _, c, p, m in rows[warmup:] if not c])
    after_err = _error([(p, m) for _, c, p, m in rows if c])
    print(f"iteration time error: analytic {100 * before:.1f}%, calibrated {100 * after_err:.1f}%; "
          f"{reports[0].summary()}")
    assert before > 0.5, f"the mis-set device should predict far too fast, error {before:.3f}"
    assert after_err < 0.5 * before, f"calibrated {after_err:.3f} against uncalibrated {before:.3f}"
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
    # were measured and fitted beside the compute ops.
    assert outs[0]["ops"] == ["B", "F", "recv", "send"], outs[0]["ops"]
    assert json.loads(outs[0]["calibration"])["transfers"][0]["fitted"]


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
    with pytest.raises(ValueError, match="fit_after must be at least 1"):
        pt.Calibrator(loader, fit_after=0)
    with pytest.raises(ValueError, match="warmup at least 0"):
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

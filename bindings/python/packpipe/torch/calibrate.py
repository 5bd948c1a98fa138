"""Calibrating the planner's cost model from this job's own iterations.

:class:`Calibrator` turns what the executor measured (each compute instruction's time, per
micro-batch shape) into packpipe measurements, and at fixed iteration boundaries fits a calibration
over the loader's cost model (``packpipe.fit_calibration``: per op kind and token region, a robust
``measured = a x predicted + b``). The loader then re-plans from the next iteration with the
calibrated model::

    calibrator = Calibrator(loader, fit_after=20)
    for it in loader:
        result = runner.run(it)
        calibrator.observe(it, result)   # collective at the boundary iterations

Plans stay identical on every rank: every rank observes the same iterations, the boundary is an
iteration number fixed in advance, the ranks' measurements are gathered (all-gather over a gloo group
of every rank, with a deadline), rank 0 fits and broadcasts the calibration file's bytes, and every
rank builds its calibrated model from those bytes. A fit that fails on rank 0 is broadcast as the
error, so every rank raises it rather than some waiting forever.
"""
from __future__ import annotations

import datetime
import io
import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

import packpipe
from packpipe import _check
from packpipe.torch.data import Iteration, PlanLoader
from packpipe.torch.runner import StepResult


@dataclass
class CalibrationReport:
    """What one calibration boundary did (the same on every rank)."""
    iteration: int                   # the last iteration measured; plans change from the next one
    measurements: int                # op measurements fitted (every rank's)
    iterations: int                  # iterations measured
    ops: Dict[str, Dict[str, float]] = field(default_factory=dict)  # op -> {"before", "after"} median |rel. error|
    iteration_error_before: float = float("nan")  # median |predicted - measured| / measured, uncalibrated
    iteration_error_after: float = float("nan")   # the same with the calibration (re-simulated)
    calibration_json: str = ""       # the calibration file's contents
    # False when the transfer fits were dropped: without them the re-simulated iterations were closer
    transfers_fitted: bool = True

    def __post_init__(self):
        _check.boolean("CalibrationReport", "transfers_fitted", self.transfers_fitted)

    @property
    def schedules(self) -> Dict[str, float]:
        """The fitted schedule factors (measured / simulated makespan per schedule kind, 013)."""
        if not self.calibration_json:
            return {}
        return {f["schedule"]: f["factor"] for f in json.loads(self.calibration_json).get("schedules", [])}

    def summary(self) -> str:
        ops = ", ".join(f"{k} {100 * v['before']:.1f}% -> {100 * v['after']:.1f}%" for k, v in self.ops.items())
        sched = ", ".join(f"{k} x{v:.3f}" for k, v in self.schedules.items())
        return (f"calibrated on iterations up to {self.iteration} ({self.measurements} op measurements over "
                f"{self.iterations} iterations): op error {ops}; iteration error "
                f"{100 * self.iteration_error_before:.1f}% -> {100 * self.iteration_error_after:.1f}%"
                + (f"; schedule factors {sched}" if sched else "")
                + ("" if self.transfers_fitted else " (transfer fits dropped: the iterations fit better without them)"))


def _records_times(plan, records) -> List[np.ndarray]:
    """Per pipeline rank of `plan` the [instructions, 2] times of `records` (empty: not recorded here)."""
    times: List[np.ndarray] = [np.zeros((0, 2), dtype=np.int64) for _ in range(plan.ranks)]
    for rec in records:
        times[rec.rank] = np.asarray(rec.times, dtype=np.int64)
    return times


class Calibrator:
    """Fits the cost model of `loader` to the iterations this job runs and has the loader re-plan.

    ``fit_after``: iterations measured before the first fit (after ``warmup`` iterations that are
    not measured: the first steps of a process pay for allocation and lazy initialisation).
    ``refit_every``: later fits every so many iterations over everything measured so far (0: fit
    once). ``options``: :class:`packpipe.FitOptions`. ``save``: a path where rank 0 writes each
    calibration (atomically; refused when it is one of the job's inputs: the loader's
    ``input_files`` and ``inputs``, the other files the job reads). ``tp``: the tensor-parallel size
    plans ran with. ``timeout_s``: the deadline of each exchange, in (0, 1e9] seconds. Every setting
    is checked here, before training (TypeError or ValueError naming it). In a distributed job every
    rank constructs its Calibrator (collective: it creates a gloo group for the exchange) and calls
    :meth:`observe` after each step.
    """

    def __init__(self, loader: PlanLoader, *, fit_after: int = 20, refit_every: int = 0, warmup: int = 1,
                 options=None, save: Optional[str] = None, tp: int = 1, timeout_s: float = 300.0,
                 inputs: Sequence[str] = ()):
        where = "Calibrator"
        _check.instance(where, "loader", loader, PlanLoader)
        if loader.cost_model is None:
            raise ValueError("Calibrator: the loader reads a plan file; calibration re-plans, so the loader must plan "
                             "(give it a cost_model)")
        fit_after = _check.integer(where, "fit_after", fit_after, 1, _check.MAX_COUNT)
        refit_every = _check.integer(where, "refit_every", refit_every, 0, _check.MAX_COUNT)
        warmup = _check.integer(where, "warmup", warmup, 0, _check.MAX_COUNT)
        if options is not None:
            _check.instance(where, "options", options, packpipe.FitOptions)
        tp = _check.integer(where, "tp", tp, 1, _MAX_TP)
        timeout_s = _check.number(where, "timeout_s", timeout_s, 0, _check.MAX_TIMEOUT_S, lo_open=True)
        self._inputs = loader.input_files + _check.paths(where, "inputs", inputs)
        if save is not None:
            save = _check.path(where, "save", save)
            # Every rank checks that it is no input; rank 0, which writes it, also that it can.
            packpipe.check_outputs({"Calibrator: save": save}, self._inputs, probe=_rank() == 0)
        if loader._auto is not None:
            raise ValueError("Calibrator: the loader already calibrates by itself (calibrate='auto'); construct "
                             "PlanLoader(calibrate=False) to calibrate with your own Calibrator, or pass its "
                             "settings as PlanLoader(calibrate={...})")
        loader._auto_settings = None  # this Calibrator calibrates the loader: its own calibration is off
        self.loader = loader
        self.base = loader.base_cost_model
        self.fit_after, self.refit_every, self.warmup = fit_after, refit_every, warmup
        self.options = options if options is not None else packpipe.FitOptions()
        self.save, self.tp, self.timeout_s = save, tp, timeout_s
        self.measurements = packpipe.MeasurementSet(model=self.base.model["name"], device=self.base.device["name"],
                                                    source="packpipe.torch.Calibrator")  # this rank's
        self.observed = 0                   # iterations observed (warm-up included)
        self.measured = 0                   # iterations measured
        self.reports: List[CalibrationReport] = []
        self.cost_model = self.base         # the model the loader plans with now
        self._next_fit: Optional[int] = warmup + fit_after  # the observation count of the next fit
        # The exchange carries host bytes: a gloo group over the job, whatever the default backend
        # (NCCL takes device tensors only). Creating it is collective, as constructing a Calibrator is.
        self._group = dist.new_group(backend="gloo") if self._distributed() else None
        self._pending: List[tuple] = []  # (iteration, replica, rank, times on the host clock, plan or None, ms)

    # ---- measuring ------------------------------------------------------------------------------
    def _measure(self, it: Iteration, result: StepResult) -> None:
        plan = it.plan
        if self._group is not None and result.clock_ns is not None and len(result.records) == 1:
            # One rank of a pipeline whose ranks share this host's clock: its times wait for the
            # boundary, where the pipeline's first rank joins every rank's times into the whole
            # iteration's measurements (compute ops, both ends of each transfer, the makespan).
            rec = result.records[0]
            times = np.asarray(rec.times, dtype=np.int64) + np.int64(result.clock_ns)
            # Keyed by the observation's number (not the iteration's: steps of several loaders or
            # epochs may share iteration numbers), which the measurements carry as their iteration.
            self._pending.append((self.observed, plan.replica, rec.rank, times, plan if rec.rank == 0 else None,
                                  result.measured_ms, it.iteration))
            return
        got = packpipe.measurements_from(plan, _records_times(plan, result.records), tp=self.tp,
                                         iteration=self.observed)
        if not got.iterations and any(rec.rank == 0 for rec in result.records):
            # One iteration line per replica: the pipeline's measured makespan beside the plan's.
            got.iterations = [packpipe.IterationMeasurement(iteration=self.observed, replica=plan.replica,
                                                            measured_ms=result.measured_ms,
                                                            predicted_ms=plan.makespan_ms,
                                                            schedule=_schedule_name(plan))]
        self.measurements.append(got)

    def _join_pending(self) -> None:
        """Collective: every rank's pending times to every rank; each pipeline's first rank turns its
        iterations into measurements (the others' compute ops are in them)."""
        mine = io.BytesIO()
        np.savez(mine, **{f"{i}_{r}_{k}": t for i, r, k, t, _, _, _ in self._pending})
        everyone = self._all_gather_bytes(mine.getvalue())
        times: Dict[tuple, np.ndarray] = {}
        for blob in everyone:
            with np.load(io.BytesIO(blob)) as z:
                for key in z.files:
                    i, r, k = (int(x) for x in key.split("_"))
                    times[(i, r, k)] = z[key]
        for step, replica, rank, _, plan, measured_ms, iteration in self._pending:
            if plan is None:
                continue
            per_rank = [times.get((step, replica, k)) for k in range(plan.ranks)]
            missing = [k for k, t in enumerate(per_rank) if t is None]
            if missing:
                raise RuntimeError(f"calibration: pipeline ranks {missing} of replica {replica} sent no times for "
                                   f"iteration {iteration}")
            got = packpipe.measurements_from(plan, per_rank, tp=self.tp, iteration=step)
            if not got.iterations:
                got.iterations = [packpipe.IterationMeasurement(iteration=step, replica=replica,
                                                                measured_ms=measured_ms,
                                                                predicted_ms=plan.makespan_ms,
                                                                schedule=_schedule_name(plan))]
            self.measurements.append(got)
        self._pending = []

    def observe(self, it: Iteration, result: StepResult) -> Optional[CalibrationReport]:
        """Records the step's measurements; at a boundary, fits (collective) and switches the loader
        to the calibrated model from the next iteration on. Returns the report at a boundary."""
        if result.iteration != it.iteration:
            raise ValueError(f"Calibrator.observe: the result is of iteration {result.iteration}, the iteration "
                             f"{it.iteration}")
        self.observed += 1
        if self.observed > self.warmup:
            self._measure(it, result)
            self.measured += 1
        if self._next_fit is None or self.observed < self._next_fit:
            return None
        self._next_fit = self.observed + self.refit_every if self.refit_every else None
        report = self._fit(it.iteration)
        self.reports.append(report)
        return report

    # ---- fitting --------------------------------------------------------------------------------
    def _distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def _wait(self, work, what: str):
        try:
            work.wait(datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as e:
            raise RuntimeError(f"calibration: {what} failed on rank {dist.get_rank()}: {e}") from e

    def _all_gather_bytes(self, data: bytes) -> List[bytes]:
        n = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.zeros_like(n) for _ in range(dist.get_world_size())]
        self._wait(dist.all_gather(sizes, n, group=self._group, async_op=True), "the exchange of measurement sizes")
        longest = max(int(s) for s in sizes)
        mine = torch.zeros(longest, dtype=torch.uint8)
        mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else mine[:0]
        out = [torch.zeros(longest, dtype=torch.uint8) for _ in sizes]
        self._wait(dist.all_gather(out, mine, group=self._group, async_op=True), "the exchange of measurements")
        return [bytes(t[:int(s)].numpy().tobytes()) for t, s in zip(out, sizes)]

    def _broadcast_bytes(self, data: Optional[bytes]) -> bytes:
        n = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
        self._wait(dist.broadcast(n, 0, group=self._group, async_op=True), "the broadcast of the calibration's size")
        buf = torch.zeros(int(n), dtype=torch.uint8)
        if data is not None and data:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        self._wait(dist.broadcast(buf, 0, group=self._group, async_op=True), "the broadcast of the calibration")
        return bytes(buf.numpy().tobytes())

    def _decide(self, texts: Sequence[str], iteration: int) -> bytes:
        """On rank 0: from every rank's measurement file text, the fitted calibration and its report
        as JSON bytes ({"error": ...} when anything fails)."""
        try:
            mset = packpipe.MeasurementSet(model=self.base.model["name"], device=self.base.device["name"],
                                           source=f"packpipe.torch.Calibrator up to iteration {iteration}")
            for rank, text in enumerate(texts):
                if text.startswith(_FAILED):
                    raise RuntimeError(f"rank {rank} could not measure: {text[len(_FAILED):]}")
                mset.append(packpipe.parse_measurements(text, f"rank {rank}'s measurements up to iteration "
                                                              f"{iteration}"))
            cal, after, transfers = _fit_checked(self.base, mset, self.options)
            before = packpipe.validate_measurements(self.base, mset)
            ops = {b.op: {"before": b.median_abs, "after": a.median_abs} for b, a in zip(before.ops, after.ops)}
            body = {"calibration": cal.to_json(), "measurements": len(mset),
                    "iterations": len({(i.iteration, i.replica) for i in mset.iterations}), "ops": ops,
                    "iteration_error_before": _iteration_error(before),
                    "iteration_error_after": _iteration_error(after), "transfers_fitted": transfers}
            if self.save:
                packpipe.write_file_atomic(self.save, cal.to_json(), inputs=self._inputs, what="Calibrator: save")
            return json.dumps(body).encode()
        except Exception as e:  # noqa: BLE001 - every rank raises it
            return json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()

    def _fit(self, iteration: int) -> CalibrationReport:
        failure = None
        if self._group is not None:
            pending = torch.tensor([len(self._pending)], dtype=torch.int64)
            self._wait(dist.all_reduce(pending, op=dist.ReduceOp.MAX, group=self._group, async_op=True),
                       "the count of pending iterations")
            if int(pending):
                try:
                    self._join_pending()
                except Exception as e:  # noqa: BLE001 - sent to rank 0, which ends every rank with it
                    failure = f"{type(e).__name__}: {e}"
                    self._pending = []
        mine = _FAILED + failure if failure is not None else self.measurements.to_jsonl()
        if self._group is not None:
            everyone = self._all_gather_bytes(mine.encode())
            decided = self._decide([b.decode() for b in everyone], iteration) if dist.get_rank() == 0 else None
            body = json.loads(self._broadcast_bytes(decided).decode())
        else:
            body = json.loads(self._decide([mine], iteration).decode())
        if "error" in body:
            raise RuntimeError(f"calibration after iteration {iteration} failed on rank 0: {body['error']}")
        self.loader.set_calibration(body["calibration"])
        self.cost_model = self.loader.cost_model
        return CalibrationReport(iteration, body["measurements"], body["iterations"], body["ops"],
                                 body["iteration_error_before"], body["iteration_error_after"], body["calibration"],
                                 body["transfers_fitted"])


_MAX_TP = 2 ** 31  # as `packpipe run --tp` (costmodel::kMaxMeasuredSize)


def _rank() -> int:
    """This process's rank in the default group (0 when not distributed)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


_FAILED = "#failed "  # what a rank sends instead of its measurements when it could not make them


def _schedule_name(plan) -> str:
    """The plan's schedule kind as an iteration line records it ('' for a name that is not one)."""
    return plan.schedule if plan.schedule in packpipe.schedule_names() else ""


def _fit_checked(base, mset, options):
    """fit_calibration of `base` to `mset` with its schedule factors, and its validation report.
    Transfer waits are upper bounds (013): when the re-simulated iterations are closer without the
    transfer fits, they are dropped (the base communication model kept). That choice is made on the
    op and transfer fits alone (a schedule factor fitted to the same iterations would hide a transfer
    fit's bias); the schedule factors are fitted after, over the model chosen. Returns (calibration,
    report, transfers kept)."""
    def report(cal):
        return packpipe.validate_measurements(packpipe.CalibratedCostModel(base, cal), mset)

    cal = packpipe.fit_calibration(base, mset, options)
    transfers = any(t["fitted"] for t in cal.transfers)
    if transfers:
        after = report(cal)
        if after.iterations_compared:
            alt = _without_transfers(cal)
            if _iteration_error(report(alt)) < _iteration_error(after):
                cal, transfers = alt, False
    cal = packpipe.fit_schedule_factors(base, cal, mset)
    return cal, report(cal), transfers


def _without_transfers(cal):
    """`cal` with its transfer fits dropped (the base communication model kept)."""
    j = json.loads(cal.to_json())
    for t in j["transfers"]:
        t.update(fitted=False, latency_ms=0.0, bytes_per_ms=0.0)
    return packpipe.Calibration.from_json(json.dumps(j), "the calibration without its transfer fits")


def _iteration_error(report) -> float:
    return float(report.iteration_median_abs) if report.iterations_compared else float("nan")

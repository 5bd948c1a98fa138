#!/usr/bin/python3
"""Measured, not simulated: packpipe.torch on CPU against hand-written and baseline training.

    python3 -m packpipe.torch.run --nproc-per-node 2 benchmarks/torch_bench.py overhead --out o.json
    python3 -m packpipe.torch.run --nproc-per-node 2 benchmarks/torch_bench.py throughput --out t.json
    python3 -m packpipe.torch.run --nproc-per-node 2 benchmarks/torch_bench.py calibration --iterations 10

overhead:   the same 1F1B plans (same micro-batches, shapes, model) run by packpipe's runner (the C++
            executor calling torch handlers and the torch transport) and by a hand-written 1F1B loop
            with isend/irecv, alternating round by round; the runner's overhead per instruction is
            (median packpipe - median hand-written) / instructions per rank.
calibration: the small GPT trained twice side by side (iteration by iteration alternating) from the
            analytic model with no profile: one loader keeps it, the other is calibrated by
            packpipe.torch.Calibrator after --calibrate-after measured iterations and re-plans; after
            the boundary, the median |predicted - measured| / measured iteration time of each.
warmup:     the cost of PlanLoader's default calibration (calibrate="auto"): it beside a loader that
            plans with a calibration from its first iteration, the same --iterations alternating step
            by step; the extra time of the steps up to the fit over the whole run, and the time spent
            in the loader's calibration work.
throughput: the small GPT trained for real on the same global batches with packpipe's plans (dynamic
            micro-batches, schedule search) and with the Megatron baselines, fixed micro-batches
            padded to their longest sample and packed rows, each at every micro-batch size of the
            grid, 1F1B; tokens/s measured beside the simulated (cost-model) tokens/s of the same plans.
            Every side plans with one calibration, fitted on --calibrate-after steps of every side's
            plans and, for each of --calibration-passes after the first, refitted with the steps of
            plans made with it; per configuration also the median measured / planned makespan of its
            steps (the model's error inside the pipeline) and the time outside the makespans.

Every mode runs each configuration in each round, alternating, and reports medians over rounds.
Iteration times are the slowest rank's (barrier, run, all-reduce MAX).
"""
import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist

import packpipe
import packpipe.torch as pt
from packpipe import _check
from packpipe.torch import data as pt_data
from packpipe.torch import models
from packpipe.torch.compare import longest_sample

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def manifest(workload, directory):
    demo = os.path.join(ROOT, "data", "demo")
    if workload == "demo":
        return os.path.join(demo, "manifest.json")
    if workload == "long":  # the short tasks beside whole manual pages (257 to 8,190 tokens)
        return os.path.join(demo, "long.json")
    tasks = ["define", "synonyms", "translate"]
    m = {"version": 1, "tasks": [{"name": t, "inputs": os.path.join(demo, f"demo_{t}_inputs_document"),
                                  "targets": os.path.join(demo, f"demo_{t}_targets_document")} for t in tasks]}
    path = os.path.join(directory, "short.json")
    packpipe.write_file_atomic(path, json.dumps(m))
    return path


def setup(a, tmp):
    """The small GPT's config, its cost model on the CPU device, and the workload's dataset."""
    data = packpipe.MultiTaskDataset(manifest(a.workload, tmp))
    cfg = models.GPTConfig(vocab_size=a.vocab, hidden=a.hidden, layers=a.layers, heads=4, seed=1,
                           max_positions=max(4096, longest_sample(data)))
    return cfg, models.cost_model(cfg, tmp), data


def progress(text):
    """One line of progress on rank 0's stderr (long runs: minutes per round)."""
    if dist.get_rank() == 0:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def timed(fn):
    """The slowest rank's wall time of fn() in ms."""
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    t = torch.tensor([(time.perf_counter() - t0) * 1e3], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def load_all(data, cm, groups, a, **kw):
    shape = packpipe.PipelineShape(stages=groups.pp, dp=groups.dp)
    loader = pt.PlanLoader(data, cost_model=cm, replica=groups.replica, rank=groups.pipeline_rank,
                           iterations=a.iterations, shape=shape, global_batch_tokens=a.tokens, seed=a.seed,
                           dtype="fp32", split_backward=False, calibrate=False, **kw)
    return list(loader)


# ---- hand-written 1F1B (one stage per rank, dp 1) -------------------------------------------------

def hand_1f1b(it, module, loss_fn, opt, groups):
    """Megatron's non-interleaved 1F1B over the plan's micro-batches, isend/irecv, no packpipe."""
    plan = it.plan
    S, r = groups.pp, groups.pipeline_rank
    M = len(plan.microbatches)
    (v,) = pt.PipelineRunner.my_stages(plan, r)
    G = plan.global_loss_tokens
    prev_rank, next_rank = r - 1, r + 1
    saved, sends = {}, []
    act_g, grad_g = groups.pipeline["activation"], groups.pipeline["gradient"]

    def shape_of(mb):
        info = plan.microbatches[mb]
        return (info["rows"], info["padded_len"], HIDDEN[0])

    def forward(mb):
        inp = None
        if r > 0:
            inp = torch.empty(shape_of(mb))
            dist.irecv(inp, src=groups.world_of(prev_rank), group=act_g, tag=0).wait()
            inp.requires_grad_(True)
        try:
            loaded = it.loaded(mb, v)
        except KeyError:
            loaded = None
        batch = it.microbatch(mb, loaded=loaded)
        out = module(inp, batch)
        if r == S - 1:
            out = loss_fn(out, batch) / G
        else:
            sends.append(dist.isend(out.detach().contiguous(), dst=groups.world_of(next_rank), group=act_g, tag=0))
        saved[mb] = (inp, out)

    def backward(mb):
        inp, out = saved.pop(mb)
        g = None
        if r < S - 1:
            g = torch.empty(out.shape)
            dist.irecv(g, src=groups.world_of(next_rank), group=grad_g, tag=1).wait()
        torch.autograd.backward(out, g)
        if r > 0:
            sends.append(dist.isend(inp.grad, dst=groups.world_of(prev_rank), group=grad_g, tag=1))

    warm = min(S - r - 1, M)
    for mb in range(warm):
        forward(mb)
    for k in range(M - warm):
        forward(warm + k)
        backward(k)
    for k in range(M - warm, M):
        backward(k)
    for w in sends:
        w.wait()
    opt.step()
    opt.zero_grad(set_to_none=True)


HIDDEN = [0]


def overhead(a, groups, tmp):
    if groups.dp != 1:
        sys.exit("overhead: dp must be 1 (the hand-written loop is one pipeline)")
    cfg, cm, data = setup(a, tmp)
    HIDDEN[0] = a.hidden
    its = load_all(data, cm, groups, a, schedule="1f1b")
    full = models.GPT(cfg)
    (v,) = pt.PipelineRunner.my_stages(its[0].plan, groups.pipeline_rank)
    mod_pp = full.stage(its[0].plan.stages[v])
    mod_hand = copy.deepcopy(mod_pp)
    opt_pp = torch.optim.SGD(mod_pp.parameters(), lr=1e-3)
    opt_hand = torch.optim.SGD(mod_hand.parameters(), lr=1e-3)
    runner = pt.PipelineRunner({v: mod_pp}, models.gpt_loss, opt_pp, groups=groups, timeout_s=120)
    instructions = sum(len(it.plan.streams[groups.pipeline_rank]) for it in its)
    res = {"packpipe": [], "hand": []}
    own_ns = []  # the executor's own time per instruction, from its records (packpipe runs)
    for rnd in range(a.rounds + 1):  # round 0 warms up
        for mode in ("packpipe", "hand") if rnd % 2 == 0 else ("hand", "packpipe"):
            if mode == "packpipe":
                results = []
                ms = timed(lambda: results.extend(runner.run(it) for it in its))
                own_ns.append(sum(r.records[0].overhead_ns for r in results) / instructions)
            else:
                ms = timed(lambda: [hand_1f1b(it, mod_hand, models.gpt_loss, opt_hand, groups) for it in its])
            if rnd > 0:
                res[mode].append(ms)
    runner.close()
    pp_ms, hand_ms = statistics.median(res["packpipe"]), statistics.median(res["hand"])
    n = torch.tensor([instructions], dtype=torch.float64)
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    out = {"mode": "overhead", "workload": a.workload, "iterations": a.iterations, "rounds": a.rounds,
           "ranks": groups.pp, "packpipe_ms": res["packpipe"], "hand_ms": res["hand"],
           "median_packpipe_ms": pp_ms, "median_hand_ms": hand_ms, "ratio": pp_ms / hand_ms,
           "instructions_per_rank": float(n), "overhead_us_per_instruction": (pp_ms - hand_ms) * 1e3 / float(n),
           "overhead_fraction": (pp_ms - hand_ms) / hand_ms,
           "executor_own_us_per_instruction_rank": statistics.median(own_ns) / 1e3,
           "microbatches": [len(it.plan.microbatches) for it in its]}
    return out


def baseline_configs(a, data):
    """The baselines a user would run, each at every setting of the benchmark's grid, 1F1B (the
    user's schedule): fixed micro-batch sizes (padded), token budgets (padded), varlen packing into
    rows of a capacity (HF flattening, Megatron THD), WLB-LLM's attention-balanced packing."""
    longest = longest_sample(data)
    cap = 1
    while cap < longest:
        cap *= 2
    one_f = {"schedule": "1f1b", "schedule_fallback": True}
    out = []
    for k in a.grid:
        out.append((f"fixed (mbs {k})", "fixed", dict(one_f, options=packpipe.PartitionOptions(method="fixed", mbs=k))))
    for f in a.budgets:
        out.append((f"tokens (budget {f * cap})", "tokens",
                    dict(one_f, options=packpipe.PartitionOptions(method="tokens", tokens=f * cap))))
    for k in a.grid:
        out.append((f"packing (capacity {cap} x {k} rows)", "packing",
                    dict(one_f, options=packpipe.PartitionOptions(method="packing", mbs=k, capacity=cap))))
    for f in a.budgets:
        out.append((f"wlb (capacity {f * cap})", "wlb",
                    dict(one_f, options=packpipe.PartitionOptions(method="wlb", capacity=f * cap))))
    # Seq1F1B-like: every sample over a length cut into slices of that length, packed, under 1F1B
    for f in (a.slice_fractions if a.slice_fractions is not None else
              ([16, 8, 4, 2] if a.workload == "long" else [])):
        if cap // f >= 1:
            out.append((f"slicing (slices of {cap // f})", "slicing",
                        dict(one_f, options=packpipe.PartitionOptions(method="slicing", capacity=cap // f))))
    return out


def runner_for(cfg, its, groups):
    """A PipelineRunner of a fresh copy of the model over the plans' stages (the same weights on every
    side: the model's seed)."""
    full = models.GPT(cfg)
    plan0 = its[0].plan
    stages = {v: full.stage(plan0.stages[v]) for v in pt.PipelineRunner.my_stages(plan0, groups.pipeline_rank)}
    opt = torch.optim.SGD([p for m in stages.values() for p in m.parameters()], lr=1e-3)
    return pt.PipelineRunner(stages, models.gpt_loss, opt, groups=groups, timeout_s=600)


def throughput(a, groups, tmp):
    """Every side planned with one calibration fitted on all sides' own measured steps, then run
    alternating round by round on the same global batches."""
    cfg, base, data = setup(a, tmp)
    packpipe_kw = {"schedule": "search", "options": packpipe.PartitionOptions(method="dp")}
    configs = [("packpipe", "packpipe", packpipe_kw)] + baseline_configs(a, data)
    if a.only:  # packpipe and the baseline settings whose name holds one of the given texts
        kept = [c for c in configs if c[0] == "packpipe" or any(t in c[0] for t in a.only)]
        if len(kept) == 1:
            raise SystemExit(f"torch_bench.py: --only {a.only} matches no baseline setting of --workload {a.workload} "
                             f"(--grid {a.grid}, --budgets {a.budgets}); the settings are: "
                             + "; ".join(c[0] for c in configs[1:]))
        configs = kept
    # 1. Calibration: every side's plans of other batches (side c plans epoch 1 + c) run with the
    # base model, and one fit over all of their steps (rank 0 fits, every rank gets the same file);
    # then, for each further pass, every side's plans made with that calibration run too and the
    # fit is made again over every step so far: the plans measured are the kind that will run (a
    # schedule's overhead on this machine can differ between the base model's plans and these).
    t0 = time.perf_counter()
    shape = packpipe.PipelineShape(stages=groups.pp, dp=groups.dp)
    common = dict(replica=groups.replica, rank=groups.pipeline_rank, shape=shape, global_batch_tokens=a.tokens,
                  seed=a.seed, dtype="fp32", split_backward=False, calibrate=False)
    anchor = pt.PlanLoader(data, cost_model=base, epoch=1, iterations=1, **common, **packpipe_kw)
    per_side = a.calibrate_after
    per_pass = per_side * len(configs)
    cal = pt.Calibrator(anchor, fit_after=per_pass, refit_every=per_pass, warmup=0)
    report, model = None, base
    for p in range(a.calibration_passes):
        for c, (name, _, kw) in enumerate(configs):
            its = list(pt.PlanLoader(data, cost_model=model, epoch=1 + c + p * len(configs), iterations=per_side + 1,
                                     **common, **kw))
            runner = runner_for(cfg, its, groups)
            runner.run(its[0])  # warm-up: not measured
            # Back to back, as the timed rounds run them (observing between steps would put the
            # Calibrator's own work between them, and a schedule's cost across iterations with it).
            results = [runner.run(it) for it in its[1:]]
            for it, r in zip(its[1:], results):
                rep = cal.observe(it, r)
                report = rep or report
            runner.close()
            progress(f"calibration pass {p + 1}/{a.calibration_passes}: side {c + 1}/{len(configs)} ({name}) measured")
        model = packpipe.CalibratedCostModel(base, packpipe.Calibration.from_json(report.calibration_json, "fit"))
        progress(f"calibration pass {p + 1}: {report.summary()}")
    calibrated = model
    calibration_s = time.perf_counter() - t0
    # 2. The measured sides, planned with the calibrated model.
    runs = {}
    for name, family, kw in configs:
        its = load_all(data, calibrated, groups, a, **kw)
        runs[name] = {"family": family, "its": its, "runner": runner_for(cfg, its, groups),
                      "tokens": sum(it.tokens for it in its) * groups.dp,
                      "simulated_ms": sum(it.plan.makespan_ms for it in its), "ms": [],
                      "microbatches": [len(it.plan.microbatches) for it in its],
                      "layouts": sorted({m["layout"] for it in its for m in it.plan.microbatches}),
                      "schedules": sorted({it.plan.schedule for it in its}),
                      "step_ratios": []}
    names = [n for n, _, _ in configs]
    for rnd in range(a.rounds + 1):  # round 0 warms up
        order = names if rnd % 2 == 0 else list(reversed(names))
        for name in order:
            r = runs[name]
            steps = []
            ms = timed(lambda: steps.extend(r["runner"].run(it) for it in r["its"]))
            if rnd > 0:
                r["ms"].append(ms)
                # Each step's measured pipeline makespan (this rank's view) against its plan's:
                # what the cost model missed inside the pipeline, apart from the work around it.
                r["step_ratios"].extend(s.measured_ms / it.plan.makespan_ms for s, it in zip(steps, r["its"])
                                        if s.measured_ms and it.plan.makespan_ms)
            progress(f"round {rnd}/{a.rounds}{' (warm-up)' if rnd == 0 else ''}: {name} {ms:.0f} ms")
    out = {"mode": "throughput", "workload": a.workload, "iterations": a.iterations, "rounds": a.rounds,
           "ranks": groups.pp, "dp": groups.dp, "global_batch_tokens": a.tokens,
           "calibration": {"summary": report.summary(), "seconds": calibration_s,
                           "measured_iterations": per_pass * a.calibration_passes,
                           "passes": a.calibration_passes},
           "configs": {}}
    for name in names:
        r = runs[name]
        r["runner"].close()
        med = statistics.median(r["ms"])
        # Simulated time is the cost model's per replica (replicas run in parallel): the max over replicas.
        sim = torch.tensor([r["simulated_ms"]], dtype=torch.float64)
        dist.all_reduce(sim, op=dist.ReduceOp.MAX)
        out["configs"][name] = {"family": r["family"], "tokens": r["tokens"], "median_ms": med, "ms": r["ms"],
                                "tokens_per_s": r["tokens"] / (med / 1e3),
                                "simulated_tokens_per_s": r["tokens"] / (float(sim) / 1e3),
                                "simulated_over_measured": (r["tokens"] / (float(sim) / 1e3)) / (r["tokens"] / (med / 1e3)),
                                "microbatches": r["microbatches"], "layouts": r["layouts"],
                                "schedules": r["schedules"],
                                "makespan_measured_over_planned": statistics.median(r["step_ratios"])
                                if r["step_ratios"] else None,
                                "outside_makespan_fraction": 1 - (sum(it.plan.makespan_ms for it in r["its"]) *
                                                                  statistics.median(r["step_ratios"]) / med)
                                if r["step_ratios"] else None}
    c = out["configs"]
    pp = c["packpipe"]
    families = sorted({v["family"] for k, v in c.items() if k != "packpipe"})
    out["best_measured"] = {}
    for fam in families + ["any"]:
        cands = [(v["tokens_per_s"], k) for k, v in c.items() if k != "packpipe" and fam in ("any", v["family"])]
        m, mk = max(cands)
        out["best_measured"][fam] = {"setting": mk, "tokens_per_s": m,
                                     "speedup_measured": pp["tokens_per_s"] / m,
                                     "speedup_simulated": pp["simulated_tokens_per_s"] / c[mk]["simulated_tokens_per_s"]}
    mine = [_execution(it) for it in runs["packpipe"]["its"]]
    for fam, b in out["best_measured"].items():
        # Round by round (the sides ran next to each other): the spread is the machine's noise.
        other = c[b["setting"]]
        paired = [(pp["tokens"] / pm) / (other["tokens"] / bm) for bm, pm in zip(other["ms"], pp["ms"])]
        b["speedup_paired_median"] = statistics.median(paired)
        b["speedup_paired_range"] = [min(paired), max(paired)]
        # The same plans: every rank's compute ops over the same micro-batches in the same order
        # (checked on every rank, all must agree).
        theirs = [_execution(it) for it in runs[b["setting"]]["its"]]
        agree = torch.tensor([int(mine == theirs)])
        dist.all_reduce(agree, op=dist.ReduceOp.MIN)
        b["same_plans"] = bool(agree.item())
    best = out["best_measured"]["any"]
    same = " (the same plans: the same micro-batches, ops and order on every rank, a tie by construction)" if (
        best["same_plans"]) else ""
    out["headline"] = (f"packpipe {best['speedup_measured']:.3f}x the best baseline measured, {best['setting']} "
                       f"(simulated {best['speedup_simulated']:.3f}x; round by round median "
                       f"{best['speedup_paired_median']:.3f}x, range {best['speedup_paired_range'][0]:.3f}x to "
                       f"{best['speedup_paired_range'][1]:.3f}x){same}")
    out["max_simulation_error"] = max(abs(v["simulated_over_measured"] - 1) for v in c.values())
    return out


def _execution(it):
    """An iteration's plan as a comparable value: per rank, its compute ops in stream order, each with
    its micro-batch's samples (task, index, offset), row offsets, layout and recompute modes."""
    keys = [(tuple(m["refs"]), tuple(m["offsets"]), tuple(m["row_offsets"]), m["layout"], tuple(m["recompute"]))
            for m in it.plan.microbatches]
    return [[(i.op, keys[i.mb], i.stage) for i in stream if i.is_compute and i.mb is not None]
            for stream in it.plan.streams]


def calibration(a, groups, tmp):
    cfg, cm, data = setup(a, tmp)
    shape = packpipe.PipelineShape(stages=groups.pp, dp=groups.dp)
    total = a.warmup + a.calibrate_after + a.iterations
    sides = {}
    for name in ("uncalibrated", "calibrated"):
        loader = pt.PlanLoader(data, cost_model=cm, replica=groups.replica, rank=groups.pipeline_rank,
                               iterations=total, shape=shape, global_batch_tokens=a.tokens, seed=a.seed,
                               dtype="fp32", split_backward=False, schedule="search", schedule_fallback=True,
                               calibrate=False)
        full = models.GPT(cfg)
        cal = pt.Calibrator(loader, fit_after=a.calibrate_after, warmup=a.warmup) if name == "calibrated" else None
        sides[name] = {"loader": loader, "iter": iter(loader), "model": full, "cal": cal, "runner": None,
                       "rows": []}
    for i in range(total):
        for name in (("uncalibrated", "calibrated") if i % 2 == 0 else ("calibrated", "uncalibrated")):
            sd = sides[name]
            it = next(sd["iter"])
            if sd["runner"] is None:
                mine = pt.PipelineRunner.my_stages(it.plan, groups.pipeline_rank)
                stages = {v: sd["model"].stage(it.plan.stages[v]) for v in mine}
                opt = torch.optim.SGD([p for m in stages.values() for p in m.parameters()], lr=1e-3)
                sd["runner"] = pt.PipelineRunner(stages, models.gpt_loss, opt, groups=groups, timeout_s=300)
            calibrated = sd["cal"] is not None and sd["cal"].cost_model is not sd["cal"].base
            r = sd["runner"].run(it)
            sd["rows"].append({"iteration": it.iteration, "measured_ms": r.measured_ms,
                               "predicted_ms": r.predicted_ms, "calibrated": calibrated,
                               "microbatches": len(it.plan.microbatches), "schedule": it.plan.schedule})
            if sd["cal"] is not None:
                rep = sd["cal"].observe(it, r)
                if rep is not None:
                    sd["report"] = rep

    def err(rows):
        return statistics.median(abs(r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"] for r in rows)

    boundary = a.warmup + a.calibrate_after
    out = {"mode": "calibration", "workload": a.workload, "ranks": groups.pp, "dp": groups.dp,
           "global_batch_tokens": a.tokens, "warmup": a.warmup, "calibrate_after": a.calibrate_after,
           "iterations_after": a.iterations, "sides": {}}
    for name, sd in sides.items():
        sd["runner"].close()
        before, after = sd["rows"][a.warmup:boundary], sd["rows"][boundary:]
        out["sides"][name] = {"error_before_boundary": err(before), "error_after_boundary": err(after),
                              "median_measured_ms_after": statistics.median(r["measured_ms"] for r in after),
                              "median_predicted_ms_after": statistics.median(r["predicted_ms"] for r in after),
                              "rows": sd["rows"]}
    rep = sides["calibrated"].get("report")
    if rep is not None:
        out["fit"] = {"summary": rep.summary(), "ops": rep.ops, "measurements": rep.measurements,
                      "resimulated_iteration_error_before": rep.iteration_error_before,
                      "resimulated_iteration_error_after": rep.iteration_error_after}
    u, c = out["sides"]["uncalibrated"], out["sides"]["calibrated"]
    out["iteration_error_after_uncalibrated"] = u["error_after_boundary"]
    out["iteration_error_after_calibrated"] = c["error_after_boundary"]
    out["goal_within_5_percent"] = c["error_after_boundary"] <= 0.05
    out["throughput_ratio_calibrated_vs_uncalibrated"] = (u["median_measured_ms_after"] /
                                                          c["median_measured_ms_after"])
    return out


def warmup(a, groups, tmp):
    """What calibrating by default costs: a loader with calibrate="auto" (unmeasured warm-up steps,
    measured steps, the fit, re-planning) beside one that plans with a calibration from its first
    iteration (fitted beforehand on other batches), the same iterations alternating step by step."""
    cfg, base, data = setup(a, tmp)
    shape = packpipe.PipelineShape(stages=groups.pp, dp=groups.dp)
    common = dict(replica=groups.replica, rank=groups.pipeline_rank, shape=shape, global_batch_tokens=a.tokens,
                  seed=a.seed, dtype="fp32", split_backward=False, schedule="search",
                  options=packpipe.PartitionOptions(method="dp"))
    # The side calibrated from the start: a calibration fitted by the same default rule on epoch 1.
    settings = dict(pt_data.AUTO_CALIBRATION)
    pilot = pt.PlanLoader(data, cost_model=base, epoch=1, calibrate="auto",
                          iterations=settings["warmup"] + settings["fit_after"], **common)
    pilot_its = list(pilot)
    runner = runner_for(cfg, pilot_its, groups)
    for it in pilot_its:
        runner.run(it)
    runner.close()
    (report,) = pilot.calibration_reports
    calibrated = packpipe.CalibratedCostModel(base, packpipe.Calibration.from_json(report.calibration_json, "pilot"))
    progress(f"pilot calibration: {report.summary()}")
    sides = {"auto": pt.PlanLoader(data, cost_model=base, iterations=a.iterations, calibrate="auto", **common),
             "calibrated": pt.PlanLoader(data, cost_model=calibrated, iterations=a.iterations, calibrate=False,
                                         **common)}
    state = {name: {"iter": iter(ld), "runner": None, "ms": [], "observe_ms": 0.0} for name, ld in sides.items()}
    fit_at = settings["warmup"] + settings["fit_after"]  # the auto side's plans are calibrated from this step
    for i in range(a.iterations):
        for name in (("auto", "calibrated") if i % 2 == 0 else ("calibrated", "auto")):
            sd = state[name]
            try:
                it = next(sd["iter"])
            except StopIteration:  # the epoch ended (the short workload has ~45 iterations): the next one
                sides[name].set_epoch(sides[name].epoch + 1)
                sd["iter"] = iter(sides[name])
                it = next(sd["iter"])
            if sd["runner"] is None:
                sd["runner"] = runner_for(cfg, [it], groups)
            observer = getattr(it, "_observer", None)
            if observer is not None:  # time the loader's own calibration work inside the step
                def timed_observer(iteration, result, _f=observer, _sd=sd):
                    t0 = time.perf_counter()
                    out = _f(iteration, result)
                    _sd["observe_ms"] += (time.perf_counter() - t0) * 1e3
                    return out
                it._observer = timed_observer
            sd["ms"].append(timed(lambda: sd["runner"].run(it)))
        if (i + 1) % 10 == 0:
            progress(f"warmup: {i + 1}/{a.iterations} iterations")
    for sd in state.values():
        sd["runner"].close()
    auto, cal = state["auto"], state["calibrated"]
    t_auto, t_cal = sum(auto["ms"]), sum(cal["ms"])
    head_auto, head_cal = sum(auto["ms"][:fit_at + 1]), sum(cal["ms"][:fit_at + 1])
    rest_auto, rest_cal = sum(auto["ms"][fit_at + 1:]), sum(cal["ms"][fit_at + 1:])
    obs = torch.tensor([auto["observe_ms"]], dtype=torch.float64)
    dist.all_reduce(obs, op=dist.ReduceOp.MAX)
    reports = sides["auto"].calibration_reports
    return {"mode": "warmup", "workload": a.workload, "iterations": a.iterations, "ranks": groups.pp,
            "dp": groups.dp, "global_batch_tokens": a.tokens, "auto_settings": settings,
            "auto_ms": auto["ms"], "calibrated_ms": cal["ms"], "total_auto_ms": t_auto, "total_calibrated_ms": t_cal,
            "warmup_steps_auto_ms": head_auto, "warmup_steps_calibrated_ms": head_cal,
            "after_auto_ms": rest_auto, "after_calibrated_ms": rest_cal,
            "calibration_work_ms_slowest_rank": float(obs),
            # what the default costs: the extra time of the steps up to and including the fit, over the run
            "warmup_cost_fraction": (head_auto - head_cal) / t_cal,
            "total_ratio_auto_over_calibrated": t_auto / t_cal,
            "fit": reports[0].summary() if reports else None,
            "pilot_fit": report.summary()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["overhead", "throughput", "calibration", "warmup"])
    ap.add_argument("--workload", choices=["short", "demo", "long"], default="short",
                    help="short: the demo's paired tasks (10-130 tokens); demo: every task (up to 3,000 tokens); "
                         "long: the paired tasks beside whole manual pages (data/demo/long.json, up to 8,190 tokens)")
    i = _check.arg_int
    ap.add_argument("--iterations", type=i(1, _check.MAX_COUNT), default=6)
    ap.add_argument("--rounds", type=i(1, 10 ** 6), default=3)
    ap.add_argument("--tokens", type=i(1, _check.MAX_COUNT), default=4096, help="global batch tokens")
    ap.add_argument("--hidden", type=i(4, 2 ** 20), default=128, help="model width (a multiple of its 4 heads)")
    ap.add_argument("--layers", type=i(1, 2 ** 16), default=4)
    ap.add_argument("--vocab", type=i(1, 2 ** 31 - 1), default=2048)
    ap.add_argument("--grid", type=i(1, 2 ** 31), nargs="+", default=[2, 4, 8], help="baseline micro-batch sizes")
    ap.add_argument("--only", nargs="+", default=[],
                    help="throughput: only the baseline settings whose name contains one of these texts "
                         "(e.g. 'packing (capacity 128 x 2' wlb); packpipe always runs")
    ap.add_argument("--budgets", type=i(1, 2 ** 20), nargs="+", default=[1, 2, 4],
                    help="throughput: token budgets and WLB capacities, in multiples of the longest sample's power of 2")
    ap.add_argument("--slice-fractions", type=i(1, 2 ** 20), nargs="+", default=None,
                    help="throughput: the slicing baseline's slice lengths, as divisors of the longest sample's "
                         "power of 2 (default: 16 8 4 2 on the long workload, none otherwise)")
    ap.add_argument("--seed", type=i(0, 2 ** 63 - 1), default=5)
    ap.add_argument("--calibration-passes", type=i(1, 16), default=2,
                    help="throughput: calibration passes (2: the first fit's plans are measured and fitted again)")
    ap.add_argument("--calibrate-after", type=i(1, _check.MAX_COUNT), default=20,
                    help="calibration: measured iterations before the fit")
    ap.add_argument("--warmup", type=i(0, _check.MAX_COUNT), default=1, help="calibration: first iterations not measured")
    ap.add_argument("--pp", type=i(0, _check.MAX_PIPELINE, "0: every rank"), default=0,
                    help="pipeline ranks (default: every rank)")
    ap.add_argument("--out", help="write the JSON result here (rank 0)")
    a = ap.parse_args()
    if a.hidden % 4:
        ap.error(f"--hidden {a.hidden} must be a multiple of the model's 4 heads")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if a.pp and world % a.pp:
        ap.error(f"--pp {a.pp} must divide the {world} ranks started")
    tmp = tempfile.mkdtemp(prefix="packpipe-bench-")
    # The result file is checked before any collective and any measurement: never an input (the
    # manifest, a dataset file, this script), writable on rank 0, which writes it.
    inputs = packpipe.dataset_files(packpipe.MultiTaskDataset(manifest(a.workload, tmp))) + [os.path.abspath(__file__)]
    try:
        packpipe.check_outputs({"--out": a.out}, inputs, probe=os.environ.get("RANK", "0") == "0")
    except ValueError as e:
        ap.error(str(e))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("WORLD_SIZE", "1"))))
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    pp = a.pp or world
    groups = pt.ProcessGroups.create(pp, world // pp)
    out = {"overhead": overhead, "throughput": throughput, "calibration": calibration,
           "warmup": warmup}[a.mode](a, groups, tmp)
    out["torch"] = torch.__version__
    out["threads_per_rank"] = torch.get_num_threads()
    if dist.get_rank() == 0:
        text = json.dumps(out, indent=1)
        print(text)
        if a.out:
            packpipe.write_file_atomic(a.out, text, inputs=inputs, what="--out")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

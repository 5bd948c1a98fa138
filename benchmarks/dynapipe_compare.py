#!/usr/bin/env python3
"""DynaPipe's planner against packpipe's on the same global batches and the same cost basis.

DynaPipe's own micro-batch planner (DataAssignmentOptimizer.generate_microbatches: its C++ tau-DP,
its budget and recompute rule) runs unchanged from a checkout of
awslabs/optimizing-multitask-training-through-dynamic-pipelines (d8666ad) outside this repository,
on its A100 profiles (../shared/fixtures/dynapipe). packpipe partitions the same batches on the same
basis: its DynaPipe cost basis (the same objective, per-layer costs and memory rule) over the same
profiles interpolated by DynaPipe's rule (--profile-interpolation linear), with a recompute mode per
micro-batch. Both partitions are then re-costed by one evaluator on DynaPipe's own interpolators:

    objective = (S - 1) * max_j t_j + sum_j t_j       (c = 1, d = 1; realised max, not the cap)
    t = l * (F + B) (+ post-process), stored = l * s, peak = a + (l - 1) * s per micro-batch,
    stored <= (limit - model state) / S, peak <= limit - model state

and each micro-batch's memory is checked by both models' estimates (DynaPipe's interpolators, and
packpipe's default profiled model) under that rule. Reported per set (GPT-6.7B 16 layers / T5-11B
12 + 12, 64K-token and 4,096-sample batches, S = 4 and 8, 36,000 MB as in DynaPipe's configs):
packpipe / DynaPipe objective (median, worst), micro-batches over the limit by either estimate,
and packpipe's default settings (stage basis, its own interpolation) re-costed the same way for
reference.

Running DynaPipe here: its planner needs numpy, scipy and its pybind11 extension dp_helper, which
this script compiles with g++ against Debian's pybind11 headers (python3 -m pybind11 is not
installed). elkai (a git-only TSP fork), prtpy and scikit-learn are imported at module level but
used only for the TSP order of encoder-decoder batches and for dp > 1; they are not installable
without PyPI, so stand-ins that raise if called are registered, and T5 runs with disable_tsp (the
sorted order, as DynaPipe's own T5 planning-time figure). The T5 profile measures recompute "none"
only: DynaPipe's selective and full grids are filled with packpipe's derived values at the same
nodes (the profiled forward recomputed, docs/design/003), so both planners see the same costs.

    git clone https://github.com/awslabs/optimizing-multitask-training-through-dynamic-pipelines /tmp/dynapipe
    PYTHONPATH=build/python /usr/bin/python3 benchmarks/dynapipe_compare.py --dynapipe /tmp/dynapipe
    ... --smoke          (one 64K batch per model at S = 4, seconds)
    ... --json out.json  (every batch)
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import csv
import io
import json
import logging
import math
import os
import pathlib
import statistics
import subprocess
import sys
import sysconfig
import time
import types

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
RC = ("none", "selective", "full")
LIMIT_MB = 36000.0
MODELS = {  # packpipe preset, fixture prefix, layers (DynaPipe's experiment configs), encoder-decoder
    "gpt": ("gpt-6.7b", "gpt_6.7b", 16, False),
    "t5": ("t5-11b", "t5_11b", 24, True),
}


# ---- DynaPipe ---------------------------------------------------------------------------------

def import_dynapipe(src: pathlib.Path):
    """DynaPipe's optimizer and cost model classes from a checkout, its extension built here."""
    for name in ("elkai", "prtpy", "sklearn", "sklearn.cluster"):
        mod = types.ModuleType(name)

        def missing(*_a, _name=name, **_k):
            raise RuntimeError(f"{_name} is not installed here (no PyPI); this benchmark does not use it")
        for attr in ("solve_int_matrix", "partition", "AgglomerativeClustering"):
            setattr(mod, attr, missing)
        mod.partitioning = types.SimpleNamespace(kk=None)
        sys.modules.setdefault(name, mod)
    data_opt = src / "dynapipe" / "data_opt"
    if not (data_opt / "dp_helper.cpp").is_file():
        sys.exit(f"{src}: not a checkout of DynaPipe (no dynapipe/data_opt/dp_helper.cpp)")
    ext = data_opt / ("dp_helper" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not ext.exists() or ext.stat().st_mtime < (data_opt / "dp_helper.cpp").stat().st_mtime:
        cmd = [os.environ.get("CXX", "g++"), "-O3", "-shared", "-std=c++11", "-fPIC",
               "-I" + sysconfig.get_paths()["include"], str(data_opt / "dp_helper.cpp"), "-o", str(ext)]
        print("building DynaPipe's dp_helper:", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True)
    sys.path.insert(0, str(src))
    # The optimizer runs `make` at import to build the extension; it is built above.
    real_run = subprocess.run

    def no_make(args, *a, **k):
        if isinstance(args, list) and args[:1] == ["make"]:
            return subprocess.CompletedProcess(args, 0)
        return real_run(args, *a, **k)
    subprocess.run = no_make
    try:
        from dynapipe.data_opt.cost_models import ProfileBasedCostModel, ProfileBasedCostModelWithRC
        from dynapipe.data_opt.optimizer import DataAssignmentOptimizer
    finally:
        subprocess.run = real_run
    logging.getLogger().setLevel(logging.WARNING)
    for name in list(logging.root.manager.loggerDict):
        logging.getLogger(name).setLevel(logging.WARNING)
    return ProfileBasedCostModel, ProfileBasedCostModelWithRC, DataAssignmentOptimizer


def seqlen_key(stage: str, enc: int, dec: int):
    """DynaPipe's grid key of a point (cost_models.py _read_profile_data)."""
    if stage == "decoder":
        return (enc, dec)
    if stage == "postprocess":
        return enc if dec == 0 else dec
    return enc


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def dynapipe_cost_model(classes, fixtures: pathlib.Path, prefix: str, derived=None):
    """DynaPipe's ProfileBasedCostModelWithRC from the fixture CSVs (the pickles' numbers), laid out as
    its profile reader lays them out; `derived` adds (tp, rc) grids from (stage, train, key, mbs) values."""
    PBCM, WithRC, _ = classes
    timing = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    stored = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    peak = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    state = collections.defaultdict(dict)
    for r in read_csv(fixtures / f"{prefix}_timing.csv"):
        enc, dec, mbs, t = int(r["enc_seqlen"]), int(r["dec_seqlen"]), int(r["mbs"]), float(r["time_ms_per_layer"])
        seq = enc if (r["lm_stage"] == "encoder" or dec == 0) else dec
        timing[(int(r["tp"]), r["rc"])][(r["lm_stage"], r["train_stage"])][seqlen_key(r["lm_stage"], enc, dec)].append(
            (mbs, t, mbs * seq / t))
    for r in read_csv(fixtures / f"{prefix}_activation.csv"):
        key = seqlen_key(r["lm_stage"], int(r["enc_seqlen"]), int(r["dec_seqlen"]))
        stored[(int(r["tp"]), r["rc"])][r["lm_stage"]][key].append((int(r["mbs"]), float(r["stored_activation_MB_per_layer"])))
        peak[(int(r["tp"]), r["rc"])][r["lm_stage"]][key].append((int(r["mbs"]), float(r["peak_activation_MB"])))
    for r in read_csv(fixtures / f"{prefix}_model_state.csv"):
        state[(int(r["tp"]), r["rc"])][r["lm_stage"]] = float(r["param_MB_per_layer"])
    for cm_key, grids in (derived or {}).items():
        for (stage, what, key, mbs), value in grids.items():
            if what in ("forward", "backward"):
                seq = key if isinstance(key, int) else key[1]
                timing[cm_key][(stage, what)][key].append((mbs, value, mbs * seq / value))
            else:
                (stored if what == "stored" else peak)[cm_key][stage][key].append((mbs, value))
        state[cm_key] = dict(state[(cm_key[0], "none")])
    models = {}
    for cm_key in timing:
        def sort(d):
            return {k: {s: sorted(v) for s, v in by.items()} for k, by in d.items()}
        models[cm_key] = PBCM(_timing_data=sort(timing[cm_key]), _stored_activation_data=sort(stored[cm_key]),
                              _peak_activation_data=sort(peak[cm_key]), _model_state_data=state[cm_key],
                              _max_throughput_achieved={})
    cm = WithRC.__new__(WithRC)
    cm.cost_models = models
    return cm


def derived_nodes(packpipe, linear_cm, fixtures: pathlib.Path, prefix: str):
    """For a profile measuring recompute 'none' only: packpipe's derived selective and full values at
    every 'none' node, in DynaPipe's units (ms per layer with the recompute in the backward; MB;
    absolute peak)."""
    out = {}
    nodes = set()
    for r in read_csv(fixtures / f"{prefix}_timing.csv"):
        nodes.add((r["lm_stage"], r["train_stage"], int(r["enc_seqlen"]), int(r["dec_seqlen"]), int(r["mbs"])))
    for r in read_csv(fixtures / f"{prefix}_activation.csv"):
        nodes.add((r["lm_stage"], "memory", int(r["enc_seqlen"]), int(r["dec_seqlen"]), int(r["mbs"])))
    for rc in ("selective", "full"):
        grids = {}
        for stage, what, enc, dec, mbs in sorted(nodes):
            q = linear_cm.query(kind=stage, mbs=mbs, seq=enc, dec_seq=dec, recompute=rc)
            key = seqlen_key(stage, enc, dec)
            if what == "forward":
                grids[(stage, "forward", key, mbs)] = q.forward_ms
            elif what == "backward":
                grids[(stage, "backward", key, mbs)] = q.backward_ms + q.recompute_ms
            else:
                grids[(stage, "stored", key, mbs)] = q.stored_bytes / 1e6
                grids[(stage, "peak", key, mbs)] = (q.stored_bytes + q.peak_bytes) / 1e6
        out[(1, rc)] = grids
    return out


# ---- the common evaluator: DynaPipe's per-micro-batch rule on a cost model ------------------------

def round8(v: int, decoder=False) -> int:
    """DynaPipe's C++ rounding (seqlen_offset 0): up to a multiple of 8, decoder + 2 tokens first."""
    if v == 0:
        return 0
    return (v + (2 if decoder else 0) + 7) // 8 * 8


class DynaPipeCosts:
    """Window time and memory by DynaPipe's formula (dp_helper.cpp) on its interpolators."""

    def __init__(self, cm, layers: int):
        self.cm, self.l = cm, layers

    def window(self, rc: str, le: int, ld: int, m: int):
        c = self.cm.get_raw_cost_model(1, rc)
        te = (c.get_cost("Encoder FW", le, m) + c.get_cost("Encoder BW", le, m)) * self.l
        td = 0.0
        if ld > 0:
            td = (c.get_cost("Decoder FW", (le, ld), m) + c.get_cost("Decoder BW", (le, ld), m)) * self.l
            td += c.get_cost("Postprocess FW", ld, m) + c.get_cost("Postprocess BW", ld, m)
        else:
            te += c.get_cost("Postprocess FW", le, m) + c.get_cost("Postprocess BW", le, m)
        se = c.get_stored_activation("Encoder", le, m)
        sd = c.get_stored_activation("Decoder", (le, ld), m) if ld > 0 else 0.0
        pe = c.get_peak_activation("Encoder", le, m)
        pd = c.get_peak_activation("Decoder", (le, ld), m) if ld > 0 else 0.0
        s = max(se, sd)
        return max(te, td), self.l * s, max(pe, pd) + (self.l - 1) * s


class PackpipeCosts:
    """The same formula on packpipe's (default) profiled cost model: packpipe's memory estimate."""

    def __init__(self, cm, layers: int):
        self.cm, self.l = cm, layers

    def window(self, rc: str, le: int, ld: int, m: int):
        def q(kind, seq=le):
            return self.cm.query(kind=kind, mbs=m, seq=seq, dec_seq=ld, recompute=rc)
        e, p = q("encoder"), q("postprocess")
        te, td = self.l * e.total_ms, 0.0
        sd = ad = 0.0
        if ld > 0:
            d = q("decoder")
            td = self.l * d.total_ms + p.total_ms
            sd, ad = d.stored_bytes / 1e6, (d.stored_bytes + d.peak_bytes) / 1e6
        else:
            te += p.total_ms
        s = max(e.stored_bytes / 1e6, sd)
        return max(te, td), self.l * s, max((e.stored_bytes + e.peak_bytes) / 1e6, ad) + (self.l - 1) * s


def shape_of(mb, x, y):
    le = round8(max(int(x[i]) for i in mb))
    ld = round8(max(int(y[i]) for i in mb), decoder=True) if y is not None else 0
    return le, ld


def evaluate(costs, mbs, rcs, x, y, S, stored_limit, peak_limit):
    """Objective (S - 1) max + sum of `mbs` (lists of sample ids) under their modes `rcs`; memory
    checked per micro-batch (stored / stored_limit, peak / peak_limit); a refused shape counts as over."""
    times, stored, over, worst = [], [], 0, 0.0
    for mb, rc in zip(mbs, rcs):
        le, ld = shape_of(mb, x, y)
        try:
            t, s, p = costs.window(rc, le, ld, len(mb))
        except ValueError:  # packpipe refuses what DynaPipe costs at 1e100
            t, s, p = math.inf, math.inf, math.inf
        times.append(t)
        stored.append(s)
        use = max(s / stored_limit, p / peak_limit)
        worst = max(worst, use)
        over += use > 1 + 1e-9
    return {"objective": (S - 1) * max(times) + sum(times), "max": max(times), "sum": sum(times), "over": over,
            "worst_memory_use": worst, "stored_mb": stored}


# ---- batches ------------------------------------------------------------------------------------

def lognormal(rng, median, sigma, cap, n):
    return np.clip(np.round(median * np.exp(sigma * rng.standard_normal(n))), 1, cap).astype(np.int64)


def make_batch(t5: bool, kind: str, seed: int):
    """benchmarks/bench_partition.cpp's synthetic batches: log-normal lengths, median 200, sigma 1
    (GPT <= 2048; T5 input <= 1536, target median 60 <= 512); 64K tokens (input + target) or 4,096 samples."""
    rng = np.random.default_rng(seed)
    cap = 1536 if t5 else 2048
    if kind == "4096":
        x = lognormal(rng, 200, 1.0, cap, 4096)
        return x, (lognormal(rng, 60, 1.0, 512, 4096) if t5 else None)
    xs, ys, tokens = [], [], 0
    while True:
        a = int(lognormal(rng, 200, 1.0, cap, 1)[0])
        b = int(lognormal(rng, 60, 1.0, 512, 1)[0]) if t5 else 0
        if tokens + a + b > 65536:
            break
        xs.append(a)
        ys.append(b)
        tokens += a + b
    return np.array(xs), (np.array(ys) if t5 else None)


# ---- one batch ----------------------------------------------------------------------------------

def run_batch(packpipe, env, model: str, kind: str, S: int, seed: int):
    preset, _, layers, t5 = MODELS[model]
    l = layers // S
    x, y = make_batch(t5, kind, seed)
    ux = x.astype(np.uint32)
    uy = None if y is None else y.astype(np.uint32)
    # DynaPipe's planner, unchanged.
    opt = env["Optimizer"](env["dyn_cm"][model], None, n_executors=S, n_layers_per_stage=l, n_chunks_per_device=1,
                           dp_size=1, tp_size=1, zero_stage=0, device_memory_limit=LIMIT_MB, round_seqlen_multiple=8)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        obj, mbs, memory_type, rc, mem = opt.generate_microbatches(
            [int(v) for v in x], available_rc_types=list(RC),
            decoder_sample_sequence_lengths=None if y is None else [int(v) for v in y],
            disable_tsp=True, partition_method="dp", enable_packing=False)
    dyn_s = time.perf_counter() - t0
    if obj is None:
        return {"model": model, "kind": kind, "S": S, "seed": seed, "samples": len(x), "dynapipe": None}
    available, state, stored_limit = mem
    dyn_mbs = [[i for seq in mb for i in seq] for mb in mbs[0]]
    # packpipe on the same basis: the DynaPipe cost basis, DynaPipe's interpolation, a mode per micro-batch.
    shape = packpipe.PipelineShape(stages=S, layers_per_stage=l, memory_mb=LIMIT_MB, zero=0)
    t0 = time.perf_counter()
    same = packpipe.partition(env["pp_linear"][model], ux, uy, shape=shape,
                              options=packpipe.PartitionOptions(method="dp", cost_basis="dynapipe", recompute="auto",
                                                                threads=1))
    pp_s = time.perf_counter() - t0
    # packpipe's defaults (stage basis, its own interpolation), for reference.
    default = packpipe.partition(env["pp_fit"][model], ux, uy, shape=shape, options=packpipe.PartitionOptions(threads=1))

    dyn_costs, pp_costs = env["dyn_costs"][(model, S)], env["pp_costs"][(model, S)]
    row = {"model": model, "kind": kind, "S": S, "seed": seed, "samples": len(x),
           "dynapipe": {"objective_charged": float(obj[0]), "tau": float(obj[1]), "microbatches": len(dyn_mbs),
                        "rc": rc, "budget": memory_type, "seconds": dyn_s,
                        "available_mb": available, "state_mb": state, "stored_limit_mb": stored_limit}}
    evals = {}
    for name, part_mbs, rcs in (("dynapipe", dyn_mbs, [rc] * len(dyn_mbs)),
                                ("packpipe", [list(map(int, m.samples)) for m in same.microbatches],
                                 [m.recompute for m in same.microbatches])):
        evals[name] = {est: evaluate(costs, part_mbs, rcs, x, y, S, stored_limit, available)
                       for est, costs in (("dynapipe_estimate", dyn_costs), ("packpipe_estimate", pp_costs))}
    # packpipe's defaults re-costed with the cheapest mode that fits DynaPipe's rule per micro-batch.
    d_mbs = [list(map(int, m.samples)) for m in default.microbatches]
    d_rcs = []
    for mb in d_mbs:
        le, ld = shape_of(mb, x, y)
        fits = []
        for r in RC:
            t, s, p = dyn_costs.window(r, le, ld, len(mb))
            if s <= stored_limit and p <= available:
                fits.append((t, r))
        d_rcs.append(min(fits)[1] if fits else "full")
    default_eval = evaluate(dyn_costs, d_mbs, d_rcs, x, y, S, stored_limit, available)
    # ... and with the modes packpipe chose for them on its stage basis: the micro-batches DynaPipe's
    # per-micro-batch rule refuses.
    default_own = evaluate(dyn_costs, d_mbs, [m.recompute for m in default.microbatches], x, y, S, stored_limit,
                           available)
    # The other way round: DynaPipe's micro-batches on packpipe's default basis (stage basis, its
    # interpolation), the cheapest mode that fits there; a micro-batch that fits no mode is counted.
    try:
        rev = packpipe.evaluate_partition(env["pp_fit"][model], ux, uy, microbatches=dyn_mbs, shape=shape,
                                          basis="stages").objective_ms
        row["reverse_ratio"] = default.objective_ms / rev
    except ValueError:
        row["reverse_ratio"] = None
    base = evals["dynapipe"]["dynapipe_estimate"]["objective"]
    row["packpipe"] = {"objective": same.objective_ms, "microbatches": len(same.microbatches), "seconds": pp_s,
                       "rc": dict(collections.Counter(m.recompute for m in same.microbatches))}
    row["eval"] = evals
    row["ratio"] = evals["packpipe"]["dynapipe_estimate"]["objective"] / base
    row["ratio_vs_charged"] = evals["packpipe"]["dynapipe_estimate"]["objective"] / float(obj[0])
    row["default_ratio"] = default_eval["objective"] / base
    row["default_over"] = default_eval["over"]
    row["default_over_own_rc"] = default_own["over"]
    # Memory agreement: packpipe's stored estimate of each of its micro-batches / DynaPipe's.
    pp_est = evals["packpipe"]
    row["stored_agreement"] = [a / b - 1 for a, b in zip(pp_est["packpipe_estimate"]["stored_mb"],
                                                         pp_est["dynapipe_estimate"]["stored_mb"])]
    for est in pp_est.values():
        est.pop("stored_mb")
    for est in evals["dynapipe"].values():
        est.pop("stored_mb")
    return row


def setup(packpipe, classes, fixtures: pathlib.Path, models):
    env = {"Optimizer": classes[2], "dyn_cm": {}, "pp_linear": {}, "pp_fit": {}, "dyn_costs": {}, "pp_costs": {}}
    for model in models:
        preset, prefix, layers, t5 = MODELS[model]
        files = [str(fixtures / f"{prefix}_{k}.csv") for k in ("timing", "activation", "model_state")]
        env["pp_linear"][model] = packpipe.CostModel(preset, "A100-40GB", files, interpolation="linear")
        env["pp_fit"][model] = packpipe.CostModel(preset, "A100-40GB", files)
        derived = derived_nodes(packpipe, env["pp_linear"][model], fixtures, prefix) if t5 else None
        env["dyn_cm"][model] = dynapipe_cost_model(classes, fixtures, prefix, derived)
        for S in (4, 8):
            env["dyn_costs"][(model, S)] = DynaPipeCosts(env["dyn_cm"][model], layers // S)
            env["pp_costs"][(model, S)] = PackpipeCosts(env["pp_fit"][model], layers // S)
    return env


def summarize(rows):
    print("ratio: packpipe (DynaPipe basis, linear interpolation) / DynaPipe, realised objectives on DynaPipe's "
          "interpolators; over: micro-batches over the limit by DynaPipe's / packpipe's estimate; stored: packpipe's "
          "estimate / DynaPipe's - 1 on packpipe's micro-batches (median [min, max]); defaults: packpipe's default "
          "settings re-costed with the cheapest mode that fits DynaPipe's rule (median/worst; over with their own "
          "modes), and packpipe's default objective / DynaPipe's micro-batches on packpipe's default basis")
    print(f"{'set':14s} {'n':>2s}  {'ratio median / worst':>22s}  {'over pp|dyn':>11s}  {'stored agreement':>24s}"
          f"  {'defaults':>24s}  {'mbs dyn/pp':>10s}  {'plan s dyn/pp':>14s}")
    sets = collections.OrderedDict()
    for r in rows:
        sets.setdefault((r["model"], r["kind"], r["S"]), []).append(r)
    out = []
    for (model, kind, S), rs in sets.items():
        ok = [r for r in rs if r["dynapipe"] is not None]
        if not ok:
            print(f"{model}-{kind}-S{S}: DynaPipe found no feasible partition")
            continue
        ratios = [r["ratio"] for r in ok]
        charged = [r["ratio_vs_charged"] for r in ok]
        dflt = [r["default_ratio"] for r in ok]
        over_pp = [sum(r["eval"]["packpipe"][est]["over"] for r in ok) for est in ("dynapipe_estimate", "packpipe_estimate")]
        over_dyn = [sum(r["eval"]["dynapipe"][est]["over"] for r in ok) for est in ("dynapipe_estimate", "packpipe_estimate")]
        agree = [v for r in ok for v in r["stored_agreement"]]
        rev = [r["reverse_ratio"] for r in ok if r.get("reverse_ratio") is not None]
        s = {"set": f"{model}-{kind}-S{S}", "batches": len(ok), "ratio_median": statistics.median(ratios),
             "ratio_worst": max(ratios), "ratio_vs_charged_worst": max(charged),
             "default_ratio_median": statistics.median(dflt), "default_ratio_worst": max(dflt),
             "packpipe_over": over_pp, "dynapipe_over": over_dyn,
             "default_over_own_rc": sum(r["default_over_own_rc"] for r in ok),
             "reverse_ratio_median": statistics.median(rev) if rev else None,
             "stored_agreement_median": statistics.median(agree), "stored_agreement_min": min(agree),
             "stored_agreement_max": max(agree),
             "mbs": (statistics.median(r["dynapipe"]["microbatches"] for r in ok),
                     statistics.median(r["packpipe"]["microbatches"] for r in ok)),
             "seconds": (statistics.median(r["dynapipe"]["seconds"] for r in ok),
                         statistics.median(r["packpipe"]["seconds"] for r in ok))}
        out.append(s)
        rv = f"{s['reverse_ratio_median']:.4f}" if rev else "  -   "
        print(f"{s['set']:14s} {len(ok):2d}  {s['ratio_median']:.5f} / {s['ratio_worst']:.5f}"
              f"  {over_pp[0]}/{over_pp[1]}|{over_dyn[0]}/{over_dyn[1]}"
              f"  {100 * s['stored_agreement_median']:+5.2f}% [{100 * s['stored_agreement_min']:+5.1f}, "
              f"{100 * s['stored_agreement_max']:+4.1f}]"
              f"  {s['default_ratio_median']:.4f}/{s['default_ratio_worst']:.4f} ({s['default_over_own_rc']}) {rv}"
              f"  {s['mbs'][0]:4.0f}/{s['mbs'][1]:<4.0f}  {s['seconds'][0]:6.2f}/{s['seconds'][1]:.4f}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--dynapipe", default=os.environ.get("DYNAPIPE_SRC"),
                    help="checkout of awslabs/optimizing-multitask-training-through-dynamic-pipelines (or $DYNAPIPE_SRC)")
    ap.add_argument("--fixtures", default=str(ROOT.parent / "shared" / "fixtures" / "dynapipe" / "derived_from_cost_models_pkl"))
    try:
        import packpipe
    except ImportError:
        sys.path.insert(0, str(ROOT / "build" / "python"))
        import packpipe
    from packpipe import _check
    ap.add_argument("--batches", type=_check.arg_int(1, 10 ** 6), default=5, help="64K-token batches per set")
    ap.add_argument("--batches-4096", type=_check.arg_int(1, 10 ** 6), default=3, help="4,096-sample batches per set")
    ap.add_argument("--models", default="gpt,t5")
    ap.add_argument("--kinds", default="64K,4096")
    ap.add_argument("--stages", type=_check.arg_ints(1, _check.MAX_PIPELINE), default=[4, 8])
    ap.add_argument("--smoke", action="store_true", help="one 64K batch per model at S = 4")
    ap.add_argument("--json", help="write every batch's figures here")
    a = ap.parse_args(argv)
    if not a.dynapipe:
        ap.error("--dynapipe DIR (a checkout of DynaPipe) is required")
    for flag, value, known in (("--models", a.models, ("gpt", "t5")), ("--kinds", a.kinds, ("64K", "4096"))):
        bad = [x for x in value.split(",") if x not in known]
        if bad or not value:
            ap.error(f"{flag}: expected a comma-separated subset of {', '.join(known)}, found '{value}'")
    # What the run reads (the fixtures, DynaPipe's checkout, this script) is never its --json.
    inputs = [str(p) for d in (a.fixtures, a.dynapipe) for p in pathlib.Path(d).rglob("*") if p.is_file()]
    try:
        packpipe.check_outputs({"--json": a.json}, inputs + [os.path.abspath(__file__)])
    except ValueError as e:
        ap.error(str(e))
    classes = import_dynapipe(pathlib.Path(a.dynapipe))
    models = a.models.split(",")
    kinds, stages = a.kinds.split(","), a.stages
    counts = {"64K": a.batches, "4096": a.batches_4096}
    if a.smoke:
        kinds, stages, counts = ["64K"], [4], {"64K": 1}
    env = setup(packpipe, classes, pathlib.Path(a.fixtures), models)
    rows = []
    for model in models:
        for kind in kinds:
            for S in stages:
                for k in range(counts[kind]):
                    seed = 1000 * (model == "t5") + 100 * (kind == "4096") + k
                    r = run_batch(packpipe, env, model, kind, S, seed)
                    rows.append(r)
                    if r["dynapipe"] is not None:
                        print(f"  {model}-{kind}-S{S} seed {seed}: {r['samples']} samples, ratio {r['ratio']:.5f} "
                              f"(DynaPipe rc {r['dynapipe']['rc']}, {r['dynapipe']['budget']} budget; packpipe rc "
                              f"{r['packpipe']['rc']}), defaults {r['default_ratio']:.4f}", file=sys.stderr)
    summary = summarize(rows)
    if a.json:
        packpipe.write_file_atomic(a.json, json.dumps({"rows": rows, "summary": summary}, indent=1, default=str),
                                   inputs=inputs + [os.path.abspath(__file__)], what="--json")
    bad = [s for s in summary if s["ratio_worst"] > 1 + 1e-9 or s["packpipe_over"][0] or s["packpipe_over"][1]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

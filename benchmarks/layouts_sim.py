#!/usr/bin/python3
"""Simulated, not measured: packpipe against the baselines a user would run in 2026, on the GPU presets.

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/layouts_sim.py --out layouts_sim.json

For GPT-6.7B (16 layers) and T5-11B (12 + 12 layers) on A100-40GB and H100-80GB, S = 4 and 8
pipeline stages, global batches of 64K tokens (the embedded demo dataset's) and of 4,096 samples
(log-normal lengths, median 200, as benchmarks/bench_partition.cpp draws them): each batch is planned
by packpipe.plan_batch with every baseline of the grid (fixed, token budgets, varlen packing over row
counts, WLB-LLM's attention-balanced packing, and DynaPipe's dense packing), on the analytic cost
model, each as its system runs it (--baseline-schedule as-run: 1F1B over its order) or under
packpipe's own schedule search (search: the speed-up is the partition's alone). Per set: packpipe's simulated iteration time against the best
setting of each baseline family (the least total over the set's batches, as a user fixes one setting),
the speed-up over the fastest baseline (named), over varlen packing and over dense packing, and the
planning time. Every figure is simulated (the cost model's), none measured.

Long-context mixtures (benchmarks/long_mixtures.py: LongAlign-like up to 64K tokens, ChatQA 2-like
up to 128K, 256K-token batches) are planned for Llama-7B on 8 H100 stages and GPT-6.7B on 4 A100-80GB
stages (4 layers a stage, --long-sets), where the grid adds fixed-length slicing (Seq1F1B-like, slices
of C/16 to C/2) and packpipe may cut long samples into slices. Each set also gives the speed-up
batch by batch over that batch's best baseline setting (median and least), and how many samples
were truncated or dropped (none should be: every sample here fits when sliced). It also gives the
ceiling of any plan cut from these partitions: that batch's best baseline over the least makespan
lower bound (rank work or critical path, no bubble at all) among packpipe's own partition and every
slicing setting's, with their recompute variants. A speed-up goal above the ceiling cannot be met by
a better schedule of these micro-batches; only less work (fewer recomputed slices, more efficient
kernels) would reach it.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import packpipe
from packpipe import _check

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import long_mixtures  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lognormal(rng, n, median, sigma, cap):
    return np.clip(rng.lognormal(np.log(median), sigma, n), 1, cap).astype(np.uint32)


def batches(kind, model, count, seed):
    """`count` global batches: (input lengths, target lengths or None)."""
    encdec = model.startswith("t5")
    rng = np.random.default_rng(seed)
    out = []
    if kind == "64K":
        # The demo dataset's global batches as the epoch planner samples them for this model (a
        # small pipeline: only the lengths are kept), lengths capped as the profiles' grids are.
        data = packpipe.MultiTaskDataset(os.path.join(ROOT, "data", "demo", "manifest.json"))
        epoch = packpipe.plan_epoch(packpipe.CostModel(model), data, global_batch_tokens=65536, seed=seed,
                                    iterations=count, baselines=False,
                                    options=packpipe.PartitionOptions(layouts=("padded",), oversize="truncate"),
                                    shape=packpipe.PipelineShape(stages=8, layers_per_stage=3 if encdec else 2))
        for it in epoch:
            inp = np.asarray(it.input_lengths)
            if encdec:
                tgt = np.asarray(it.target_lengths)
                out.append((np.clip(inp, 1, 1536).astype(np.uint32), np.clip(tgt, 1, 512).astype(np.uint32)))
            else:
                out.append((np.clip(inp, 1, 2048).astype(np.uint32), None))
        return out
    for _ in range(count):
        if encdec:
            out.append((lognormal(rng, 4096, 200, 1, 1536), lognormal(rng, 4096, 60, 1, 512)))
        else:
            out.append((lognormal(rng, 4096, 200, 1, 2048), None))
    return out


def least_lower_bound(cm, inp, shape, slicing_settings):
    """The least makespan lower bound (ms) among packpipe's own partition of `inp` and the slicing
    method's at each of `slicing_settings` (grid labels), each with its recompute variants."""
    parts = [packpipe.partition(cm, inp, shape=shape)]
    for s in slicing_settings:
        cap = int(s.split("slices of ")[1].split(" ")[0])
        try:
            parts.append(packpipe.partition(cm, inp, shape=shape,
                                            options=packpipe.PartitionOptions(method="slicing", capacity=cap)))
        except ValueError:  # does not fit: no bound from it
            continue
    return min(packpipe.ScheduleProblem(cm, q, shape=shape).lower_bound_ms
               for p in parts for q in [p, *p.alternatives])


def run_set(model, device, stages, kind, count, seed, layers_per_stage=None, baseline_schedule="as-run"):
    encdec = model.startswith("t5")
    cm = packpipe.CostModel(model, device)
    layers = 24 if encdec else 16
    shape = packpipe.PipelineShape(stages=stages, layers_per_stage=layers_per_stage or layers // stages,
                                   memory_mb=36000 if device == "A100-40GB" else 72000)
    rows = []
    sets = ([(x, None) for x in long_mixtures.batches(kind, count, seed)] if kind in long_mixtures.MIXTURES
            else batches(kind, model, count, seed))
    for inp, tgt in sets:
        t0 = time.perf_counter()
        r = packpipe.plan_batch(cm, inp, tgt, shape=shape, baselines=True, baseline_mbs=[1, 2, 4, 8, 16],
                                baseline_schedule=baseline_schedule)
        wall = (time.perf_counter() - t0) * 1e3
        # planning as a trainer runs it: no report; long-context batches on one thread (the goal's terms)
        one = kind in long_mixtures.MIXTURES
        quiet0 = time.perf_counter()
        q = packpipe.plan_batch(cm, inp, tgt, shape=shape, baselines=False,
                                options=packpipe.PartitionOptions(threads=1) if one else packpipe.PartitionOptions())
        quiet_ms = (time.perf_counter() - quiet0) * 1e3
        assert q.packpipe.iteration_ms == r.packpipe.iteration_ms
        base = {b.setting: (b.family, b.figures.iteration_ms if b.figures.feasible else float("inf"))
                for b in r.baselines}
        run = [t for f, t in base.values() if f != "packing-mask"]
        seq1f1b = {}
        if kind in long_mixtures.MIXTURES:
            # Seq1F1B as published: the slicing method's partition under 1F1B (whatever
            # --baseline-schedule gives the grid's slicing settings above)
            for s, (fam, _) in base.items():
                if fam != "slicing":
                    continue
                cap = int(s.split("slices of ")[1].split(" ")[0])
                try:
                    q1 = packpipe.plan_batch(cm, inp, shape=shape, schedule="1f1b",
                                             options=packpipe.PartitionOptions(method="slicing", capacity=cap))
                    seq1f1b[s] = q1.packpipe.iteration_ms
                except ValueError:
                    seq1f1b[s] = float("inf")
        least_lb = None
        if kind in long_mixtures.MIXTURES:
            least_lb = least_lower_bound(cm, inp, shape, [s for s, (fam, _) in base.items() if fam == "slicing"])
        rows.append({"packpipe_ms": r.packpipe.iteration_ms, "source": r.source, "baselines": base,
                     "least_lower_bound_ms": least_lb,
                     "best_baseline_ms": min(run), "longest": int(np.max(inp)),
                     "seq1f1b_ms": min(seq1f1b.values()) if seq1f1b else None,
                     "refused": {"truncated": r.truncated, "dropped": r.dropped},
                     "sliced_entries": sum(1 for p in r.plans for mb in p.microbatches for v in mb["prev"]
                                           if v is not None),
                     "planning_ms": quiet_ms, "planning_with_report_ms": wall,
                     "planning_share": quiet_ms / r.packpipe.iteration_ms,
                     "microbatches": r.packpipe.microbatches,
                     "layouts": sorted({mb["layout"] for p in r.plans for mb in p.microbatches})})
    total = sum(x["packpipe_ms"] for x in rows)
    # The grid is sized by each batch's longest sample, so a setting may be missing from a batch: a
    # family's best is its best setting among those of every batch, else its best per batch.
    common = set.intersection(*(set(x["baselines"]) for x in rows))
    fam_best = {}
    for s in sorted(common):
        fam = rows[0]["baselines"][s][0]
        t = sum(x["baselines"][s][1] for x in rows)
        if t < fam_best.get(fam, (float("inf"), ""))[0]:
            fam_best[fam] = (t, s)
    for fam in sorted({f for x in rows for f, _ in x["baselines"].values()} - set(fam_best)):
        t = sum(min(v for f, v in x["baselines"].values() if f == fam) for x in rows)
        fam_best[fam] = (t, "its best setting per batch")
    feasible = {f: v for f, v in fam_best.items() if np.isfinite(v[0])}
    best_fam = min(feasible, key=lambda f: feasible[f][0]) if feasible else None
    out = {"model": model, "device": device, "stages": stages, "batches": kind, "count": count,
           "baseline_schedule": baseline_schedule,
           "packpipe_s": total / 1e3,
           "families": {f: {"setting": s, "time_s": t / 1e3 if np.isfinite(t) else None,
                            "speedup": t / total if np.isfinite(t) else None} for f, (t, s) in fam_best.items()},
           "best_baseline": {"family": best_fam, "setting": feasible[best_fam][1],
                             "speedup": feasible[best_fam][0] / total} if best_fam else None,
           "from_baselines": sum(1 for x in rows if x["source"] != "dp"),
           "planning_ms_median": statistics.median(x["planning_ms"] for x in rows),
           "planning_share_max": max(x["planning_share"] for x in rows),
           "planning_with_report_ms_median": statistics.median(x["planning_with_report_ms"] for x in rows),
           "microbatches": [x["microbatches"] for x in rows], "layouts": sorted({l for x in rows for l in x["layouts"]}),
           # batch by batch, against that batch's best baseline setting (stricter than one setting per set)
           "per_batch_speedup": [x["best_baseline_ms"] / x["packpipe_ms"] for x in rows],
           "layers_per_stage": shape.layers_per_stage,
           "sliced_entries": [x["sliced_entries"] for x in rows],
           "refused": sum(x["refused"]["truncated"] + x["refused"]["dropped"] for x in rows)}
    out["per_batch_speedup_median"] = statistics.median(out["per_batch_speedup"])
    out["per_batch_speedup_min"] = min(out["per_batch_speedup"])
    if all(x["least_lower_bound_ms"] for x in rows):
        out["per_batch_ceiling"] = [x["best_baseline_ms"] / x["least_lower_bound_ms"] for x in rows]
        out["per_batch_ceiling_median"] = statistics.median(out["per_batch_ceiling"])
    if all(x["seq1f1b_ms"] for x in rows):
        out["per_batch_over_seq1f1b"] = [x["seq1f1b_ms"] / x["packpipe_ms"] for x in rows]
        out["per_batch_over_seq1f1b_median"] = statistics.median(out["per_batch_over_seq1f1b"])
        out["per_batch_over_seq1f1b_min"] = min(out["per_batch_over_seq1f1b"])
    # The ceiling holds for plans cut from the partitions it covers (packpipe's own, a slicing setting).
    for x in rows:
        if x["least_lower_bound_ms"] and (x["source"] == "dp" or x["source"].startswith("slicing")):
            assert x["packpipe_ms"] >= x["least_lower_bound_ms"] * (1 - 1e-9), (model, device, stages, kind)
    # Never worse: packpipe at most every baseline the executor runs, batch by batch.
    for x in rows:
        for s, (fam, t) in x["baselines"].items():
            if fam != "packing-mask":
                assert x["packpipe_ms"] <= t, (model, device, stages, kind, s)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=_check.arg_int(1, 1000), default=3, help="batches per set")
    ap.add_argument("--seed", type=_check.arg_int(0, 2 ** 63 - 1), default=1234)
    ap.add_argument("--models", nargs="+", default=["gpt-6.7b", "t5-11b"])
    ap.add_argument("--devices", nargs="+", default=["A100-40GB", "H100-80GB"])
    ap.add_argument("--stages", type=_check.arg_int(1, 64), nargs="+", default=[4, 8])
    ap.add_argument("--kinds", nargs="+", choices=["64K", "4096", *long_mixtures.MIXTURES],
                    default=["64K", "4096", *long_mixtures.MIXTURES],
                    help="batches: the demo's 64K-token batches, 4,096 log-normal samples, or a long-context "
                         "mixture of benchmarks/long_mixtures.py (256K-token batches, planned on --long-sets)")
    ap.add_argument("--long-sets", nargs="+", default=["llama-7b:H100-80GB:8:4", "gpt-6.7b:A100-80GB:4:4"],
                    help="model:device:stages:layers_per_stage of the long-context mixtures")
    ap.add_argument("--baseline-schedule", choices=["as-run", "search"], default="as-run",
                    help="the baselines as their systems run them (1F1B over their order) or under packpipe's search")
    ap.add_argument("--out", help="write the JSON result here")
    a = ap.parse_args()
    if a.out:
        try:
            packpipe.check_outputs({"--out": a.out}, [os.path.abspath(__file__)], probe=True)
        except ValueError as e:
            ap.error(str(e))
    plan = []
    for kind in a.kinds:
        if kind in long_mixtures.MIXTURES:
            for spec in a.long_sets:
                try:
                    model, device, stages, lps = spec.split(":")
                    plan.append((model, device, int(stages), kind, int(lps)))
                except ValueError:
                    ap.error(f"--long-sets: {spec!r} is not model:device:stages:layers_per_stage")
        else:
            plan += [(m, d, st, kind, None) for m in a.models for d in a.devices for st in a.stages]
    sets = []
    for model, device, stages, kind, lps in plan:
        s = run_set(model, device, stages, kind, a.count, a.seed, lps, a.baseline_schedule)
        sets.append(s)
        b = s["best_baseline"]
        fam = s["families"]
        vp = fam.get("packing", {}).get("speedup")
        dm = fam.get("packing-mask", {}).get("speedup")
        def ratio(x):  # (a family with no feasible setting on the set has no speed-up)
            return f"{x:.3f}x" if x else "infeasible"

        print(f"{model:9s} {device:10s} S={stages} {kind:5s} packpipe {s['packpipe_s']:8.2f} s  "
              f"best {ratio(b['speedup'] if b else None)} ({b['setting'] if b else '-'})  "
              f"varlen packing {ratio(vp)}  dense packing {ratio(dm)}  plan {s['planning_ms_median']:.1f} ms (at most "
              f"{100 * s['planning_share_max']:.2f}% of an iteration)  per batch "
              f"median {s['per_batch_speedup_median']:.3f}x min {s['per_batch_speedup_min']:.3f}x"
              + (f"  over Seq1F1B (1F1B) median {s['per_batch_over_seq1f1b_median']:.3f}x min "
                 f"{s['per_batch_over_seq1f1b_min']:.3f}x" if "per_batch_over_seq1f1b" in s else "")
              + (f"  ceiling (no bubble) median {s['per_batch_ceiling_median']:.3f}x" if "per_batch_ceiling" in s
                 else ""), flush=True)
    text = json.dumps({"sets": sets}, indent=1)
    if a.out:
        packpipe.write_file_atomic(a.out, text, inputs=[os.path.abspath(__file__)], what="--out")
    else:
        print(text)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The torch step of the device check (scripts/device_check.py): packpipe.torch on one device.

    python3 scripts/device_check_torch.py --device cuda --out torch.json --workdir DIR [sizes]

grad        One iteration of a small fp32 GPT through LocalPipeline on --device and on the CPU, from
            the same weights and the same plan, for each stages:schedule of --grad-configs: per
            parameter |g_device - g_cpu| / |g_cpu| (norms; the max is the figure), and the losses.
            TF32 is off, so the difference is fp32 rounding in another order.
throughput  The GPT of --hidden/--layers/--heads/--vocab/--dtype trained on the same global batches
            with packpipe's plans (dp partition, schedule search) and with each baseline method of
            --methods at each size of its grid (--grid: micro-batch sizes; --token-grid: the token
            budgets of 'tokens'), LocalPipeline on --device with --stages stages; the configurations
            alternate round by round (forward, then backward order); per configuration the median
            over --rounds of the time of --iterations iterations, tokens/s, the simulated tokens/s of
            the same plans, and packpipe over the best configuration of each method.
measure     packpipe's plans once more with the handler synchronizing the device after every op (op
            times are then the device's), written as packpipe-measurements: the first half of the
            iterations to fit a calibration, the second to check it (costmodel calibrate / validate).

Writes --out (JSON) even when a part fails (that part's "status" is "failed" with its "error"); the
exit status is 1 when any part failed.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback

import numpy as np
import torch

import packpipe
import packpipe.torch as pt
from packpipe.torch import models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "data", "demo")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
GRAD_TOLERANCE = 1e-3  # fp32 on two devices: a few 1e-6 expected; a wrong result is O(1)


def manifest(workload: str) -> str:
    """'demo': every task of the embedded data (10 to 3,000 tokens); 'short': its paired tasks (10 to 130)."""
    return os.path.join(DEMO, "manifest.json" if workload == "demo" else "short.json")


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def cost_device(a, directory: str) -> str:
    """The device file or preset packpipe plans for: the preset of this GPU, or the CPU device file."""
    if a.cost_device != "auto":
        return a.cost_device
    if torch.device(a.device).type == "cuda":
        name = torch.cuda.get_device_name(a.device).upper()
        mem = torch.cuda.get_device_properties(a.device).total_memory / 2**30
        return "H200" if "H200" in name else "H100-80GB" if "H100" in name else \
            "A100-80GB" if "A100" in name and mem > 50 else "A100-40GB"
    path = os.path.join(directory, "device.json")
    with open(path, "w") as f:
        json.dump(models.CPU_DEVICE, f)
    return path


def model_file(cfg, directory: str, name: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(cfg.cost_model_json())
    return path


def baseline_methods() -> list:
    """The partition methods PartitionOptions accepts now, less packpipe's own (dp, dynapipe): its
    error message lists them (the fixed list when that changes form)."""
    try:
        packpipe.PartitionOptions(method="?")
    except ValueError as e:
        text = str(e)
        if "(expected " in text:
            names = [x.strip() for x in text.split("(expected ", 1)[1].rstrip(")").split(",")]
            found = [n for n in names if n and n not in ("dp", "dynapipe")]
            if found:
                return found
    return ["fixed", "packing", "tokens", "wlb"]


# ---- grad -------------------------------------------------------------------------------------------

def grad_part(a, work: str) -> dict:
    torch.set_float32_matmul_precision("highest")  # no TF32: fp32 arithmetic on both devices
    cfg = models.GPTConfig(vocab_size=256, hidden=64, layers=4, heads=4, seed=3, dtype=torch.float32)
    cm = models.cost_model(cfg, work)
    data = manifest("short")
    out = {"tolerance": GRAD_TOLERANCE, "configs": []}
    for spec in a.grad_configs.split(","):
        stages, schedule = spec.split(":")
        t = time.monotonic()
        loader = pt.PlanLoader(data, cost_model=cm, rank=None, iterations=1,
                               shape=packpipe.PipelineShape(stages=int(stages)),
                               options=packpipe.PartitionOptions(method="dp"), global_batch_tokens=1024, seed=a.seed,
                               schedule=schedule, schedule_fallback=True, dtype="fp32", calibrate=False)
        it = next(iter(loader))
        full = models.GPT(cfg)
        grads, losses = {}, {}
        for dev in (a.device, "cpu"):
            model = copy.deepcopy(full).to(dev)
            stages_m = {v: model.stage(it.plan.stages[v]) for v in range(it.plan.vstages)}
            pipe = pt.LocalPipeline(stages_m, models.gpt_loss, None, device=dev, dtype=torch.float32, timeout_s=300)
            res = pipe.run(it)
            sync(dev)
            losses[dev] = res.loss
            grads[dev] = {(v, n): p.grad.detach().to("cpu", torch.float64) for v, m in stages_m.items()
                          for n, p in m.named_parameters() if p.grad is not None}
        ref, got = grads["cpu"], grads[a.device]
        if set(ref) != set(got):
            raise RuntimeError(f"stages:schedule {spec}: parameters with gradients differ between {a.device} and cpu")
        rel, num, den = [], 0.0, 0.0
        for k, g in ref.items():
            d = float((got[k] - g).norm())
            n = float(g.norm())
            rel.append(d / max(n, 1e-30))
            num += d * d
            den += n * n
        c = {"stages": int(stages), "schedule": schedule, "plan_schedule": it.plan.schedule,
             "microbatches": len(it.plan.microbatches), "parameters": len(ref),
             "max_rel_diff": max(rel), "global_rel_diff": math.sqrt(num) / max(math.sqrt(den), 1e-30),
             "loss_device": losses[a.device], "loss_cpu": losses["cpu"],
             "loss_rel_diff": abs(losses[a.device] - losses["cpu"]) / max(abs(losses["cpu"]), 1e-30),
             "seconds": round(time.monotonic() - t, 2)}
        out["configs"].append(c)
        print(f"grad {spec}: max rel diff {c['max_rel_diff']:.3e}, loss {c['loss_device']:.6f} vs {c['loss_cpu']:.6f}",
              flush=True)
    out["max_rel_diff"] = max(c["max_rel_diff"] for c in out["configs"])
    bad = [c for c in out["configs"]
           if not (c["max_rel_diff"] <= GRAD_TOLERANCE and c["loss_rel_diff"] <= GRAD_TOLERANCE)]
    if bad:
        raise ValueError(f"gradients or loss on {a.device} differ from the CPU's beyond {GRAD_TOLERANCE}: "
                         + ", ".join(f"{c['stages']}:{c['schedule']} {c['max_rel_diff']:.3e}" for c in bad), out)
    return out


# ---- throughput and measurements -------------------------------------------------------------------

def configs(a) -> list:
    """(name, method, PlanLoader keywords) of packpipe and every baseline at each size of its grid."""
    out = [("packpipe", "packpipe", {"schedule": "search", "options": packpipe.PartitionOptions(method="dp")})]
    for m in a.methods:
        if m == "wlb":  # WLB-LLM's packing is sized by a capacity, not a count: the longest sample's
            out.append(("wlb capacity=longest", m, {"schedule": "1f1b", "schedule_fallback": True,
                                                    "options": packpipe.PartitionOptions(method=m)}))
            continue
        if m == "slicing":  # Seq1F1B-like: fixed-length slices, sized by tokens
            for k in a.slice_grid:
                out.append((f"slicing capacity={k}", m, {"schedule": "1f1b", "schedule_fallback": True,
                                                         "options": packpipe.PartitionOptions(method=m, capacity=k)}))
            continue
        sizes = a.token_grid if m == "tokens" else a.grid
        for k in sizes:
            opts = packpipe.PartitionOptions(method=m, tokens=k) if m == "tokens" else \
                packpipe.PartitionOptions(method=m, mbs=k)
            out.append((f"{m} {'tokens' if m == 'tokens' else 'mbs'}={k}", m,
                        {"schedule": "1f1b", "schedule_fallback": True, "options": opts}))
            if m == "fixed":  # HF's DataCollatorWithFlattening: the same counts, packed
                out.append((f"fixed-packed mbs={k}", m, {
                    "schedule": "1f1b", "schedule_fallback": True,
                    "options": packpipe.PartitionOptions(method=m, mbs=k, layout="packed")}))
    return out


class Setup:
    """One configuration: its iterations (plans and loaded tensors) and a pipeline over its own copy of
    the model."""

    def __init__(self, a, name, method, kw, cm, data, cfg):
        self.name, self.method = name, method
        loader = pt.PlanLoader(data, cost_model=cm, rank=None, iterations=a.iterations,
                               shape=packpipe.PipelineShape(stages=a.stages), global_batch_tokens=a.tokens, seed=a.seed,
                               dtype=a.dtype, calibrate=False, **kw)
        self.its = list(loader)
        self.model = models.GPT(cfg).to(a.device)
        plan = self.its[0].plan
        self.stages = {v: self.model.stage(plan.stages[v]) for v in range(plan.vstages)}
        del self.model  # the stages hold copies of their parts
        self.pipe = pt.LocalPipeline(self.stages, models.gpt_loss, lambda ps: torch.optim.SGD(ps, lr=1e-4),
                                     device=a.device, dtype=DTYPES[a.dtype], timeout_s=600)
        self.tokens = sum(it.tokens for it in self.its)
        self.simulated_ms = sum(it.plan.makespan_ms for it in self.its)
        mbs = [m for it in self.its for m in it.plan.microbatches]
        padded = sum(int(m["rows"]) * int(m["padded_len"]) for m in mbs)
        self.padding_efficiency = self.tokens / padded if padded else None
        self.microbatches = [len(it.plan.microbatches) for it in self.its]
        self.schedules = sorted({it.plan.schedule for it in self.its})
        self.ms, self.error = [], None

    def run_all(self, device) -> float:
        sync(device)
        t = time.perf_counter()
        for it in self.its:
            self.pipe.run(it)
        sync(device)
        return (time.perf_counter() - t) * 1e3


def throughput_part(a, work: str, state: dict) -> dict:
    cfg = models.GPTConfig(vocab_size=a.vocab, hidden=a.hidden, layers=a.layers, heads=a.heads, seed=1,
                           dtype=DTYPES[a.dtype], max_positions=4096)
    dev_spec = cost_device(a, work)
    mfile = model_file(cfg, work, "model.json")
    cm = packpipe.CostModel(mfile, dev_spec)
    data = packpipe.MultiTaskDataset(manifest(a.workload))
    state.update(cfg=cfg, cm=cm, data=data, model_file=mfile, cost_device=dev_spec)
    out = {"stages": a.stages, "workload": a.workload, "global_batch_tokens": a.tokens, "iterations": a.iterations,
           "rounds": a.rounds, "cost_device": dev_spec, "cost_model": cm.describe(), "methods": a.methods,
           "model": {"hidden": a.hidden, "layers": a.layers, "heads": a.heads, "vocab": a.vocab, "dtype": a.dtype},
           "configs": {}}
    setups = []
    for name, method, kw in configs(a):
        try:
            setups.append(Setup(a, name, method, kw, cm, data, cfg))
        except Exception as e:  # one configuration that cannot plan or load is recorded; the others run
            out["configs"][name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"throughput {name}: {type(e).__name__}: {e}", flush=True)
    if not setups or setups[0].name != "packpipe":
        raise RuntimeError("packpipe's own configuration could not be set up: " + str(out["configs"].get("packpipe")))
    state["packpipe"] = setups[0]
    for rnd in range(a.rounds + 1):  # round 0 warms up (allocator, kernels, masks)
        for s in (setups if rnd % 2 == 0 else list(reversed(setups))):
            if s.error:
                continue
            try:
                ms = s.run_all(a.device)
            except Exception as e:
                s.error = f"{type(e).__name__}: {e}"
                print(f"throughput {s.name}: {s.error}", flush=True)
                s.pipe = s.stages = None  # what the failed iteration held goes with them
                gc.collect()
                if torch.device(a.device).type == "cuda":
                    torch.cuda.empty_cache()
                continue
            if rnd > 0:
                s.ms.append(ms)
        print(f"throughput round {rnd}{' (warm-up)' if rnd == 0 else ''} done", flush=True)
    for s in setups:
        c = {"method": s.method, "tokens": s.tokens, "microbatches": s.microbatches, "schedules": s.schedules,
             "padding_efficiency": s.padding_efficiency, "simulated_ms": s.simulated_ms,
             "simulated_tokens_per_s": s.tokens / (s.simulated_ms / 1e3) if s.simulated_ms > 0 else None}
        if s.error or not s.ms:
            c["error"] = s.error or "not timed"
        else:
            med = statistics.median(s.ms)
            c.update(ms=s.ms, median_ms=med, tokens_per_s=s.tokens / (med / 1e3),
                     measured_over_predicted=med / s.simulated_ms if s.simulated_ms > 0 else None)
        out["configs"][s.name] = c
    pp = out["configs"]["packpipe"]
    if "error" in pp:
        raise RuntimeError(f"packpipe's configuration failed: {pp['error']}")
    ratios = {}
    for m in a.methods:
        mine = {n: c for n, c in out["configs"].items() if c.get("method") == m and "error" not in c}
        if not mine:
            ratios[m] = {"error": "no configuration of this method ran"}
            continue
        bm = max(mine, key=lambda n: mine[n]["tokens_per_s"])
        bs = max(mine, key=lambda n: mine[n]["simulated_tokens_per_s"] or 0)
        ratios[m] = {"best_measured": bm, "measured": pp["tokens_per_s"] / mine[bm]["tokens_per_s"],
                     "best_simulated": bs,
                     "simulated": (pp["simulated_tokens_per_s"] / mine[bs]["simulated_tokens_per_s"]
                                   if mine[bs]["simulated_tokens_per_s"] else None)}
    out["ratios"] = ratios
    for m, r in ratios.items():
        if "measured" in r:
            print(f"throughput: packpipe / best {m} ({r['best_measured']}) {r['measured']:.3f}x measured, "
                  f"{r['simulated']:.3f}x simulated", flush=True)
    # A baseline configuration that fails (out of memory, say: the reference models' attention keeps
    # rows x heads x len^2 scores) is recorded and left out of its method's best; the part fails when
    # a method has none left.
    out["failed_configs"] = [n for n, c in out["configs"].items() if "error" in c]
    empty = [m for m, r in ratios.items() if "error" in r]
    if empty:
        raise RuntimeError(f"no configuration of {', '.join(empty)} ran (failed: {', '.join(out['failed_configs'])})",
                           out)
    return out


def measure_part(a, work: str, state: dict) -> dict:
    """packpipe's plans (more iterations than timed) with per-op synchronization, as measurements."""
    if "cm" not in state:
        raise RuntimeError("the throughput part did not set up the model")
    cm, cfg = state["cm"], state["cfg"]
    loader = pt.PlanLoader(state["data"], cost_model=cm, rank=None, iterations=a.measure_iterations,
                           shape=packpipe.PipelineShape(stages=a.stages), global_batch_tokens=a.tokens, seed=a.seed + 1,
                           dtype=a.dtype, schedule="search", options=packpipe.PartitionOptions(method="dp"),
                           calibrate=False)
    model = models.GPT(cfg).to(a.device)
    its = list(loader)
    stages = {v: model.stage(its[0].plan.stages[v]) for v in range(its[0].plan.vstages)}
    pipe = pt.LocalPipeline(stages, models.gpt_loss, lambda ps: torch.optim.SGD(ps, lr=1e-4), device=a.device,
                            dtype=DTYPES[a.dtype], timeout_s=600, synchronize=True)
    pipe.run(its[0])  # warm-up, not measured
    source = f"scripts/device_check_torch.py on {state.get('device_name') or a.device}"
    halves = [packpipe.MeasurementSet(model=cm.model["name"], device=cm.device["name"], source=source)
              for _ in range(2)]
    ratios = []
    timed = its[1:] if len(its) > 1 else its
    for k, it in enumerate(timed):
        res = pipe.run(it)
        sync(a.device)
        times = [np.zeros((0, 2), dtype=np.int64) for _ in range(it.plan.ranks)]
        for rec in res.records:
            times[rec.rank] = np.asarray(rec.times, dtype=np.int64)
        got = packpipe.measurements_from(it.plan, times)
        if not got.iterations:
            line = packpipe.IterationMeasurement(iteration=it.iteration, replica=0, measured_ms=res.measured_ms,
                                                 predicted_ms=it.plan.makespan_ms,
                                                 schedule=it.plan.schedule
                                                 if it.plan.schedule in packpipe.schedule_names() else "")
            got.iterations = [line]
        ratios.append(res.measured_ms / it.plan.makespan_ms)
        halves[0 if k < (len(timed) + 1) // 2 or len(timed) == 1 else 1].append(got)
    fit = os.path.join(work, "measurements_fit.jsonl")
    check = os.path.join(work, "measurements_check.jsonl")
    packpipe.write_measurements(fit, halves[0])
    packpipe.write_measurements(check, halves[1] if len(halves[1]) else halves[0])
    return {"fit": fit, "check": check, "model_file": state["model_file"], "cost_device": state["cost_device"],
            "iterations": len(timed), "ops": len(halves[0]) + len(halves[1]),
            "median_measured_over_predicted": statistics.median(ratios)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", required=True, help="the result (JSON)")
    ap.add_argument("--workdir", required=True, help="folder for the model, device and measurement files")
    ap.add_argument("--parts", default="grad,throughput,measure")
    ap.add_argument("--grad-configs", default="2:1f1b,4:zero-bubble", help="stages:schedule,... of the gradient check")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--workload", choices=["short", "demo"], default="demo")
    ap.add_argument("--tokens", type=int, default=16384, help="global batch tokens")
    ap.add_argument("--iterations", type=int, default=4, help="iterations per timed round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stages", type=int, default=1, help="pipeline stages of the throughput runs (one device)")
    ap.add_argument("--methods", default="auto", help="baseline partition methods, comma-separated (auto: every "
                                                      "method PartitionOptions accepts but dp and dynapipe)")
    ap.add_argument("--grid", default="2,4,8", help="micro-batch sizes of the baselines")
    ap.add_argument("--token-grid", default="2048,4096,8192", help="token budgets of the 'tokens' baseline")
    ap.add_argument("--slice-grid", default="256,512,1024", help="slice lengths (tokens) of the 'slicing' baseline")
    ap.add_argument("--measure-iterations", type=int, default=8)
    ap.add_argument("--cost-device", default="auto", help="device preset or file packpipe plans for (auto: this GPU's "
                                                          "preset, the CPU device file on a CPU)")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    a = ap.parse_args()
    a.methods = baseline_methods() if a.methods == "auto" else [m for m in a.methods.split(",") if m]
    a.grid = [int(x) for x in a.grid.split(",") if x]
    a.token_grid = [int(x) for x in a.token_grid.split(",") if x]
    a.slice_grid = [int(x) for x in a.slice_grid.split(",") if x]
    if a.threads:
        torch.set_num_threads(a.threads)
    os.makedirs(a.workdir, exist_ok=True)
    result = {"device": a.device, "torch": torch.__version__, "torch_cuda": torch.version.cuda, "methods": a.methods}
    state = {}
    if torch.device(a.device).type == "cuda":
        if not torch.cuda.is_available():
            result.update(status="failed", error="torch sees no CUDA device")
            write(a.out, result)
            return 1
        result["device_name"] = state["device_name"] = torch.cuda.get_device_name(a.device)
    parts = {"grad": lambda: grad_part(a, a.workdir), "throughput": lambda: throughput_part(a, a.workdir, state),
             "measure": lambda: measure_part(a, a.workdir, state)}
    for name in [p for p in a.parts.split(",") if p]:
        t = time.monotonic()
        try:
            r = parts[name]()
            r["status"] = "passed"
        except Exception as e:  # recorded; the next part runs
            partial = e.args[1] if len(e.args) > 1 and isinstance(e.args[1], dict) else {}
            r = dict(partial, status="failed", error=f"{type(e).__name__}: {e.args[0] if e.args else e}")
            traceback.print_exc()
        r["seconds"] = round(time.monotonic() - t, 1)
        result[name] = r
        write(a.out, result)
    result["status"] = "passed" if all(result.get(p, {}).get("status") == "passed" for p in a.parts.split(",") if p) \
        else "failed"
    write(a.out, result)
    return 0 if result["status"] == "passed" else 1


def write(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())

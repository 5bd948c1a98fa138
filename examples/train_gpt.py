#!/usr/bin/python3
"""Train a small GPT on a multi-task dataset with packpipe plans.

    python3 -m packpipe.torch.run --nproc-per-node 4 examples/train_gpt.py \\
        --manifest data/demo/manifest.json --pp 2 --dp 2 --iterations 10

(or ``python3 -m torch.distributed.run --standalone --nproc_per_node 4 [--redirects 1 --tee 1]
examples/train_gpt.py ...``; Debian's torch 1.13 needs the two bracketed flags). Started without a
launcher, it trains every stage in this one process (packpipe.torch.LocalPipeline).

Every rank plans each iteration with packpipe's epoch planner (deterministically, so all ranks plan
the same), loads the tensors its stages need, and runs its rank of the plan on packpipe's executor
over gloo (CPU) or NCCL (GPU). The trainer below writes only the model and the loss; everything else
is packpipe. It prints per iteration the loss, tokens/s, and the predicted (cost model) against the
measured iteration time.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import packpipe
import packpipe.torch as pt
from packpipe import _check
from packpipe.torch import models


def parse(argv=None):
    i, f = _check.arg_int, _check.arg_float
    big = _check.MAX_COUNT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", default="data/demo/manifest.json", help="multi-task manifest (.json)")
    ap.add_argument("--pp", type=i(1, _check.MAX_PIPELINE), default=2, help="pipeline stages (ranks per pipeline)")
    ap.add_argument("--dp", type=i(1, _check.MAX_PIPELINE), default=1, help="data-parallel replicas")
    ap.add_argument("--chunks", type=i(1, _check.MAX_PIPELINE), default=1,
                    help="virtual stages per rank (interleaved schedules)")
    ap.add_argument("--iterations", type=i(0, big, "0: the whole epoch"), default=10,
                    help="iterations to train (0: the whole epoch)")
    ap.add_argument("--global-batch-tokens", type=i(1, big), default=4096)
    ap.add_argument("--schedule", default="search", help="a schedule name, or 'search'")
    ap.add_argument("--method", default="dp", choices=["dp", "fixed", "packing"],
                    help="partition method: dp (packpipe), fixed or packing (baselines)")
    ap.add_argument("--mbs", type=i(0, 2 ** 31, "0: the method's default"), default=0,
                    help="fixed / packing: rows per micro-batch")
    ap.add_argument("--split-backward", action="store_true",
                    help="allow zero-bubble schedules (BWD_I + BWD_W): PyTorch autograd pays for the split, so the "
                         "default excludes them")
    ap.add_argument("--loss", default="all", choices=["all", "targets"], help="which tokens carry loss")
    ap.add_argument("--hidden", type=i(1, 2 ** 20), default=64)
    ap.add_argument("--layers", type=i(1, 2 ** 16), default=4)
    ap.add_argument("--heads", type=i(1, 2 ** 20), default=4)
    ap.add_argument("--vocab", type=i(1, 2 ** 31 - 1), default=2048, help="model vocabulary (token ids fold modulo it)")
    ap.add_argument("--tied", action="store_true", help="tie the embedding and the LM head")
    ap.add_argument("--lr", type=f(0, 1e6, lo_open=True), default=3e-3)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "fp64", "bf16"])
    ap.add_argument("--seed", type=i(0, 2 ** 63 - 1), default=1234)
    ap.add_argument("--threads", type=i(0, _check.MAX_THREADS, "0: cores / ranks"), default=0,
                    help="torch threads per rank (0: cores / ranks)")
    ap.add_argument("--timeout", type=f(0, _check.MAX_TIMEOUT_S, lo_open=True), default=120,
                    help="seconds any wait may take")
    ap.add_argument("--device", type=_check.arg_device, default="cpu", help="cpu, or cuda (one GPU per rank)")
    ap.add_argument("--calibrate-after", type=i(0, big, "0: never"), default=0,
                    help="fit the cost model to the first N measured iterations, then plan with it (0: never)")
    ap.add_argument("--recalibrate-every", type=i(0, big, "0: fit once"), default=0,
                    help="refit every N iterations after the first fit")
    ap.add_argument("--save-calibration", default="", help="write each calibration to this file (rank 0)")
    ap.add_argument("--save-measurements", default="",
                    help="with --calibrate-after: write the measured iterations here at the end (packpipe-measurements; "
                         "one file per rank, PATH.rankN, when distributed) for packpipe costmodel validate --measured")
    ap.add_argument("--json", action="store_true", help="one JSON object per iteration instead of text")
    a = ap.parse_args(argv)
    if a.hidden % a.heads:
        ap.error(f"--hidden {a.hidden} must be a multiple of --heads {a.heads}")
    if not a.calibrate_after:
        for flag, v in (("--recalibrate-every", a.recalibrate_every), ("--save-calibration", a.save_calibration),
                        ("--save-measurements", a.save_measurements)):
            if v:
                ap.error(f"{flag} needs --calibrate-after (nothing is calibrated or measured without it)")
    return a


def check_outputs(a, inputs, rank, world):
    """The files this job writes, refused before training when one is an input (the manifest, a
    dataset file, this script) or another output (of any rank), or (on the rank that writes it) not
    writable. Returns the measurement file of this rank ('' when none)."""
    def measurements(r):
        return a.save_measurements + (f".rank{r}" if a.save_measurements and r is not None else "")
    ranks = range(world) if rank is not None else [None]
    outputs = {"--save-calibration": a.save_calibration}
    outputs.update({f"--save-measurements{f' (rank {r})' if r is not None else ''}": measurements(r) for r in ranks})
    packpipe.check_outputs(outputs, inputs, probe=False)
    packpipe.check_outputs({"--save-calibration": a.save_calibration if not rank else "",
                            "--save-measurements": measurements(rank)})  # the ones this rank writes: writable
    return measurements(rank)


def _sample_lengths(data, task):
    """(input, target) lengths of a task's samples as int64 (a text-only task has no targets)."""
    inp, tgt = data.lengths(task)
    inp = inp.astype("int64")
    return inp, (tgt.astype("int64") if len(tgt) == len(inp) else 0 * inp)


def setup(a, distributed, replica, rank):
    """The data, the cost model, the loader and the calibrator; raises what the library refuses."""
    data = packpipe.MultiTaskDataset(a.manifest)
    inputs = packpipe.dataset_files(data) + [os.path.abspath(__file__)]
    measurements_file = check_outputs(a, inputs, dist.get_rank() if distributed else None,
                                      dist.get_world_size() if distributed else 1)
    longest = max(int((i + t).max()) if len(i) else 0
                  for i, t in (_sample_lengths(data, k) for k in range(data.num_tasks)))
    cfg = models.GPTConfig(vocab_size=a.vocab, hidden=a.hidden, layers=a.layers, heads=a.heads,
                           tied_embedding=a.tied, seed=a.seed, dtype=pt.torch_dtype(a.dtype),
                           max_positions=max(longest, 64))
    cost = models.cost_model(cfg, tempfile.mkdtemp(prefix="packpipe-train-"), inputs=inputs)

    shape = packpipe.PipelineShape(stages=a.pp, chunks=a.chunks, dp=a.dp)
    options = packpipe.PartitionOptions(method=a.method, mbs=a.mbs, oversize="truncate")
    loader = pt.PlanLoader(data, cost_model=cost, replica=replica, rank=rank, iterations=a.iterations,
                           shape=shape, options=options, global_batch_tokens=a.global_batch_tokens, seed=a.seed,
                           schedule=a.schedule, schedule_fallback=True, split_backward=a.split_backward,
                           loss=a.loss, dtype=a.dtype, tied_embedding=a.tied,
                           calibrate=False)  # (the loader's own calibration: --calibrate-after below, or never)
    calibrator = None
    if a.calibrate_after:
        calibrator = pt.Calibrator(loader, fit_after=a.calibrate_after, refit_every=a.recalibrate_every,
                                   save=a.save_calibration or None, timeout_s=a.timeout, inputs=inputs)
    return cfg, loader, calibrator, inputs, measurements_file


def main(argv=None):
    train(parse(argv))


def train(a):
    distributed = "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if distributed and a.pp * a.dp != world:
        sys.exit(f"train_gpt: --pp {a.pp} x --dp {a.dp} must equal the {world} ranks started")
    if not distributed and a.dp != 1:
        sys.exit("train_gpt: without a launcher, one process trains one pipeline (--dp 1)")
    threads = a.threads or max(1, (os.cpu_count() or 1) // max(world, 1))
    torch.set_num_threads(threads)
    device = torch.device(a.device)
    if distributed:
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        dist.init_process_group(backend)
        groups = pt.ProcessGroups.create(a.pp, a.dp)
        replica, rank = groups.replica, groups.pipeline_rank
    else:
        groups, replica, rank = None, 0, None

    dtype = pt.torch_dtype(a.dtype)
    try:
        cfg, loader, calibrator, inputs, measurements_file = setup(a, distributed, replica, rank)
    except (ValueError, TypeError, RuntimeError) as e:  # one line, not a traceback, on every rank
        sys.exit(f"train_gpt: error: {e}")
    model = models.GPT(cfg)
    last_rank = distributed and rank == a.pp - 1 and replica == 0
    printer = (not distributed) or last_rank
    # The stage layout is known before the first iteration: build the stages, wrap them, then iterate.
    # (tie: a rank holding the first and the last stage shares one tied weight between them)
    stages = {}
    for v in loader.my_stages:
        stages[v] = model.stage(loader.stages[v], tie=stages.get(0)).to(device)
    if distributed:
        params = [p for m in stages.values() for p in m.parameters()]
        runner = pt.PipelineRunner(stages, models.gpt_loss, torch.optim.AdamW(params, lr=a.lr), groups=groups,
                                   device=device, dtype=dtype, timeout_s=a.timeout)
    else:
        runner = pt.LocalPipeline(stages, models.gpt_loss, lambda ps: torch.optim.AdamW(ps, lr=a.lr),
                                  device=device, dtype=dtype, timeout_s=a.timeout)
    if printer and not a.json:
        layers = [s["layers"] for s in loader.stages]
        print(f"packpipe: {a.pp} stages x {a.dp} replicas, layers per virtual stage {layers}, "
              f"{cfg.hidden} hidden, dtype {a.dtype}, {threads} threads per rank", flush=True)
    t_start = time.monotonic()
    total_tokens = 0
    for it in loader:
        plan = it.plan
        r = runner.run(it)
        calibrated = calibrator is not None and calibrator.cost_model is not calibrator.base
        report = calibrator.observe(it, r) if calibrator is not None else None
        loss = runner.global_loss(r) if distributed else r.loss
        total_tokens += it.tokens if not distributed else r.tokens * a.dp
        if printer:
            tok_s = r.tokens * (a.dp if distributed else 1) / (r.measured_ms / 1e3)
            row = {"iteration": it.iteration, "loss": loss, "schedule": plan.schedule,
                   "microbatches": len(plan.microbatches), "tokens": r.tokens * (a.dp if distributed else 1),
                   "tokens_per_s": tok_s, "measured_ms": r.measured_ms, "predicted_ms": r.predicted_ms,
                   "calibrated": calibrated}
            if a.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"iteration {it.iteration:4d}  loss {loss:7.4f}  {plan.schedule:17s} {len(plan.microbatches):3d} "
                      f"micro-batches  {row['tokens']:6d} tokens  {tok_s:9.0f} tokens/s  measured "
                      f"{r.measured_ms:8.1f} ms  predicted {r.predicted_ms:8.1f} ms{' (calibrated)' if calibrated else ''}",
                      flush=True)
            if report is not None:
                if a.json:
                    print(json.dumps({"calibration": report.iteration, "summary": report.summary(),
                                      "iteration_error_before": report.iteration_error_before,
                                      "iteration_error_after": report.iteration_error_after}), flush=True)
                else:
                    print(f"packpipe: {report.summary()}", flush=True)
    if printer and not a.json:
        wall = time.monotonic() - t_start
        print(f"packpipe: trained {total_tokens} tokens in {wall:.1f} s", flush=True)
    if calibrator is not None and measurements_file:
        packpipe.write_file_atomic(measurements_file, calibrator.measurements.to_jsonl(), inputs=inputs,
                                   outputs={"--save-calibration": a.save_calibration}, what="--save-measurements")
        if printer and not a.json:
            print(f"packpipe: measurements written to {measurements_file}", flush=True)
    if distributed:
        runner.close()
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

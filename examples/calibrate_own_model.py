#!/usr/bin/python3
"""The cost model of your own model: calibrated (the default) or profiled.

    python3 examples/calibrate_own_model.py --out-dir /tmp/cal

The planner predicts every micro-batch's time from a cost model. packpipe.torch.cost_model(model,
device) reads the model's shape from the module (an analytic model: FLOPs and bytes on the device's
peak figures); how well it predicts this machine is fixed in one of two ways:

1. calibration (PlanLoader's default, calibrate="auto"): after two warm-up steps and six measured
   ones, every rank fits the model to the measured steps and plans with the fit from the next
   iteration on. calibrate={...} sets when and how (Calibrator's settings: fit_after, refit_every,
   warmup, save, ...); loader.calibration_reports say how far off the model was before and after.
2. profiling: measure your layer on this device first (packpipe profile --layer module:factory,
   here in-process), then build the cost model from the profile: cost_model(model, device,
   profiles=[...]). A profiled model is not calibrated again by default.
"""
import argparse
import contextlib
import io
import json
import os
import sys

import torch

import packpipe
import packpipe.torch as pt
from packpipe.torch import profile
from packpipe.torch.models import CPU_DEVICE

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from my_model import VOCAB, TinyLM, loss_fn  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def train(loader, model, iterations_note):
    step = pt.GradientAccumulation(model, loss_fn, torch.optim.AdamW(model.parameters(), lr=3e-3))
    for it in loader:
        r = step.run(it)
        print(f"  iteration {it.iteration}: loss {r.loss:.4f}, measured {r.measured_ms:.0f} ms, predicted "
              f"{r.predicted_ms:.0f} ms{iterations_note(it)}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", default=os.path.join(HERE, "..", "data", "demo", "short.json"))
    ap.add_argument("--out-dir", required=True, help="where the calibration and the profile are written")
    a = ap.parse_args(argv)
    if os.path.exists(a.out_dir) and not os.path.isdir(a.out_dir):
        ap.error(f"--out-dir {a.out_dir}: expected a directory (or a path to create), found a file")
    torch.set_num_threads(1)
    os.makedirs(a.out_dir, exist_ok=True)
    shape = packpipe.PipelineShape(stages=1, memory_mb=8)

    print("1. the analytic model, calibrated on this job's first steps", flush=True)
    model = TinyLM(layers=2)
    calibration = os.path.join(a.out_dir, "calibration.json")
    loader = pt.PlanLoader(a.manifest, cost_model=pt.cost_model(model, CPU_DEVICE), shape=shape,
                           global_batch_tokens=1024, iterations=10,
                           calibrate={"warmup": 1, "fit_after": 4, "save": calibration})
    train(loader, model, lambda it: " (calibrated plan)" if it.iteration > 4 else "")
    for report in loader.calibration_reports:
        print(f"  {report.summary()}")
    print(f"  the fit is in {calibration} (CostModel(..., calibration=) or packpipe plan --calibration take it)")

    print("2. the model profiled on this device", flush=True)
    measured = os.path.join(a.out_dir, "block.profile.json")
    hidden, heads = model.embed.embedding_dim, model.blocks[0].heads
    # The same as: packpipe profile --layer my_model:make_block ... (the embedding and the head are
    # profiled at the model's width and vocabulary; a small grid here, a real one takes minutes).
    summary = io.StringIO()
    with contextlib.redirect_stdout(summary):
        profile.main(["--layer", "my_model:make_block", "--hidden", str(hidden), "--heads", str(heads),
                      "--ffn", str(4 * hidden), "--vocab", str(VOCAB), "--mbs", "1", "--seq", "64,256,1024",
                      "--recompute", "none", "--repeats", "2", "--warmup", "1", "--name", "TinyLM", "--out", measured,
                      "--json"])
    done = json.loads(summary.getvalue())
    print(f"  {done['points']} points measured in {done['seconds']:.1f} s -> {measured}")
    profiled = pt.cost_model(model, CPU_DEVICE, profiles=[measured])
    print(f"  {profiled.describe()}")
    loader = pt.PlanLoader(a.manifest, cost_model=profiled, shape=shape, global_batch_tokens=1024, iterations=3)
    train(loader, model, lambda it: "")


if __name__ == "__main__":
    main()

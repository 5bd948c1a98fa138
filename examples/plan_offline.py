#!/usr/bin/python3
"""Offline planning: plan an epoch into a plan file once, then train from the file.

    python3 examples/plan_offline.py --out plans.ppln                        # plan in Python, then train
    python3 examples/plan_offline.py --out plans.ppln --cli build/packpipe   # plan with the packpipe command
    python3 -m packpipe.torch.run --nproc-per-node 2 examples/train_pipeline.py --pp 2 --plan-file plans.ppln

The cost model comes from the model itself (packpipe.torch.cost_model), written as model.json and
device.json beside the plan file, which is what the packpipe command reads. Both ways write the same
plans; training then reads them by (iteration, replica) on every rank instead of planning.
"""
import argparse
import os
import subprocess
import sys

import torch

import packpipe
import packpipe.torch as pt
from packpipe import _check
from packpipe.torch.models import CPU_DEVICE

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_pipeline  # noqa: E402
from my_model import TinyLM  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STAGES, MEMORY_MB, TOKENS = 2, 8, 2048  # the settings train_pipeline.py plans with


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", default=os.path.join(HERE, "..", "data", "demo", "short.json"))
    ap.add_argument("--out", required=True, help="the plan file to write")
    ap.add_argument("--iterations", type=_check.arg_int(0, _check.MAX_COUNT), default=4, help="iterations to plan (0: the whole epoch)")
    ap.add_argument("--cli", default="", help="plan with this packpipe command instead of plan_epoch")
    ap.add_argument("--no-train", action="store_true", help="only plan")
    a = ap.parse_args(argv)
    dataset = packpipe.MultiTaskDataset(a.manifest)
    # Nothing this job writes may be one of the files it reads.
    directory = os.path.dirname(os.path.abspath(a.out))
    packpipe.check_outputs({"--out": a.out}, packpipe.dataset_files(dataset))

    model = TinyLM(layers=4)
    # Also writes model.json (with the activation dtype, the module's fp32: planning's default) and device.json.
    cost = pt.cost_model(model, CPU_DEVICE, directory=directory)
    if a.cli:
        subprocess.run([a.cli, "plan", "--manifest", a.manifest, "--model", os.path.join(directory, "model.json"),
                        "--device", os.path.join(directory, "device.json"), "--stages", str(STAGES),
                        "--memory-mb", str(MEMORY_MB), "--global-batch-tokens", str(TOKENS)]
                       + (["--iterations", str(a.iterations)] if a.iterations else [])
                       + ["--no-split-backward", "--tied-embedding", "--no-baselines",
                          "--out", a.out], check=True, stdout=subprocess.DEVNULL)
    else:
        planner = packpipe.plan_epoch(cost, dataset, shape=packpipe.PipelineShape(stages=STAGES, memory_mb=MEMORY_MB),
                                      global_batch_tokens=TOKENS, iterations=a.iterations,
                                      split_backward=False, tied_embedding=True)
        with packpipe.PlanFileWriter(a.out, inputs=dataset) as writer:  # (refuses to write over what it reads)
            writer.expect_iterations(0, len(planner))  # the file says it is complete only if it holds them all
            for it in planner:
                for plan in it.result.plans:  # one per data-parallel replica
                    writer.append(plan)
    reader = packpipe.PlanFileReader(a.out)
    print(f"planned {len(reader)} plans into {a.out} ({'the packpipe command' if a.cli else 'plan_epoch'})",
          flush=True)
    if not a.no_train:
        torch.set_num_threads(1)
        train_pipeline.main(["--manifest", a.manifest, "--pp", str(STAGES), "--plan-file", a.out, "--iterations", "0"])


if __name__ == "__main__":
    main()

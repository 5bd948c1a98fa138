#!/usr/bin/python3
"""Is packpipe faster on my model? packpipe.torch.compare measures it on your model, data and ranks.

    python3 examples/compare_own_model.py                                             # one process
    python3 -m packpipe.torch.run --nproc-per-node 2 examples/compare_own_model.py    # 2 replicas (DDP)

The model of your own (examples/my_model.py) is trained for real with packpipe's plans and with the
baselines you would run otherwise (fixed micro-batches padded or packed as HF's
DataCollatorWithFlattening does, token budgets, varlen packing, WLB-LLM), each at every setting of a
small grid, on the same global batches; every side plans with one cost model calibrated first on
packpipe's own steps; the sides alternate round by round. The table gives measured tokens/s and
packpipe's speed-up over each, and the verdict names the best baseline, the round-to-round range and
whether both sides ran the same plan.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

import packpipe
import packpipe.torch as pt
from packpipe import _check
from packpipe.torch.models import CPU_DEVICE

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from my_model import TinyLM, loss_fn  # noqa: E402  (the model of your own)

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", default=os.path.join(HERE, "..", "data", "demo", "manifest.json"))
    ap.add_argument("--global-batch-tokens", type=_check.arg_int(1, _check.MAX_COUNT), default=4096)
    ap.add_argument("--iterations", type=_check.arg_int(1, _check.MAX_COUNT), default=4)
    ap.add_argument("--rounds", type=_check.arg_int(1, 10 ** 6), default=3)
    ap.add_argument("--grid", type=_check.arg_int(1, 2 ** 31), nargs="+", default=[1, 2, 4, 8],
                    help="baseline micro-batch sizes (and packing rows)")
    ap.add_argument("--budgets", type=_check.arg_int(1, 2 ** 20), nargs="+", default=[1, 2, 4],
                    help="token budgets and WLB capacities, in multiples of the longest sample's power of 2")
    ap.add_argument("--calibrate-steps", type=_check.arg_int(0, _check.MAX_COUNT), default=6)
    ap.add_argument("--memory-mb", type=_check.arg_float(0, 1e12), default=0,
                    help="memory per device the plans keep to (MB; 0: the device's)")
    ap.add_argument("--json", help="also write the comparison as JSON here (rank 0)")
    a = ap.parse_args(argv)
    if a.json:
        try:
            packpipe.check_outputs({"--json": a.json}, packpipe.dataset_files(packpipe.MultiTaskDataset(a.manifest)))
        except ValueError as e:
            ap.error(str(e))
    torch.set_num_threads(1)
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    rank0 = not dist.is_initialized() or dist.get_rank() == 0

    def model_fn():
        return TinyLM(layers=2)                      # the same weights every call (its seed)

    cost = pt.cost_model(model_fn(), CPU_DEVICE)
    result = pt.compare(model_fn, loss_fn, a.manifest, cost, global_batch_tokens=a.global_batch_tokens,
                        iterations=a.iterations, rounds=a.rounds, grid=a.grid, budgets=a.budgets,
                        calibrate_steps=a.calibrate_steps, memory_mb=a.memory_mb,
                        progress=lambda text: rank0 and print(f"  {text}", file=sys.stderr, flush=True))
    if rank0:
        print(result.table(), flush=True)
        if a.json:
            packpipe.write_file_atomic(a.json, result.to_json(), what="--json")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

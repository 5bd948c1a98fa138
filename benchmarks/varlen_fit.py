#!/usr/bin/python3
"""Measured: the profiled model's price of varlen rows it never measured, against their measured times.

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/varlen_fit.py --out varlen_fit.json

1. Profiles the reference GPT layer (packpipe.torch.profile) on this machine over a padded grid of
   (micro-batch size, sequence length), as `packpipe profile` does, and builds packpipe's profiled
   cost model from it (its fit over FLOP features and residuals, docs/design/003; a varlen row is read
   at the dense shape with the same tokens and attention sums, docs/design/014).
2. Measures held-out varlen rows: one packed row of random segment lengths (each at most the grid's
   longest) through the same layer with packpipe.torch.attention (the executor's per-segment
   attention), forward and backward, medians of repeats.
3. Reports the relative error of the profiled model's forward + backward against the measured time
   per row, beside the analytic model's error and the leave-one-out error on the grid's own points.

Everything runs on the CPU here (or --device cuda); the errors are of this machine's measurements.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

import packpipe
from packpipe import _check
from packpipe.torch import attention as attn
from packpipe.torch import models
from packpipe.torch import profile as prof


class PackedRow:
    """A stand-in for a micro-batch of layout packed: one row of `lengths` segments."""
    layout = "packed"

    def __init__(self, lengths, device):
        seg = np.concatenate([np.full(n, k + 1, dtype=np.int32) for k, n in enumerate(lengths)])[None]
        self._device = device
        self._layout = self
        self._seg = seg
        self._cache = {}

    def native(self, decoder):
        return {"segment_ids": self._seg}

    def cached(self, key, device, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


def time_row(block, lengths, hidden, device, dtype, repeats, warmup):
    """Median forward and backward ms of one packed row through `block`."""
    batch = PackedRow(lengths, device)
    n = int(sum(lengths))
    fwd, bwd = [], []
    for k in range(warmup + repeats):
        x = torch.randn(1, n, hidden, device=device, dtype=dtype, requires_grad=True)
        t0 = time.perf_counter()
        y = block(x, batch, True)
        t1 = time.perf_counter()
        y.backward(torch.randn_like(y))
        t2 = time.perf_counter()
        if k >= warmup:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
        block.zero_grad(set_to_none=True)
    return statistics.median(fwd), statistics.median(bwd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=_check.arg_int(8, 8192), default=128)
    ap.add_argument("--heads", type=_check.arg_int(1, 128), default=4)
    ap.add_argument("--mbs", type=_check.arg_ints(1, 1024), default=[1, 2, 4, 8])
    ap.add_argument("--seq", type=_check.arg_ints(1, 1 << 16), default=[32, 64, 128, 256, 512, 1024, 2048])
    ap.add_argument("--rows", type=_check.arg_int(1, 1000), default=24, help="held-out varlen rows")
    ap.add_argument("--repeats", type=_check.arg_int(1, 100), default=5)
    ap.add_argument("--warmup", type=_check.arg_int(0, 100), default=2)
    ap.add_argument("--seed", type=_check.arg_int(0, 2 ** 32 - 1), default=3)
    ap.add_argument("--device", type=_check.arg_device, default="cpu")
    ap.add_argument("--out", help="write the JSON result here")
    a = ap.parse_args()
    if a.hidden % a.heads:
        ap.error("--hidden must be a multiple of --heads")
    if a.out:
        try:
            packpipe.check_outputs({"--out": a.out}, [os.path.abspath(__file__)], probe=True)
        except ValueError as e:
            ap.error(str(e))
    torch.manual_seed(a.seed)
    dtype = torch.float32
    device = torch.device(a.device)
    ffn = 4 * a.hidden
    cfg = models.GPTConfig(vocab_size=256, hidden=a.hidden, layers=1, heads=a.heads, ffn=ffn, dtype=dtype)
    tmp = tempfile.mkdtemp(prefix="packpipe-varlen-fit-")
    # 1. The padded grid, profiled as `packpipe profile` does (the encoder layer only: the kind varlen
    # attention changes), and the profiled model built from it.
    layers = [l for l in prof.reference_layers("gpt", a.hidden, a.heads, ffn, 256, 1 << 16, device, dtype)
              if l.kind == "encoder"]
    t0 = time.perf_counter()
    points = prof.profile(layers, a.mbs, a.seq, [0], ["none"], device, a.repeats, a.warmup, progress=False)
    profile_s = time.perf_counter() - t0
    grid = os.path.join(tmp, "grid.json")
    model_file = os.path.join(tmp, "model.json")
    spec = json.loads(cfg.cost_model_json())
    spec["name"] = "varlen-fit"
    packpipe.write_file_atomic(model_file, json.dumps(spec))
    packpipe.write_profile(grid, points, model="varlen-fit", device="cpu")
    device_file = os.path.join(tmp, "device.json")
    packpipe.write_file_atomic(device_file, json.dumps(models.CPU_DEVICE))
    profiled = packpipe.CostModel(model_file, device_file, profiles=[grid])
    analytic = packpipe.CostModel(model_file, device_file)
    loo = packpipe.profile_leave_one_out([grid], model_file)
    # 2. Held-out varlen rows: random segments (log-normal, median 1/8 of the longest length, each at
    # most the grid's longest) summing to a token count drawn over the grid's range.
    rng = np.random.default_rng(a.seed)
    longest = max(a.seq)
    block = layers[0].module
    rows = []
    for r in range(a.rows):
        tokens = int(rng.integers(max(a.seq) // 2, max(a.seq) * max(a.mbs) // 2 + 1))
        lens = []
        while sum(lens) < tokens:
            lens.append(int(np.clip(rng.lognormal(np.log(longest / 8), 1.0), 8, longest)))
        f, b = time_row(block, lens, a.hidden, device, dtype, a.repeats, a.warmup)
        pv = profiled.query("encoder", segments=lens)
        av = analytic.query("encoder", segments=lens)
        rows.append({"segments": len(lens), "tokens": int(sum(lens)), "sum_l2": int(sum(x * x for x in lens)),
                     "measured_ms": f + b, "profiled_ms": pv.forward_ms + pv.backward_ms,
                     "analytic_ms": av.forward_ms + av.backward_ms})
    err = lambda k: [abs(x[k] - x["measured_ms"]) / x["measured_ms"] for x in rows]  # noqa: E731
    out = {"device": str(device), "hidden": a.hidden, "heads": a.heads, "grid": {"mbs": a.mbs, "seq": a.seq},
           "profile_s": profile_s, "rows": rows,
           "profiled_error_median": statistics.median(err("profiled_ms")),
           "profiled_error_mean": statistics.mean(err("profiled_ms")),
           "profiled_error_max": max(err("profiled_ms")),
           "analytic_error_median": statistics.median(err("analytic_ms"))}
    out["grid_leave_one_out_time_mape"] = loo["time_mape"]
    text = json.dumps(out, indent=1)
    print(f"held-out varlen rows: profiled model error median {100 * out['profiled_error_median']:.1f}% "
          f"(mean {100 * out['profiled_error_mean']:.1f}%, max {100 * out['profiled_error_max']:.1f}%); "
          f"uncalibrated analytic {100 * out['analytic_error_median']:.1f}%"
          + f"; grid leave-one-out {out['grid_leave_one_out_time_mape']:.1f}%")
    if a.out:
        packpipe.write_file_atomic(a.out, text, inputs=[os.path.abspath(__file__)], what="--out")
    return 0


if __name__ == "__main__":
    sys.exit(main())

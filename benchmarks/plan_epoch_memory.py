"""Peak memory of `packpipe plan` over a whole epoch of 1 M samples.

Writes a Megatron dataset of 1 M sequences with long-tailed lengths (the .idx for real, the .bin
as a sparse file of the right size: planning reads lengths only), plans the whole epoch with plans
streamed to a file, and reports the process's peak RSS (getrusage of the child) with the
iteration count and wall time.

    /usr/bin/python3 benchmarks/plan_epoch_memory.py [--samples N] [--packpipe build/packpipe]
"""
import argparse
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    import packpipe
except ImportError:  # run from the source tree without PYTHONPATH
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "python"))
    import packpipe
from packpipe import _check


def write_dataset(prefix, n, seed=3):
    rng = np.random.default_rng(seed)
    return write_lengths(prefix, np.clip(rng.lognormal(np.log(120.0), 1.1, n), 4, 4096).astype(np.int32))


def write_lengths(prefix, sizes):
    """A Megatron dataset (MMIDIDX, uint16 tokens) of sequences of these lengths; returns its tokens."""
    n = len(sizes)
    pointers = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1].astype(np.int64) * 2, out=pointers[1:])
    doc_idx = np.arange(n + 1, dtype=np.int64)
    packpipe.write_file_atomic(prefix + ".idx", b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8)
                               + struct.pack("<Q", n) + struct.pack("<Q", n + 1) + sizes.tobytes()
                               + pointers.tobytes() + doc_idx.tobytes())
    # The .bin is a sparse file (no data blocks written: planning reads lengths only), created in
    # this run's own temporary folder, which holds nothing else.
    with open(prefix + ".bin", "xb") as f:
        f.truncate(int(sizes.astype(np.int64).sum()) * 2)
    return int(sizes.astype(np.int64).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=_check.arg_int(1, 2 ** 31 - 1), default=1_000_000)
    ap.add_argument("--packpipe", default=os.path.join("build", "packpipe"))
    ap.add_argument("--extra", nargs="*", default=[])
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "epoch")
        tokens = write_dataset(prefix, a.samples)
        cmd = [a.packpipe, "plan", "--dataset", prefix, "--global-batch-tokens", "65536", "--stages", "4",
               "--layers-per-stage", "4", "--no-baselines", "--out", os.path.join(tmp, "epoch.plan"),
               "--json"] + a.extra
        t0 = time.time()
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        wall = time.time() - t0
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        plan_bytes = os.path.getsize(os.path.join(tmp, "epoch.plan"))
        idx_bytes = os.path.getsize(prefix + ".idx")
    rep = json.loads(out)
    print(json.dumps({"samples": a.samples, "tokens": tokens, "iterations": rep["total"]["iterations"],
                      "peak_rss_mib": peak_kib / 1024, "idx_mib": idx_bytes / 2**20,
                      "plan_file_mib": plan_bytes / 2**20, "wall_s": wall,
                      "planning_ms_median": rep["total"]["planning_ms"]["median"]}, indent=2))


if __name__ == "__main__":
    sys.exit(main())

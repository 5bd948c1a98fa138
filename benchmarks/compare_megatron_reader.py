"""Side-by-side: Megatron's Python reader against packpipe, on the same data, in one run.

The baseline re-implements, line for line, what Megatron-LM's `IndexedDataset.get` (numpy memmap +
`numpy.frombuffer` per sequence) and `GPTDataset.__getitem__` (sample index walk + `numpy.concatenate`
of the pieces) do, since Megatron itself cannot be installed here. packpipe is measured through its
Python binding (`IndexedDataset.get`, the same Python-level walk) and through its C++ assembly
(`packpipe_bench`, BM_GptSampleAssembly on shuffled documents).

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/compare_megatron_reader.py [--docs N] [--bench build/packpipe_bench]

Prints medians of 5 runs and the ratios; `--json` prints one JSON object.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import packpipe

SEQ = 2048


def build_dataset(prefix, docs, seed=7):
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(245.0), 0.9, docs), 8, 8192).astype(np.int64)
    ranks = np.arange(1, 50258, dtype=np.float64)
    p = ranks ** -1.1
    p /= p.sum()
    b = packpipe.IndexedDatasetBuilder(prefix, np.uint16)
    for n in lengths:
        b.add_item(rng.choice(50257, size=int(n), p=p).astype(np.uint16))
        b.end_document()
    b.finalize()


class MegatronStyleReader:
    """Megatron-LM core IndexedDataset: numpy views over the .idx and a memmap of the .bin."""

    def __init__(self, prefix):
        idx = np.memmap(prefix + ".idx", mode="r", order="C")
        buf = memoryview(idx)
        s = int(np.frombuffer(buf, dtype=np.uint64, count=1, offset=18)[0])
        d = int(np.frombuffer(buf, dtype=np.uint64, count=1, offset=26)[0])
        self.sizes = np.frombuffer(buf, dtype=np.int32, count=s, offset=34)
        self.pointers = np.frombuffer(buf, dtype=np.int64, count=s, offset=34 + 4 * s)
        self.doc_idx = np.frombuffer(buf, dtype=np.int64, count=d, offset=34 + 12 * s)
        self.dtype = np.uint16
        self.bin_mmap = np.memmap(prefix + ".bin", mode="r", order="C")
        self.bin = memoryview(self.bin_mmap)

    def __len__(self):
        return len(self.sizes)

    def get(self, idx, offset=0, length=None):
        pointer, size = self.pointers[idx], self.sizes[idx]
        if length is None:
            length = size - offset
        pointer += offset * 2
        return np.frombuffer(self.bin, dtype=self.dtype, count=length, offset=pointer)


def build_sample_index(sizes, order, seq):
    """Megatron build_sample_idx: (position in order, offset) per sample, seq + 1 tokens each."""
    out = [(0, 0)]
    pos, off = 0, 0
    remaining = seq + 1
    n = len(order)
    while pos < n:
        avail = int(sizes[order[pos]]) - off
        if avail >= remaining:
            off += remaining - 1
            out.append((pos, off))
            remaining = seq + 1
            if off == int(sizes[order[pos]]) - 1:
                pos, off = pos + 1, 0
            continue
        remaining -= avail
        pos, off = pos + 1, 0
    return np.array(out, dtype=np.int64)


def getitem(ds, order, sample_index, k):
    """GPTDataset._query_document_sample_shuffle_indices, without the shuffle index indirection."""
    beg, beg_off = sample_index[k]
    end, end_off = sample_index[k + 1]
    if beg == end:
        return ds.get(int(order[beg]), offset=int(beg_off), length=int(end_off - beg_off + 1))
    parts = []
    for i in range(beg, end + 1):
        offset = 0 if i > beg else int(beg_off)
        length = None if i < end else int(end_off + 1)
        parts.append(ds.get(int(order[i]), offset=offset, length=length))
    return np.concatenate(parts)


class PackpipeGet:
    """Same walk through packpipe's binding (get(idx, offset, length) returns a view)."""

    def __init__(self, ds):
        self.ds = ds

    def get(self, idx, offset=0, length=None):
        return self.ds.get(idx, offset, -1 if length is None else length)


def time_assembly(ds, order, sample_index, samples, rng):
    ks = rng.integers(0, len(sample_index) - 1, size=samples)
    t0 = time.perf_counter()
    tokens = 0
    for k in ks:
        tokens += len(getitem(ds, order, sample_index, int(k)))
    return tokens / (time.perf_counter() - t0)


def time_reads(ds, n, count, rng):
    ids = rng.integers(0, n, size=count)
    t0 = time.perf_counter()
    tokens = 0
    for i in ids:
        tokens += len(ds.get(int(i)))
    return tokens / (time.perf_counter() - t0)


def cpp_assembly(bench):
    out = subprocess.run([bench, "--benchmark_filter=BM_GptSampleAssembly/zst:0/shuffled:1$",
                          "--benchmark_repetitions=5", "--benchmark_report_aggregates_only=true",
                          "--benchmark_min_time=0.3", "--benchmark_format=json"],
                         check=True, capture_output=True, text=True).stdout
    for b in json.loads(out)["benchmarks"]:
        if b["name"].endswith("_median"):
            return b["tokens_per_s"]
    raise RuntimeError("no median in packpipe_bench output")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=100000)
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--bench", default=os.path.join("build", "packpipe_bench"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "data")
        build_dataset(prefix, args.docs)
        meg = MegatronStyleReader(prefix)
        pp = PackpipeGet(packpipe.IndexedDataset(prefix))
        rng = np.random.default_rng(1)
        order = rng.permutation(len(meg))
        sample_index = build_sample_index(meg.sizes, order, SEQ)
        for _ in range(2):  # warm the page cache and both code paths
            time_assembly(meg, order, sample_index, 200, rng)
            time_assembly(pp, order, sample_index, 200, rng)
        runs = {"megatron_python_assembly": [], "packpipe_python_assembly": [],
                "megatron_python_reads": [], "packpipe_python_reads": []}
        for _ in range(5):
            runs["megatron_python_assembly"].append(time_assembly(meg, order, sample_index, args.samples, rng))
            runs["packpipe_python_assembly"].append(time_assembly(pp, order, sample_index, args.samples, rng))
            runs["megatron_python_reads"].append(time_reads(meg, len(meg), 20000, rng))
            runs["packpipe_python_reads"].append(time_reads(pp, len(meg), 20000, rng))
        med = {k: statistics.median(v) for k, v in runs.items()}
    med["packpipe_cpp_assembly"] = cpp_assembly(args.bench) if os.path.exists(args.bench) else None
    base = med["megatron_python_assembly"]
    result = {"unit": "tokens/s (median of 5)", "docs": args.docs, **med,
              "ratio_packpipe_cpp_over_megatron": (med["packpipe_cpp_assembly"] / base
                                                   if med["packpipe_cpp_assembly"] else None),
              "ratio_packpipe_python_over_megatron": med["packpipe_python_assembly"] / base}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for k in ("megatron_python_reads", "packpipe_python_reads", "megatron_python_assembly",
              "packpipe_python_assembly", "packpipe_cpp_assembly"):
        v = result[k]
        print(f"{k:28s} {v / 1e6:10.1f} M tokens/s" if v else f"{k:28s} (not measured: {args.bench} missing)")
    if result["ratio_packpipe_cpp_over_megatron"]:
        print(f"GPT sample assembly, packpipe C++ / Megatron-style Python: "
              f"{result['ratio_packpipe_cpp_over_megatron']:.1f}x")


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Same-run comparison of two packpipe_bench binaries (A: baseline, B: candidate).

Runs the two binaries alternately for `--rounds` rounds on the same benchmark filter and reports,
per benchmark, the median CPU time of each side over all repetitions of all rounds and the ratio
B / A. Interleaving puts both sides under the same machine noise.

    benchmarks/ab_compare.py OLD/packpipe_bench NEW/packpipe_bench --filter 'BM_Partition/' --rounds 3
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile


def run(binary, flt, reps, env_small):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [binary, f"--benchmark_filter={flt}", f"--benchmark_repetitions={reps}",
               f"--benchmark_out={f.name}", "--benchmark_out_format=json"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                       env={"PACKPIPE_BENCH_SMALL": "1"} if env_small else None)
        data = json.load(open(f.name))
    out = {}
    for b in data["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        key = "real_time" if "real_time" in b["name"] or b["name"].endswith("/real_time") else "cpu_time"
        out.setdefault(b["run_name"], []).append(b[key])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--filter", default=".")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    a, b = {}, {}
    for _ in range(args.rounds):
        for side, binary in ((a, args.a), (b, args.b)):
            for k, v in run(binary, args.filter, args.repetitions, False).items():
                side.setdefault(k, []).extend(v)
    rows = []
    for k in a:
        if k not in b:
            continue
        ma, mb = statistics.median(a[k]), statistics.median(b[k])
        rows.append({"benchmark": k, "a": ma, "b": mb, "ratio": mb / ma, "samples": len(a[k])})
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        return
    print(f"{'benchmark':70s} {'A median':>12s} {'B median':>12s} {'B/A':>7s}")
    for r in rows:
        print(f"{r['benchmark'][:70]:70s} {r['a']:12.4g} {r['b']:12.4g} {r['ratio']:7.3f}")
    if rows:
        print(f"{'median ratio over ' + str(len(rows)) + ' benchmarks':70s} {'':12s} {'':12s} "
              f"{statistics.median(r['ratio'] for r in rows):7.3f}")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Planning time per iteration of two packpipe binaries on the same batches, alternating.

    benchmarks/plan_time_ab.py OLD/packpipe NEW/packpipe --rounds 5 --iterations 40

Each round runs `packpipe plan` of `make demo` (GPT-6.7B on 4 x A100-40GB stages, 64K-token global
batches of the embedded data, the analytic model) with one planning thread and no baseline report,
A then B (B then A in odd rounds), and takes each binary's per-iteration planning_ms (partition,
schedule search, candidates, plan build). Prints the median per iteration of each side over all
rounds and the ratio B / A; --json for the whole result. Interleaving puts both sides under the same
machine noise.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plan_ms(binary, iterations, extra):
    args = [binary, "plan", "--manifest", os.path.join(ROOT, "data", "demo", "manifest.json"), "--model", "gpt-6.7b",
            "--device", "A100-40GB", "--stages", "4", "--layers-per-stage", "4", "--global-batch-tokens", "65536",
            "--seed", "1234", "--iterations", str(iterations), "--threads", "1", "--no-baselines", "--json"] + extra
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [it["planning_ms"] for it in json.loads(out)["iterations"]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--new-args", nargs=argparse.REMAINDER, default=[], help="extra flags for the new binary")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.rounds < 1 or a.iterations < 1:
        ap.error("--rounds and --iterations must be at least 1")
    ms = {"old": [], "new": []}
    for r in range(a.rounds):
        for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
            ms[side] += plan_ms(a.old if side == "old" else a.new, a.iterations, a.new_args if side == "new" else [])
    old, new = statistics.median(ms["old"]), statistics.median(ms["new"])
    result = {"median_ms_old": old, "median_ms_new": new, "ratio_new_over_old": new / old,
              "p90_ms_old": sorted(ms["old"])[int(0.9 * len(ms["old"]))],
              "p90_ms_new": sorted(ms["new"])[int(0.9 * len(ms["new"]))],
              "iterations": a.iterations, "rounds": a.rounds}
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"planning time per iteration, median over {a.rounds} rounds x {a.iterations} iterations: "
              f"old {old:.2f} ms, new {new:.2f} ms, new / old {new / old:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

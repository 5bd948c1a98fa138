"""Offline planning at FLAN's scale: sampler, resume and memory at 20, 200 and 2,000 tasks.

Builds the synthetic shapes itself: T tasks of 5,000 samples each (log-normal lengths from 10 to
4,000 tokens, each task its own Megatron dataset; the .idx for real, the .bin a sparse file of the
right size: sampling and planning read lengths only), a weighted manifest over them, and measures
on each shape:

- `Sampler` epoch: a whole epoch of token-budget batches through the Python API, in samples/s;
- `Sampler.restore` near the start and near the end of the epoch (a state saved there);
- resume by re-planning: `plan_epoch(first_iteration=k)` up to its first delivered iteration, near
  the start and near the end;
- peak memory (the child's maxrss) of `dataset info`, `dataset sample` over the whole epoch and
  `plan --no-baselines` over the epoch (plans streamed to a file);
- `--parts baselines`: planning time per iteration on one thread (the report's median of its first
  --plan-iterations iterations) without the report (`--no-baselines`), with the baselines as run
  (the default) and under the search (`--baseline-schedule search`), alternated round by round, and
  with --before, that binary's default report beside; the plan files are compared byte for byte.

Every figure is the median of --rounds runs. Optional: --megatron DIR times Megatron-LM's
`helpers.cpp` blended index build (compiled outside the repository) on the same shapes.

    /usr/bin/python3 benchmarks/flan_scale.py [--tasks 20 200 2000] [--per-task 5000] [--json]
"""
import argparse
import json
import os
import resource
import statistics
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plan_epoch_memory import write_lengths  # noqa: E402

BUDGET = 65536


def write_task(prefix, n, rng):
    """A Megatron dataset of n sequences (uint16 tokens); returns the lengths."""
    sizes = np.clip(rng.lognormal(np.log(200.0), 1.0, n), 10, 4000).astype(np.int32)
    write_lengths(prefix, sizes)  # the .bin sparse: no data blocks written
    return sizes


def build_shape(folder, tasks, per_task, seed=7):
    rng = np.random.default_rng(seed)
    entries = []
    for t in range(tasks):
        name = "task%05d" % t
        write_task(os.path.join(folder, name), per_task, rng)
        entries.append({"name": name, "dataset": name, "weight": float(1 + (t % 7))})
    manifest = os.path.join(folder, "manifest.json")
    packpipe.write_file_atomic(manifest, json.dumps({"version": 1, "tasks": entries}).encode())
    return manifest


def child_peak(cmd):
    """Wall seconds and peak RSS (MiB) of a child process."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.execv(cmd[0], cmd)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit("flan_scale: %s failed (exit %d)" % (" ".join(cmd), os.waitstatus_to_exitcode(status)))
    return wall, usage.ru_maxrss / 1024.0


def median_of(rounds, fn):
    return statistics.median(fn() for _ in range(rounds))


def epoch_time(data, rounds):
    """Median seconds of a whole epoch of the Python Sampler, and its batch count."""
    def epoch():
        s = packpipe.Sampler(data, global_batch_tokens=BUDGET)
        t0 = time.perf_counter()
        n = 0
        for b in s:
            n += 1
        return time.perf_counter() - t0, n
    runs = [epoch() for _ in range(rounds)]
    return statistics.median(r[0] for r in runs), runs[0][1]


def planning_ms(binary, manifest, extra, plans, iterations):
    """The report's median planning time per iteration (ms, one thread) of `binary plan`."""
    out = subprocess.run([binary, "plan", "--manifest", manifest, "--global-batch-tokens", str(BUDGET), "--stages",
                          "4", "--threads", "1", "--iterations", str(iterations), "--out", plans, "--json", *extra],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["total"]["planning_ms"]["median"]


def measure_baselines(manifest, a, row):
    """Planning time per iteration without the report, with it as run and searched (and --before's)."""
    sides = {"none": (a.packpipe, ["--no-baselines"]), "as_run": (a.packpipe, ["--baseline-schedule", "as-run"]),
             "search": (a.packpipe, ["--baseline-schedule", "search"])}
    if a.before:
        sides["before"] = (a.before, [])
    times = {k: [] for k in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(a.rounds):
            for k, (binary, extra) in sides.items():
                times[k].append(planning_ms(binary, manifest, extra, os.path.join(tmp, k + ".plan"),
                                            a.plan_iterations))
        first = open(os.path.join(tmp, "none.plan"), "rb").read()
        row["baseline_plans_identical"] = all(open(os.path.join(tmp, k + ".plan"), "rb").read() == first
                                              for k in sides)
    for k, v in times.items():
        row["plan_ms_" + k] = statistics.median(v)
    for k in sides:
        if k != "none":
            row["plan_ratio_" + k] = row["plan_ms_" + k] / row["plan_ms_none"]


def measure(manifest, a):
    data = packpipe.MultiTaskDataset(manifest)
    row = {"samples": len(data)}
    if "baselines" in a.parts:
        measure_baselines(manifest, a, row)
    if "sampler" in a.parts:
        row["epoch_s"], row["batches"] = epoch_time(data, a.rounds)
        row["samples_per_s"] = row["samples"] / row["epoch_s"]

        # States near the start and near the end.
        s = packpipe.Sampler(data, global_batch_tokens=BUDGET)
        states = []
        for k, _ in enumerate(s):
            if k in (1, row["batches"] - 2):
                states.append(s.state())
        def restore(state):
            fresh = packpipe.Sampler(data, global_batch_tokens=BUDGET)
            t0 = time.perf_counter()
            fresh.restore(state)
            return time.perf_counter() - t0
        row["restore_start_s"] = median_of(a.rounds, lambda: restore(states[0]))
        row["restore_end_s"] = median_of(a.rounds, lambda: restore(states[1]))

        cost = packpipe.CostModel("gpt-6.7b", "A100-80GB")
        if cost is not None:
            def replan(first):
                t0 = time.perf_counter()
                planner = packpipe.plan_epoch(cost, data, global_batch_tokens=BUDGET, first_iteration=first,
                                              threads=1)
                next(iter(planner))
                return time.perf_counter() - t0
            row["replan_start_s"] = median_of(a.rounds, lambda: replan(1))
            row["replan_end_s"] = median_of(a.rounds, lambda: replan(row["batches"] - 1))

    cli = a.packpipe
    if "cli" in a.parts:
        row["info_s"], row["info_mib"] = map(statistics.median, zip(*[child_peak([cli, "dataset", "info", manifest])
                                                                       for _ in range(a.rounds)]))
        row["sample_s"], row["sample_mib"] = child_peak([cli, "dataset", "sample", manifest, "--batches", "0",
                                                          "--global-batch-tokens", str(BUDGET), "--json"])

    if "plan" not in a.parts:
        return row
    for name, binary in (("plan", cli), ("plan_before", a.before)):
        if binary is None:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            # The cheapest planning settings (no slices, 1F1B): the figure is the report's memory, which
            # grows with the iterations, not the planning's, which does not.
            row[name + "_s"], row[name + "_mib"] = child_peak(
                [binary, "plan", "--manifest", manifest, "--global-batch-tokens", str(BUDGET), "--stages", "4",
                 "--layers-per-stage", "4", "--slicing", "off", "--schedule", "1f1b", "--threads", "2",
                 "--out", os.path.join(tmp, "e.plan"), "--report", os.path.join(tmp, "report.json"), "--json"])
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=_check.arg_int(1, 100000), nargs="+", default=[20, 200, 2000])
    ap.add_argument("--per-task", type=_check.arg_int(1, 10 ** 7), default=5000)
    ap.add_argument("--same-samples", type=_check.arg_int(0, 10 ** 9), default=10_000_000,
                    help="also time the sampler over this many samples split into each task count (0: skip)")
    ap.add_argument("--rounds", type=_check.arg_int(1, 100), default=3)
    ap.add_argument("--packpipe", default=os.path.join("build", "packpipe"))
    ap.add_argument("--parts", nargs="+", choices=["sampler", "cli", "plan", "baselines"],
                    default=["sampler", "cli", "plan"],
                    help="what to measure (plan: a whole epoch planned; baselines: planning time with and without "
                         "the baselines' report)")
    ap.add_argument("--plan-iterations", type=_check.arg_int(1, 10 ** 6), default=40,
                    help="iterations planned by --parts baselines")
    ap.add_argument("--before", default=None,
                    help="another packpipe binary whose `plan` memory (and planning time) to measure beside")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args()
    rows = []
    equal = {}
    if a.same_samples:
        # The sampler over the same number of samples split into more tasks: the cost per sample
        # should not grow with the task count.
        for tasks in a.tasks:
            with tempfile.TemporaryDirectory() as tmp:
                data = packpipe.MultiTaskDataset(build_shape(tmp, tasks, a.same_samples // tasks))
                sec, _ = epoch_time(data, a.rounds)
                equal[tasks] = len(data) / sec
                print("flan_scale: %d tasks x %d samples: %.2f M samples/s" % (tasks, a.same_samples // tasks,
                                                                              equal[tasks] / 1e6),
                      file=sys.stderr, flush=True)
                del data
    for tasks in a.tasks:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            manifest = build_shape(tmp, tasks, a.per_task)
            print("flan_scale: %d tasks x %d samples built in %.1f s" % (tasks, a.per_task, time.perf_counter() - t0),
                  file=sys.stderr, flush=True)
            row = {"tasks": tasks, "per_task": a.per_task}
            if tasks in equal:
                row["equal_samples_per_s"] = equal[tasks]
                row["equal_slowdown"] = equal[min(equal)] / equal[tasks]
            row.update(measure(manifest, a))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    if a.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

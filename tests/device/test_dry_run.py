#!/usr/bin/env python3
"""The device check's dry run (scripts/device-check.sh --dry-run), so that the script the GPU machine
runs cannot rot: every step that can run on a CPU passes and records its figures, the steps that need
CUDA say so, the report files are what the device tool brings back ($OUT: at most 8 files, none in a
folder), a failing step is recorded and the next one runs, and a spent budget skips steps.

    test_dry_run.py --build-dir BUILD --python PYTHON
"""
import argparse
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "device-check.sh")


def load_check():
    spec = importlib.util.spec_from_file_location("device_check", os.path.join(ROOT, "scripts", "device_check.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def dry_run(a, dc, out, *extra, expect_rc=0):
    env = dict(os.environ, DEVICE_CHECK_PYTHON=a.python)
    r = subprocess.run([SCRIPT, "--dry-run", "--build-dir", a.build_dir, "--out", out, *extra], env=env,
                       capture_output=True, text=True, timeout=540)
    assert r.returncode == expect_rc, \
        f"exit {r.returncode}, expected {expect_rc}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    assert set(os.listdir(out)) == set(dc.REPORT_FILES), sorted(os.listdir(out))  # what comes back from $OUT: no folder, <= 8 files
    with open(os.path.join(out, "device-report.json")) as f:
        rep = json.load(f)
    assert rep["format"] == "packpipe-device-report" and rep["version"] == 1 and rep["mode"] == "dry-run"
    assert rep["finished"] is True and rep["wall_s"] <= rep["budget_s"], (rep["wall_s"], rep["budget_s"])
    return rep, r.stdout


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def check_full(a, dc, tmp):
    out = os.path.join(tmp, "full")
    rep, stdout = dry_run(a, dc, out, "--budget", "500")
    names = [s.name for s in dc.STEPS]
    assert [s["name"] for s in rep["steps"]] == names
    steps = {s["name"]: s for s in rep["steps"]}
    for s in dc.STEPS:
        r = steps[s.name]
        if s.needs_cuda:
            assert r["status"] == dc.SKIP_CUDA, (s.name, r)
        else:
            assert r["status"] == "passed", (s.name, r.get("status"), r.get("error"))
            assert r["figures"].get("summary"), (s.name, r["figures"])
            assert 0 <= r["seconds"] <= r["timeout_s"]
    assert {n for n, r in steps.items() if r["status"] == dc.SKIP_CUDA} == {"gpu_tests", "replay_cuda", "nccl_replay"}
    env = rep["environment"]
    assert env["python"] and env["torch"] and not env["torch"].startswith("missing") and env["cores"] >= 1

    b = steps["build"]["figures"]
    assert b["reused"] and b["build_s"] >= 0 and set(b["targets"]) >= {"packpipe_cli", "_core", "packpipe_tests_gpu"}

    p = steps["plans"]["figures"]["plans"]
    assert set(p) == {"demo4", "demo8", "demo1"} and all(v["iterations"] >= 1 for v in p.values())

    runs = steps["replay_threads"]["figures"]["runs"]
    assert runs and len(runs) == 2 * len(dc.SIZES["dry"]["replay"])
    for r in runs:
        assert "error" not in r and r["instructions"] > 0 and finite(r["overhead_us_per_instruction"]), r
        if r["time_scale"] > 0:
            assert finite(r["measured_over_simulated"]) and r["measured_over_simulated"] > 0, r

    t = steps["torch"]["figures"]
    assert t["grad"]["status"] == "passed" and len(t["grad"]["configs"]) == 2
    assert t["grad"]["max_rel_diff"] <= 1e-12, t["grad"]  # CPU against CPU: the same arithmetic
    th = t["throughput"]
    assert th["status"] == "passed" and "packpipe" in th["configs"]
    assert all(finite(c["tokens_per_s"]) and c["tokens_per_s"] > 0 for c in th["configs"].values()), th["configs"]
    assert set(th["ratios"]) == set(th["methods"]) and {"fixed", "packing", "tokens"} <= set(th["methods"])
    assert all(finite(v["measured"]) and finite(v["simulated"]) for v in th["ratios"].values()), th["ratios"]
    assert t["measure"]["status"] == "passed" and t["measure"]["ops"] > 0

    pr = steps["profile"]["figures"]
    assert pr["points"] == 24 and finite(pr["loo_time_mape"]), pr  # 2 mbs x 3 seq: embedding, head, layer x 2 modes
    avp = pr["analytic_vs_profile"]  # the analytic model calibrated on half the profile's points, checked on the rest
    assert avp["points_fit"] + avp["points_check"] == 24 and avp["points_check"] > 0, avp
    for k in ("analytic", "calibrated"):
        assert set(avp[k]) == {"F", "B"} and all(finite(v["median_abs"]) for v in avp[k].values()), avp

    c = steps["calibration"]["figures"]
    assert c["held_out"] is True and len(c["profiles"]) == 2, c  # the short-row grid and the long-row one
    for k in ("analytic", "profiled", "calibrated"):
        assert finite(c[k]["iteration_median_abs"]) and c[k]["iterations"] >= 1, (k, c[k])
    assert "profiled" in c["profiled"]["cost_model"] and "calibrated" in c["calibrated"]["cost_model"]

    md = open(os.path.join(out, "device-report.md")).read()
    for n, r in steps.items():
        assert f"| {n} | {r['status']} |" in md, n
    console = open(os.path.join(out, "device-console.log")).read()
    assert all(f"] {n}: " in console for n in names)
    with tarfile.open(os.path.join(out, "device-logs.tar.gz")) as tar:
        members = set(tar.getnames())
    for n, r in steps.items():
        if r["status"] == "passed":
            assert f"device-check/logs/{n}.log" in members, n
    assert "device-check/artifacts/torch.json" in members
    assert "device-check: 7 passed, 0 failed, 3 skipped" in stdout


def check_failure_and_budget(a, dc, tmp):
    # A failing step (no interpreter: the environment probe fails) is recorded; the next step runs.
    out = os.path.join(tmp, "fail")
    rep, _ = dry_run(a, dc, out, "--steps", "environment,plans", "--python", "/bin/false", expect_rc=1)
    st = {s["name"]: s for s in rep["steps"]}
    assert st["environment"]["status"] == "failed" and "exited with status 1" in st["environment"]["error"]
    assert st["plans"]["status"] == "passed"
    assert st["torch"]["status"].startswith("skipped: not selected")
    assert rep["counts"] == {"passed": 1, "failed": 1, "skipped": len(rep["steps"]) - 2}
    # A spent budget skips what it cannot fit, saying so.
    out = os.path.join(tmp, "budget")
    rep, _ = dry_run(a, dc, out, "--budget", "9", "--steps", "environment,plans")
    st = {s["name"]: s for s in rep["steps"]}
    assert st["environment"]["status"].startswith("skipped: over budget"), st["environment"]
    # A dependency an earlier step did not make: an empty build folder has no CLI.
    out = os.path.join(tmp, "deps")
    empty = os.path.join(tmp, "empty-build")
    os.makedirs(empty)
    b = argparse.Namespace(**dict(vars(a), build_dir=empty))
    rep, _ = dry_run(b, dc, out, "--steps", "plans,replay_threads")
    st = {s["name"]: s for s in rep["steps"]}
    assert st["plans"]["status"] == "skipped: needs cli, which an earlier step did not make", st["plans"]
    assert st["replay_threads"]["status"].startswith("skipped: needs plan_demo4"), st["replay_threads"]


def check_unpack_without_dpkg(dc, tmp):
    """The build step's fallback for a machine without dpkg unpacks a package as dpkg -x does."""
    pkg = os.path.join(tmp, "pkg")
    os.makedirs(os.path.join(pkg, "DEBIAN"))
    os.makedirs(os.path.join(pkg, "usr", "lib", "x86_64-linux-gnu"))
    with open(os.path.join(pkg, "DEBIAN", "control"), "w") as f:
        f.write("Package: devcheck-test\nVersion: 1\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n")
    lib = os.path.join(pkg, "usr", "lib", "x86_64-linux-gnu", "libx.so.1")
    with open(lib, "w") as f:
        f.write("library")
    os.utime(lib, (1_000_000_000, 1_000_000_000))
    os.symlink("libx.so.1", os.path.join(pkg, "usr", "lib", "x86_64-linux-gnu", "libx.so"))
    deb = os.path.join(tmp, "x.deb")
    subprocess.run(["dpkg-deb", "-Zxz", "--root-owner-group", "--build", pkg, deb], check=True, capture_output=True)
    got, want = os.path.join(tmp, "py"), os.path.join(tmp, "dpkg")
    dc.unpack_deb(deb, got)
    subprocess.run(["dpkg", "-x", deb, want], check=True)
    rel = os.path.join("usr", "lib", "x86_64-linux-gnu")
    assert sorted(os.listdir(os.path.join(got, rel))) == sorted(os.listdir(os.path.join(want, rel))) == ["libx.so",
                                                                                                        "libx.so.1"]
    assert os.readlink(os.path.join(got, rel, "libx.so")) == "libx.so.1"
    assert open(os.path.join(got, rel, "libx.so.1")).read() == "library"
    mtime = [os.stat(os.path.join(d, rel, "libx.so.1")).st_mtime for d in (got, want)]
    assert mtime[0] == mtime[1] == 1_000_000_000, mtime
    try:
        dc.unpack_deb(os.path.join(pkg, "DEBIAN", "control"), os.path.join(tmp, "bad"))
        raise AssertionError("a file that is no package was unpacked")
    except dc.StepFailed as e:
        assert "not a Debian package" in str(e)


def check_configure_args(a, dc, tmp):
    """The device build's configure command (the dry run reuses a configured tree): Release, no
    sanitizer, benchmark or fuzzer, CUDA for Hopper when nvcc is there, the carried prefix searched
    first with its pkg-config paths under it."""
    ns = argparse.Namespace(dry_run=False, python=a.python, build_dir=os.path.join(tmp, "b"),
                            out=os.path.join(tmp, "o"), budget=450.0, jobs=0, cuda_arch="90", timeout_scale=1.0)
    os.makedirs(ns.out)
    ctx = dc.Context(ns)
    step = dc.Step("build", "t", None, 10, 1)
    step.log = os.path.join(tmp, "build.log")
    prefix = os.path.join(tmp, "prefix")
    figures = {"problems": []}
    args, env = dc.configure_args(ctx, step, prefix, figures)
    for want in ("-DCMAKE_BUILD_TYPE=Release", "-DPACKPIPE_BUILD_BENCHMARKS=OFF", "-DPACKPIPE_BUILD_FUZZERS=OFF",
                 "-DPACKPIPE_SANITIZE=", f"-DPACKPIPE_PYTHON_EXECUTABLE={a.python}",
                 f"-DCMAKE_PREFIX_PATH={prefix}/usr"):
        assert want in args, (want, args)
    assert args[args.index("-B") + 1] == ns.build_dir
    if dc.find_nvcc():
        assert "-DPACKPIPE_WITH_CUDA=ON" in args and "-DCMAKE_CUDA_ARCHITECTURES=90" in args, args
    else:
        assert "-DPACKPIPE_WITH_CUDA=AUTO" in args and figures["problems"], (args, figures)
    assert env["PKG_CONFIG_SYSROOT_DIR"] == prefix and env["PKG_CONFIG_LIBDIR"].startswith(prefix + "/usr/lib/")
    ctx.console.close()
    shutil.rmtree(ctx.work)


def check_out_a_file(a, tmp):
    """$OUT or --out naming a file: a usage error naming it, exit 2, the file untouched (no traceback)."""
    path = os.path.join(tmp, "a-file")
    with open(path, "w") as f:
        f.write("x")
    env = dict(os.environ, DEVICE_CHECK_PYTHON=a.python, OUT=path)
    for extra, text in (([], f"$OUT {path}: expected a report folder"),
                        (["--out", os.path.join(path, "sub")], "cannot create the report folder")):
        r = subprocess.run([SCRIPT, "--dry-run", "--build-dir", a.build_dir, *extra], env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and text in r.stderr and "Traceback" not in r.stderr, (extra, r.stderr)
    with open(path) as f:
        assert f.read() == "x"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    dc = load_check()
    with tempfile.TemporaryDirectory(prefix="device-dry-") as tmp:
        check_out_a_file(a, tmp)
        check_unpack_without_dpkg(dc, tmp)
        check_configure_args(a, dc, tmp)
        check_failure_and_budget(a, dc, tmp)
        check_full(a, dc, tmp)
    print("device check dry run: 6 passed, 0 failed")


if __name__ == "__main__":
    main()

"""The example trains under packpipe's launcher and under torchrun (Debian's torch 1.13 needs
--redirects 1 --tee 1 there); the launcher names a rank that dies and stops the others."""
import os
import pathlib
import subprocess
import sys
import textwrap

import support

EXAMPLE = support.ROOT / "examples" / "train_gpt.py"
PY = sys.executable


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(pathlib.Path(__import__("packpipe").__file__).parents[1]),
                                      e.get("PYTHONPATH", "")])
    return e


ARGS = ["--manifest", str(support.DEMO / "manifest.json"), "--pp", "2", "--dp", "1", "--iterations", "2",
        "--hidden", "32", "--layers", "2", "--vocab", "256", "--global-batch-tokens", "1024", "--threads", "1"]


def test_example_trains_under_the_launcher():
    r = subprocess.run([PY, "-m", "packpipe.torch.run", "--nproc-per-node", "2", "--timeout", "240", str(EXAMPLE)]
                       + ARGS, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [l for l in r.stdout.splitlines() if "[rank 1] iteration" in l]
    assert len(lines) == 2, r.stdout
    assert "loss" in lines[0] and "tokens/s" in lines[0] and "predicted" in lines[0]


def test_example_trains_under_torchrun():
    r = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--redirects", "1",
                        "--tee", "1", str(EXAMPLE)] + ARGS + ["--json"], env=env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count('"tokens_per_s"') == 2, r.stdout


def test_example_trains_in_one_process():
    r = subprocess.run([PY, str(EXAMPLE)] + ARGS + ["--json"], env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count('"loss"') == 2


def test_the_launcher_names_a_dead_rank_and_stops_the_others(tmp_path):
    script = tmp_path / "die.py"
    script.write_text(textwrap.dedent("""
        import os, signal, time
        if os.environ["RANK"] == "1":
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(600)
    """))
    r = subprocess.run([PY, "-m", "packpipe.torch.run", "--nproc-per-node", "3", "--grace", "1", str(script)],
                       env=env(), capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "rank 1 (pid" in r.stderr and "was killed by signal SIGKILL" in r.stderr, r.stderr
    assert "stopping the ranks still running" in r.stderr


# ---- the example's and the launcher's arguments, outputs and signals --------------------------------

import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

BENCH = support.ROOT / "benchmarks" / "torch_bench.py"


@pytest.mark.parametrize("args, message", [
    (["--pp", "0"], r"argument --pp: must be in \[1, 65536\], found 0"),
    (["--dp", "-1"], "argument --dp: must be in"),
    (["--timeout", "-5"], r"argument --timeout: must be a finite number in \(0, 1e\+09\], found -5"),
    (["--timeout", "nan"], "argument --timeout: must be a finite number"),
    (["--timeout", "0"], "argument --timeout: must be a finite number"),
    (["--global-batch-tokens", "0"], "argument --global-batch-tokens: must be in"),
    (["--calibrate-after", "-1"], "argument --calibrate-after: must be in"),
    (["--iterations", "1.5"], "argument --iterations: expected an integer"),
    (["--lr", "inf"], "argument --lr: must be a finite number"),
    (["--threads", "-2"], "argument --threads: must be in"),
    (["--heads", "3"], "--hidden 32 must be a multiple of --heads 3"),
    (["--method", "greedy"], "argument --method: invalid choice"),
    (["--save-measurements", "m.jsonl"], "--save-measurements needs --calibrate-after"),
    (["--save-calibration", "c.json"], "--save-calibration needs --calibrate-after"),
    (["--device", "tpu"], "argument --device: 'tpu' is not a torch device: Expected one of cpu"),
    (["--device", "meta"], "argument --device: expected cpu or cuda, found 'meta'"),
])
def test_the_example_refuses_bad_arguments_with_argparse_errors(tmp_path, args, message):
    r = subprocess.run([PY, str(EXAMPLE)] + ARGS + args, env=env(), cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert re.search(message, r.stderr), r.stderr
    assert "Traceback" not in r.stderr and not list(tmp_path.iterdir())


def test_the_example_never_writes_over_what_it_reads(tmp_path):
    demo = tmp_path / "demo"
    shutil.copytree(support.DEMO, demo)
    before = {p.name: p.read_bytes() for p in demo.iterdir() if p.is_file()}
    args = [a if a != str(support.DEMO / "manifest.json") else str(demo / "manifest.json") for a in ARGS]
    idx = str(demo / "demo_define_inputs_document.idx")
    cases = [
        (["--save-calibration", str(demo / "manifest.json")], "--save-calibration '.*manifest.json' is the input"),
        (["--save-measurements", idx], "--save-measurements '.*demo_define_inputs_document.idx' is the input"),
        (["--save-calibration", str(demo / "." / "demo_synonyms_targets_document.bin")], "is the input"),
        (["--save-calibration", str(EXAMPLE)], "--save-calibration '.*train_gpt.py' is the input"),
        (["--save-calibration", "c.json", "--save-measurements", "./c.json"],
         "--save-calibration 'c.json' and --save-measurements './c.json' are the same file"),
        (["--save-calibration", str(tmp_path)], "--save-calibration: cannot write .* is a directory"),
    ]
    for extra, message in cases:
        r = subprocess.run([PY, str(EXAMPLE)] + args + ["--calibrate-after", "1"] + extra, env=env(), cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0, (extra, r.stdout + r.stderr)
        assert re.search(message, r.stderr) and "Traceback" not in r.stderr, (extra, r.stderr)
        assert "iteration" not in r.stdout  # refused before training
    assert {p.name: p.read_bytes() for p in demo.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]
    # And the two outputs when they are outputs.
    r = subprocess.run([PY, str(EXAMPLE)] + args + ["--calibrate-after", "1", "--save-calibration", "c.json",
                                                    "--save-measurements", "m.jsonl"],
                       env=env(), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert '"packpipe-calibration"' in (tmp_path / "c.json").read_text()
    assert packpipe_measurements(tmp_path / "m.jsonl") > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "demo", "m.jsonl"]


def packpipe_measurements(path):
    import packpipe
    return len(packpipe.read_measurements(str(path)))


def test_the_benchmark_checks_its_arguments_and_output_before_starting(tmp_path):
    for args, message in [(["overhead", "--iterations", "0"], "argument --iterations: must be in"),
                          (["overhead", "--hidden", "6"], "--hidden 6 must be a multiple of the model's 4 heads"),
                          (["overhead", "--grid", "2", "0"], "argument --grid: must be in"),
                          (["overhead", "--out", str(BENCH)], "--out '.*torch_bench.py' is the input"),
                          (["overhead", "--out", str(tmp_path)], "--out: cannot write")]:
        r = subprocess.run([PY, str(BENCH)] + args, env=env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and re.search(message, r.stderr), (args, r.stderr)


@pytest.mark.parametrize("args, message", [
    (["--nproc-per-node", "100000"], r"argument --nproc-per-node/--nproc_per_node: must be in \[1, \d+\], found 100000"),
    (["--nproc-per-node", "0"], "must be in"),
    (["--nproc-per-node", "2", "--master-port", "70000"], r"argument --master-port/--master_port: must be in \[0, 65535\]"),
    (["--nproc-per-node", "2", "--master-port", "-1"], "argument --master-port/--master_port: must be in"),
    (["--nproc-per-node", "2", "--grace", "-1"], r"argument --grace: must be a finite number in \[0, 1e\+09\]"),
    (["--nproc-per-node", "2", "--grace", "nan"], "argument --grace: must be a finite number"),
    (["--nproc-per-node", "2", "--timeout", "-1"], "argument --timeout: must be a finite number"),
    (["--nproc-per-node", "2", "--timeout", "inf"], "argument --timeout: must be a finite number"),
    # torchrun's options for several machines: named, never taken for the script or its arguments
    (["--nnodes", "2", "--nproc-per-node", "1"], r"--nnodes 2: this launcher starts the ranks of one machine.*torchrun"),
    (["--nproc-per-node", "1", "--node-rank", "1"], r"--node-rank 1: this launcher starts the ranks of one machine"),
    (["--nproc_per_node", "1", "--rdzv_endpoint", "host:29400"], r"--rdzv-endpoint host:29400: this launcher"),
    (["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"], r"--nnodes 2, --rdzv-backend c10d: "),
])
def test_the_launcher_range_checks_its_options(tmp_path, args, message):
    script = tmp_path / "never.py"
    script.write_text("open('started', 'w')\n")
    r = subprocess.run([PY, "-m", "packpipe.torch.run"] + args + [str(script)], env=env(), cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and re.search(message, r.stderr), r.stderr
    assert not (tmp_path / "started").exists()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP, signal.SIGTERM])
def test_a_signal_to_the_launcher_stops_every_rank_and_its_children(tmp_path, sig):
    """Ranks that ignore SIGINT and SIGTERM, each with a child of its own: the launcher's SIGINT,
    SIGHUP or SIGTERM still ends every one of them (their process groups: SIGTERM, then SIGKILL)."""
    script = tmp_path / "stubborn.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, subprocess, sys, time
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(os.path.join({str(tmp_path)!r}, "pids." + os.environ["RANK"]), "w") as f:
            f.write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(600)
    """))
    launcher = subprocess.Popen([PY, "-m", "packpipe.torch.run", "--nproc-per-node", "3", str(script)], env=env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = []
    try:
        end = time.monotonic() + 60
        while len(list(tmp_path.glob("pids.*"))) < 3 and time.monotonic() < end:
            time.sleep(0.1)
        time.sleep(0.2)
        pids = [int(x) for f in tmp_path.glob("pids.*") for x in f.read_text().split()]
        assert len(pids) == 6, pids
        launcher.send_signal(sig)
        out, err = launcher.communicate(timeout=30)
        assert launcher.returncode == 128 + sig, err
        assert f"{signal.Signals(sig).name} received; stopping every rank" in err
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in pids if _alive(p)], "ranks or their children outlived the launcher"
    finally:
        launcher.kill()
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_the_launcher_timeout_covers_starting_the_ranks(monkeypatch):
    """Starting ranks can take longer than the job's --timeout (many ranks on a loaded machine):
    the timeout counts from the start, so the launcher stops starting ranks and ends in time."""
    from packpipe.torch import run
    real = subprocess.Popen
    started = []

    def slow_popen(*a, **kw):
        time.sleep(0.25)  # a slow start of each rank
        p = real([PY, "-c", "import time; time.sleep(60)"], **{k: v for k, v in kw.items() if k != "env"})
        started.append(p)
        return p

    monkeypatch.setattr(run.subprocess, "Popen", slow_popen)
    nproc = min(40, run.max_nproc())
    t0 = time.monotonic()
    code = run.launch(["unused.py"], nproc, timeout_s=1.0, grace_s=1.0)
    took = time.monotonic() - t0
    assert code == 124
    assert len(started) < nproc, f"started all {nproc} ranks past the 1 s timeout"
    assert took < 1.0 + 0.25 + 2.0 + 2.0, took  # the timeout, one start, the SIGTERM wait, slack
    assert all(p.poll() is not None for p in started)


def test_launch_checks_its_arguments():
    from packpipe.torch import run
    with pytest.raises(ValueError, match=r"launch: nproc must be in \[1, \d+\], found 100000"):
        run.launch(["x.py"], 100000)
    with pytest.raises(TypeError, match="launch: nproc must be an integer"):
        run.launch(["x.py"], 2.0)
    with pytest.raises(ValueError, match="launch: port must be in"):
        run.launch(["x.py"], 1, port=65536)
    with pytest.raises(ValueError, match="launch: timeout_s must be a finite number"):
        run.launch(["x.py"], 1, timeout_s=float("nan"))
    with pytest.raises(ValueError, match="launch: grace_s must be a finite number"):
        run.launch(["x.py"], 1, grace_s=-1)
    with pytest.raises(TypeError, match="launch: script must be a non-empty list of str"):
        run.launch("x.py", 1)


def test_distributed_outputs_of_every_rank_are_distinct(tmp_path):
    """Rank 1's measurement file (PATH.rank1) may not be rank 0's calibration: every rank checks
    every rank's outputs, so the job fails before training, whichever rank would have written it."""
    r = subprocess.run([PY, "-m", "packpipe.torch.run", "--nproc-per-node", "2", "--timeout", "240", str(EXAMPLE)]
                       + ARGS + ["--calibrate-after", "1", "--save-calibration", "m.rank1", "--save-measurements", "m"],
                       env=env(), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "[rank 0] train_gpt: error: --save-calibration 'm.rank1' and --save-measurements (rank 1) 'm.rank1' " \
           "are the same file" in r.stdout, r.stdout + r.stderr
    assert " loss " not in r.stdout  # refused before training
    assert list(tmp_path.iterdir()) == []

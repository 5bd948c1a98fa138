"""The user guide's examples (docs/guide.md, examples/) run as a user runs them: data parallelism
with gradient accumulation in one process and over two ranks, a model of one's own in a two-stage
pipeline (one process, two ranks, and two node groups joined by torchrun's c10d rendezvous as a
multi-node job would be), offline planning with plan_epoch and with the packpipe command (the same
bytes) then training from the file, and the calibrated and profiled cost model of one's own model."""
import os
import pathlib
import re
import signal
import subprocess
import sys

import support

EXAMPLES = support.ROOT / "examples"
PY = sys.executable


def env(**extra):
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(pathlib.Path(__import__("packpipe").__file__).parents[1]),
                                      e.get("PYTHONPATH", "")])
    e.update(extra)
    return e


def run(args, timeout=240, **kw):
    r = subprocess.run([PY] + [str(a) for a in args], env=env(), capture_output=True, text=True, timeout=timeout,
                       **kw)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def losses(out):
    return [float(x) for x in re.findall(r"loss (\d+\.\d+)", out)]


def test_data_parallel_accumulation_in_one_process_and_over_two_ranks():
    args = ["--epochs", "2", "--iterations", "2"]
    one = run([EXAMPLES / "train_dp.py"] + args)
    two = run(["-m", "packpipe.torch.run", "--nproc-per-node", "2", "--timeout", "200", EXAMPLES / "train_dp.py"]
              + args)
    assert len(losses(one)) == len(losses(two)) == 4, one + two
    assert "epoch 1 iteration 1" in one and "[rank 0] epoch 1 iteration 1" in two
    # two replicas with DDP train as one process on the whole batch (fp32: up to rounding)
    assert max(abs(a - b) for a, b in zip(losses(one), losses(two))) < 2e-3, (one, two)
    assert losses(one)[-1] < losses(one)[0]
    micro = [int(x) for x in re.findall(r"(\d+) micro-batches on this replica", one)]
    assert min(micro) >= 2  # gradients accumulated over several micro-batches


def test_own_model_in_a_pipeline_in_one_process_and_over_two_ranks():
    one = run([EXAMPLES / "train_pipeline.py", "--pp", "2", "--iterations", "3"])
    two = run(["-m", "packpipe.torch.run", "--nproc-per-node", "2", "--timeout", "200", EXAMPLES / "train_pipeline.py",
               "--pp", "2", "--iterations", "3"])
    assert "rank 0: virtual stages [0, 1], layers [(0, 2), (2, 4)]" in one
    assert "[rank 1] rank 1: virtual stages [1], layers [(2, 4)]" in two
    assert len(losses(one)) == len(losses(two)) == 3
    assert max(abs(a - b) for a, b in zip(losses(one), losses(two))) < 2e-3, (one, two)


def test_offline_planning_then_training_from_the_file(tmp_path):
    cli = os.environ.get("PACKPIPE_CLI")
    assert cli, "PACKPIPE_CLI names the packpipe command (ctest sets it)"
    (tmp_path / "py").mkdir()
    (tmp_path / "cli").mkdir()
    out = run([EXAMPLES / "plan_offline.py", "--out", tmp_path / "py" / "plans.ppln"])
    assert "planned 4 plans" in out and len(losses(out)) == 4
    run([EXAMPLES / "plan_offline.py", "--out", tmp_path / "cli" / "plans.ppln", "--cli", cli, "--no-train"])
    assert (tmp_path / "py" / "plans.ppln").read_bytes() == (tmp_path / "cli" / "plans.ppln").read_bytes()
    assert (tmp_path / "py" / "model.json").read_bytes() == (tmp_path / "cli" / "model.json").read_bytes()


def test_the_cost_model_of_ones_own_model_calibrated_and_profiled(tmp_path):
    out = run([EXAMPLES / "calibrate_own_model.py", "--out-dir", tmp_path])
    assert re.search(r"calibrated on iterations up to 4 .* op error F .* -> .*, B", out), out
    assert (tmp_path / "calibration.json").exists() and (tmp_path / "block.profile.json").exists()
    assert "profiled (" in out and len(losses(out)) == 13


def test_multi_node_torchrun_with_a_c10d_rendezvous():
    """Two node groups on this machine's loopback, each a torchrun of one process, meet at a c10d
    rendezvous as two hosts would; PACKPIPE_HOSTNAME makes them two hosts to packpipe (no common
    clock), so the default calibration fits compute ops only. Both groups end within the timeout;
    whatever happens, no process outlives the test."""
    port = support.free_port()
    procs = []
    try:
        for node in range(2):
            cmd = [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                   "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "packpipe-test", "--redirects", "1", "--tee",
                   "1", "--max_restarts", "0", str(EXAMPLES / "train_pipeline.py"), "--pp", "2", "--iterations", "10"]
            procs.append(subprocess.Popen(cmd, env=env(PACKPIPE_HOSTNAME=f"node{node}"), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, start_new_session=True))
        outs = [p.communicate(timeout=200)[0] for p in procs]
    finally:  # each node group leads its own process group (torchrun and its worker): stop what still runs
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        pass
            for p in procs:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
    both = "\n".join(outs)
    assert "rank 0: virtual stages [0], layers [(0, 2)]" in both and "rank 1: virtual stages [1]" in both
    assert len(losses(both)) == 10, both
    assert "calibration of ops B, F: calibrated on iterations up to 7" in both, both


def test_the_examples_refuse_bad_arguments_by_name(tmp_path):
    """A count out of range or an output directory that is a file: argparse's message naming the
    argument, exit 2, before any training (not a traceback, and never exit 0 having trained nothing)."""
    a_file = tmp_path / "f"
    a_file.write_text("x")
    cases = [(["train_dp.py", "--epochs", "-1"], "argument --epochs: must be in [1,"),
             (["train_dp.py", "--iterations", "x"], "argument --iterations: expected an integer"),
             (["train_pipeline.py", "--pp", "0"], "argument --pp: must be in [1,"),
             (["plan_offline.py", "--iterations", "-2"], "argument --iterations: must be in [0,"),
             (["calibrate_own_model.py", "--out-dir", a_file], f"--out-dir {a_file}: expected a directory")]
    for args, text in cases:
        r = subprocess.run([PY, EXAMPLES / args[0]] + [str(x) for x in args[1:]], env=env(), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2 and text in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert a_file.read_text() == "x"


def test_the_measured_comparison_on_ones_own_model_over_two_ranks(tmp_path):
    """examples/compare_own_model.py (packpipe.torch.compare) on 2 ranks: every family at its settings
    trained on the same global batches, a table, and JSON whose verdict follows from its own figures."""
    out = tmp_path / "cmp.json"
    text = run(["-m", "packpipe.torch.run", "--nproc-per-node", "2", "--timeout", "300",
                EXAMPLES / "compare_own_model.py", "--manifest", support.ROOT / "data" / "demo" / "short.json",
                "--global-batch-tokens", "1024", "--iterations", "2", "--rounds", "2", "--grid", "1", "2",
                "--budgets", "1", "--calibrate-steps", "2", "--json", out], timeout=300)
    assert "the best baseline measured" in text and "on 2 rank(s), alternating" in text, text
    import json
    r = json.loads(out.read_text())
    names = [s["name"] for s in r["sides"]]
    assert names[0] == "packpipe" and {s["family"] for s in r["sides"][1:]} == {
        "fixed", "fixed-packed", "tokens", "packing", "wlb"}
    assert len({s["tokens"] for s in r["sides"]}) == 1  # the same global batches on every side
    for s in r["sides"]:
        assert len(s["ms"]) == 2 and s["tokens_per_s"] > 0
    pp = r["sides"][0]
    best = max(r["sides"][1:], key=lambda s: s["tokens_per_s"])
    assert r["best"]["any"]["setting"] == best["name"]
    assert abs(r["best"]["any"]["speedup"] - pp["tokens_per_s"] / best["tokens_per_s"]) < 1e-9
    lo, hi = r["best"]["any"]["paired_range"]
    assert lo <= r["best"]["any"]["paired_median"] <= hi and isinstance(r["best"]["any"]["same_plans"], bool)
    assert r["ranks"] == 2 and r["calibration"]


def test_compare_refuses_bad_settings_by_name():
    import packpipe.torch as pt
    from packpipe.torch.models import CPU_DEVICE
    sys.path.insert(0, str(EXAMPLES))
    from my_model import TinyLM, loss_fn
    cm = pt.cost_model(TinyLM(layers=1), CPU_DEVICE)
    manifest = str(support.ROOT / "data" / "demo" / "short.json")
    import pytest
    with pytest.raises(ValueError, match=r"compare: baselines: unknown family 'seq1f1b'"):
        pt.compare(lambda: TinyLM(layers=1), loss_fn, manifest, cm, global_batch_tokens=512, baselines=("seq1f1b",),
                   calibrate_steps=0)
    with pytest.raises(ValueError, match=r"compare: iterations must be in \[1,"):
        pt.compare(lambda: TinyLM(layers=1), loss_fn, manifest, cm, global_batch_tokens=512, iterations=0)
    with pytest.raises(TypeError, match=r"compare: model_fn\(\) must return an nn.Module"):
        pt.compare(lambda: 3, loss_fn, manifest, cm, global_batch_tokens=512, calibrate_steps=1)

"""packpipe profile: the small test GPT profiled on CPU in seconds, the profile loads back into the
profiled cost model (and round-trips through the reader), and packpipe plans with it."""
import json
import math
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import packpipe
from packpipe.torch import profile as prof

import support

CLI = os.environ.get("PACKPIPE_CLI")


def run_profile(args):
    cmd = [CLI, "profile"] if CLI else [sys.executable, "-m", "packpipe.torch.profile"]
    return subprocess.run(cmd + args, capture_output=True, text=True, timeout=300)


def test_profile_plan_with_it_and_round_trip(tmp_path):
    out, model = tmp_path / "gpt.profile.json", tmp_path / "gpt.json"
    r = run_profile(["--hidden", "16", "--heads", "2", "--vocab", "64", "--layers", "4", "--max-seq", "128",
                     "--mbs", "1,2,4", "--repeats", "2", "--warmup", "1", "--threads", "1", "--out", str(out),
                     "--model-out", str(model), "--json"])
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    # embedding + head at 3 mbs x 3 seq, the layer under 3 recompute modes: 9 + 9 + 27 points.
    assert summary["points"] == 45 and summary["seconds"] < 120
    assert summary["leave_one_out"]["points"] > 0 and math.isfinite(summary["leave_one_out"]["time_mape"])
    back = packpipe.read_profile([str(out)])
    assert len(back["points"]) == 45 and back["device"] == "cpu"
    kinds = {p[0] for p in back["points"]}
    assert kinds == {"embedding", "encoder", "postprocess"}
    assert all(p[7] > 0 and p[8] > 0 for p in back["points"])
    assert {p[2] for p in back["points"] if p[0] == "encoder"} == {"none", "selective", "full"}
    # Round trip: write what was read, read it again: the same points.
    again = tmp_path / "again.json"
    packpipe.write_profile(str(again), back["points"], model=back["model"], device=back["device"])
    assert packpipe.read_profile([str(again)])["points"] == back["points"]
    # The profiled cost model answers from it, and packpipe plans with it.
    device = tmp_path / "cpu.json"
    device.write_text(json.dumps(support.CPU_DEVICE))
    cm = packpipe.CostModel(str(model), str(device), profiles=[str(out)])
    q = cm.query(kind="encoder", mbs=2, seq=64)
    enc = [p for p in back["points"] if p[0] == "encoder" and p[2] == "none" and p[4] == 2 and p[5] == 64][0]
    assert q.time_source == "profiled" and abs(q.forward_ms - enc[7]) < 1e-9
    lens = np.random.default_rng(0).integers(8, 120, size=40).astype(np.uint32)
    res = packpipe.plan_batch(cm, lens, shape=packpipe.PipelineShape(stages=2))
    assert res.plans[0].validate()["ok"] and res.plans[0].makespan_ms > 0


LAYER = textwrap.dedent("""
    import torch
    class Block(torch.nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.lin = torch.nn.Linear(hidden, hidden)
        def forward(self, x):
            return torch.relu(self.lin(x))
    def make(hidden, heads, ffn):
        return Block(hidden)
""")


def test_a_custom_layer_and_bad_arguments(tmp_path):
    (tmp_path / "mylayer.py").write_text(LAYER)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    out = tmp_path / "custom.json"
    cmd = [sys.executable, "-m", "packpipe.torch.profile", "--layer", "mylayer:make", "--hidden", "16", "--seq",
           "16,32,64", "--mbs", "1,2", "--recompute", "none", "--repeats", "1", "--warmup", "0", "--out", str(out),
           "--no-check"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(packpipe.read_profile([str(out)])["points"]) == 3 * 2 * 3
    r = subprocess.run(cmd[:-3] + ["--recompute", "sometimes", "--out", str(out)], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "'sometimes' is not one of none, selective, full" in r.stderr
    with pytest.raises(ValueError, match="points\\[0\\]: expected 11 values"):
        packpipe.write_profile(str(tmp_path / "bad.json"), [("encoder", 1)])
    assert not (tmp_path / "bad.json").exists()


def test_geometric_grid():
    assert prof.geometric(32, 128) == [32, 64, 128]
    assert prof.geometric(32, 100) == [32, 64, 100]


def in_process(args, capsys):
    """(exit code, stderr) of `packpipe profile args` run in this process (no interpreter start-up)."""
    try:
        code = prof._cli(args)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_outputs_are_checked_before_measuring_and_never_overwrite_an_input(tmp_path, monkeypatch, capsys):
    """--out and --model-out: never the --layer module's source, never each other, a name packpipe
    reads back, a writable path; all refused at once with nothing written (the grid below takes
    minutes to measure)."""
    (tmp_path / "profiled_layer.py").write_text(LAYER)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    slow = ["--hidden", "256", "--heads", "4", "--max-seq", "4096", "--mbs", "1,2,4,8,16", "--repeats", "20"]
    cases = [
        (["--layer", "profiled_layer:make", "--out", "p.json", "--model-out", "profiled_layer.py"],
         r"--model-out 'profiled_layer.py' is the input '.*profiled_layer.py' \(the same file\); writing it would "
         "destroy"),
        (["--layer", "profiled_layer:make", "--out", "./profiled_layer.py"], "--out './profiled_layer.py' is the input"),
        (["--out", "same.json", "--model-out", "same.json"],
         "--out 'same.json' and --model-out 'same.json' are the same file"),
        (["--out", "same.json", "--model-out", "sub/../same.json"], "are the same file"),
        (["--out", "profile.txt"], "--out profile.txt: packpipe could not read a profile written under this name"),
        (["--out", "DeviceType.x.json"], "--out DeviceType.x.json: packpipe could not read a profile"),
        (["--out", "p.json", "--model-out", "model"], "--model-out model: packpipe could not read a model file"),
        (["--out", "sub"], "--out: cannot write 'sub'.* is a directory"),
        (["--out", "missing/p.json"], "--out: cannot write 'missing/p.json'"),
        (["--out", "p.json", "--model-out", "missing/m.json"], "--model-out: cannot write"),
    ]
    for args, message in cases:
        code, err = in_process(slow + args, capsys)
        assert code == 2, (args, err)
        assert re.search(message, err), (args, err)
    # The same through the CLI (`packpipe profile` runs this module in a child interpreter).
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    for args, message in cases[:3]:
        r = subprocess.run(([CLI, "profile"] if CLI else [sys.executable, "-m", "packpipe.torch.profile"]) + slow + args,
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and re.search(message, r.stderr) and "Traceback" not in r.stderr, (args, r.stderr)
    assert (tmp_path / "profiled_layer.py").read_text() == LAYER
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["profiled_layer.py", "sub"]
    assert list((tmp_path / "sub").iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (["--hidden", "0"], r"argument --hidden: must be in \[1, 1048576\], found 0"),
    (["--hidden", "15", "--heads", "2"], "--hidden 15 must be a multiple of --heads 2"),
    (["--heads", "-1"], "argument --heads: must be in"),
    (["--vocab", "x"], "argument --vocab: expected an integer"),
    (["--mbs", "1,-2"], r"argument --mbs: must be in \[1, 16777216\], found -2"),
    (["--mbs", ","], "argument --mbs: expected comma-separated integers"),
    (["--seq", "0"], "argument --seq: must be in"),
    (["--max-seq", "99999999999"], "argument --max-seq: must be in"),
    (["--repeats", "0"], "argument --repeats: must be in"),
    (["--warmup", "-1"], "argument --warmup: must be in"),
    (["--threads", "5000"], r"argument --threads: must be in \[0, 1024\]"),
    (["--recompute", ","], "--recompute: no mode given"),
    (["--device", "bogus"], "argument --device: 'bogus' is not a torch device"),
    (["--name", " "], "--name is empty"),
    (["--layer", "nope_module:make"], "--layer nope_module:make: ModuleNotFoundError"),
    (["--layer", "json"], "--layer is module:factory"),
    (["--layer", "json:nope"], "--layer json:nope: AttributeError"),
    (["--layer", "json:__doc__"], "--layer json:__doc__: __doc__ is a str, expected a callable factory"),
])
def test_bad_arguments_are_argparse_errors_before_any_work(tmp_path, capsys, args, message):
    code, err = in_process(["--out", str(tmp_path / "p.json")] + args, capsys)
    assert code == 2, (args, err)
    assert re.search(message, err), (args, err)
    assert not (tmp_path / "p.json").exists()

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

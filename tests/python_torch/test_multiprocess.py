"""packpipe.torch over gloo: spawned processes on loopback (free ports, timeouts, every process
cleaned up). Each rank runs its stages with PipelineRunner; gradients after the first iteration and
parameters after the last equal the whole model run on each sample alone in one process (fp64:
1e-10; fp32: 1e-5), for the small GPT and T5 on 2 and 4 stages, dp 1 and 2, every schedule kind,
packed and padded rows, and both loss modes. A killed rank and a failing stage end every rank
with an error naming them."""
import pytest

import support
import workers

GPT4 = [
    {"model": "gpt", "pp": 4, "dp": 1, "schedule": "1f1b", "method": "dp", "loss": "all"},
    {"model": "gpt", "pp": 4, "dp": 1, "schedule": "zero-bubble", "method": "packing", "mbs": 4, "loss": "targets"},
    {"model": "gpt", "pp": 4, "dp": 1, "schedule": "cyclic", "method": "fixed", "mbs": 3, "loss": "all"},
    {"model": "gpt", "pp": 2, "dp": 2, "schedule": "interleaved-1f1b", "chunks": 2, "method": "fixed", "mbs": 2,
     "samples": 16, "loss": "all"},
    {"model": "gpt", "pp": 2, "dp": 2, "schedule": "1f1b", "method": "packing", "mbs": 4, "loss": "targets",
     "iterations": 5},
    {"model": "gpt", "pp": 4, "dp": 1, "schedule": "1f1b", "method": "dp", "tied": True, "iterations": 2,
     "layers": 6, "stage_layers": [1, 2, 2, 1]},
    {"model": "gpt", "pp": 2, "dp": 2, "schedule": "zero-bubble", "method": "dp", "dtype": "fp32", "iterations": 2},
    {"model": "t5", "pp": 4, "dp": 1, "schedule": "1f1b", "method": "dp", "loss": "targets", "iterations": 2},
    {"model": "t5", "pp": 2, "dp": 2, "schedule": "1f1b", "method": "packing", "mbs": 4, "loss": "targets"},
    # slices of long samples (015): keys and values kept across micro-batches, backward in reverse
    {"model": "gpt", "pp": 4, "dp": 1, "schedule": "1f1b", "method": "slicing", "capacity": 128, "manifest": "long",
     "tokens": 1500, "sliced": True},
    {"model": "gpt", "pp": 2, "dp": 2, "schedule": "1f1b", "method": "slicing", "capacity": 128, "manifest": "long",
     "tokens": 2500, "sliced": True, "iterations": 2},
]
GPT2 = [
    {"model": "gpt", "pp": 2, "dp": 1, "schedule": "1f1b", "method": "dp", "loss": "all", "iterations": 5},
    {"model": "gpt", "pp": 2, "dp": 1, "schedule": "interleaved-1f1b", "chunks": 2, "method": "fixed", "mbs": 2,
     "samples": 16},
    {"model": "gpt", "pp": 2, "dp": 1, "schedule": "cyclic", "method": "packing", "mbs": 3, "loss": "targets"},
    {"model": "gpt", "pp": 2, "dp": 1, "schedule": "zero-bubble", "method": "slicing", "capacity": 128,
     "manifest": "long", "tokens": 1500, "sliced": True},
]


def check(cases, results, world):
    assert sorted(results) == list(range(world)), f"ranks that reported: {sorted(results)}"
    for rank, (status, out) in sorted(results.items()):
        assert status == "ok", f"rank {rank} failed:\n{out}"
        assert len(out) == len(cases)
        for case, got in zip(cases, out):
            tol = 1e-10 if case.get("dtype", "fp64") == "fp64" else 1e-5
            name = f"rank {rank} {case}"
            assert got["grad"] <= tol, f"{name}: gradients differ by {got['grad']:.3g}"
            assert got["param"] <= tol, f"{name}: parameters differ by {got['param']:.3g}"
            assert got["schedules"][0] == case["schedule"], f"{name}: ran {got['schedules']}"

            for loss, ref in got["losses"]:
                assert abs(loss - ref) <= tol * max(1.0, abs(ref)), f"{name}: loss {loss} against {ref}"
    for k, case in enumerate(cases):
        if case.get("sliced"):
            assert any(outs[k]["sliced"] for _, (_, outs) in results.items()), f"{case}: no plan holds a slice"
    heads = [out for _, (_, outs) in results.items() for out in outs if out["losses"]]
    assert heads, "no rank reported a loss"


def test_four_ranks_gpt_and_t5_equal_one_process():
    results = support.spawn(workers.equivalence, 4, {"cases": GPT4}, timeout_s=900)
    check(GPT4, results, 4)


def test_two_ranks_equal_one_process():
    results = support.spawn(workers.equivalence, 2, {"cases": GPT2}, timeout_s=600)
    check(GPT2, results, 2)


def test_a_killed_rank_ends_every_other_rank_with_an_error_naming_it():
    results = support.spawn(workers.killed_rank, 4, {"victim": 1, "timeout": 60}, timeout_s=180, expect_dead=(1,))
    assert 1 not in results, "the victim reported"
    assert sorted(results) == [0, 2, 3], f"survivors that reported: {sorted(results)}"
    for rank, (status, out) in results.items():
        assert status == "ok", out
        err = out["error"]
        assert err is not None, f"rank {rank} finished although rank 1 died"
        assert out["seconds"] < 60, f"rank {rank} took {out['seconds']:.1f} s"
        assert f"rank {rank}, iteration 0, instruction" in err
        assert "world rank 1 (pid" in err and "is gone" in err, f"rank {rank}: {err}"


def test_a_failing_stage_ends_every_rank_with_its_error():
    results = support.spawn(workers.failing_handler, 3, {"culprit": 1, "timeout": 60}, timeout_s=180)
    assert sorted(results) == [0, 1, 2]
    culprit = results[1][1]
    assert "ArithmeticError: the culprit's stage failed" in culprit["error"]
    assert "ArithmeticError" in culprit["cause"]
    for rank in (0, 2):
        status, out = results[rank]
        assert status == "ok" and out["error"] is not None, out
        assert out["seconds"] < 60
        assert "the culprit's stage failed" in out["error"] and "world rank 1" in out["error"], out["error"]

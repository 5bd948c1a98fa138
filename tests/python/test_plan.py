"""Plans from Python: header fields, streams as objects and numpy arrays, validation, JSON and
binary round trips, plan files read by iteration, PyTorch export."""
import json

import numpy as np
import pytest

import packpipe
from packpipe._testing import synthetic_plan


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zero-bubble"])
def test_synthetic_plans_validate(schedule):
    for seed in range(20):
        p = synthetic_plan(schedule, ranks=4, chunks=2, microbatches=8, seed=seed)
        rep = p.validate()
        assert rep["ok"], rep["violations"][:3]
        assert len(rep["peak_bytes"]) == 4


def test_header_fields():
    p = synthetic_plan("1f1b", ranks=4, microbatches=6, seed=3, encoder_decoder=True)
    assert p.ranks == 4 and p.vstages == 4
    assert p.stage_rank == [0, 1, 2, 3]
    mbs = p.microbatches
    assert len(mbs) == 6
    assert sum(m["tokens"] for m in mbs) == p.global_tokens
    assert sum(m["loss_weight"] for m in mbs) == pytest.approx(1.0)
    for m in mbs:
        assert m["loss_weight"] == pytest.approx(m["loss_tokens"] / p.global_loss_tokens)
        assert len(m["recompute"]) == p.vstages
        assert m["padded_dec_len"] > 0
    assert all(s["bytes"] > 0 for s in p.shapes)


def test_streams_as_objects_and_numpy_agree():
    p = synthetic_plan("zero-bubble", ranks=3, microbatches=5, seed=1)
    names = packpipe.opcode_names()
    for r in range(p.ranks):
        objs = p.streams[r]
        arr = p.instructions(r)
        assert arr.dtype.names == ("opcode", "mb", "stage", "peer", "in", "in2", "out", "shape")
        assert arr.dtype.itemsize == 32
        assert len(arr) == len(objs)
        for ins, row in zip(objs, arr):
            assert names[row["opcode"]] == ins.op
            for field, attr in (("mb", "mb"), ("stage", "stage"), ("peer", "peer"), ("in", "in_"),
                                ("in2", "in2"), ("out", "out"), ("shape", "shape")):
                v = getattr(ins, attr)
                assert row[field] == (-1 if v is None else v)
        # Every compute op of the rank appears, in the timeline's order.
        compute = arr[np.isin(arr["opcode"], [names.index(n) for n in ("FWD", "BWD", "BWD_I", "BWD_W")])]
        assert len(compute) == len(p.timeline[r])
        assert list(compute["mb"]) == [t[1] for t in p.timeline[r]]
    with pytest.raises(IndexError):
        p.instructions(p.ranks)


def test_round_trips():
    p = synthetic_plan("1f1b", ranks=2, chunks=2, microbatches=4, seed=9)
    j = p.to_json()
    q = packpipe.Plan.from_json(j)
    assert q == p and q.to_json() == j
    assert json.loads(j)["format"] == "packpipe-plan"
    for compress in (False, True):
        b = p.to_bytes(compress=compress)
        r = packpipe.Plan.from_bytes(b)
        assert r == p and r.to_bytes(compress=compress) == b
    with pytest.raises(RuntimeError, match="truncated"):
        packpipe.Plan.from_bytes(p.to_bytes()[:40])


def test_plan_file_by_iteration(tmp_path):
    path = str(tmp_path / "e.plans")
    plans = [synthetic_plan("gpipe", ranks=2, microbatches=3, seed=s) for s in range(5)]
    with packpipe.PlanFileWriter(path, compress=True) as w:
        for p in plans:
            w.append(p)
    r = packpipe.PlanFileReader(path)
    assert len(r) == 5
    assert r.iterations == [p.iteration for p in plans]
    for p in reversed(plans):
        assert r.read(p.iteration) == p
    assert r[0] == plans[0]
    with pytest.raises(IndexError, match="no plan for iteration"):
        r.read(12345)


def test_validation_reports_violations():
    p = synthetic_plan("1f1b", ranks=2, microbatches=3, seed=2)
    d = json.loads(p.to_json())
    # Drop rank 1's first receive start: channel mismatch and a stuck wait.
    stream = d["streams"][1]
    i = next(k for k, ins in enumerate(stream) if ins["op"] == "RECV_ACT_START")
    del stream[i]
    bad = packpipe.Plan.from_json(json.dumps(d))
    rep = bad.validate()
    assert not rep["ok"]
    kinds = {v["kind"] for v in rep["violations"]}
    assert "channel" in kinds
    assert all(v["rank"] in (-1, 0, 1) for v in rep["violations"])
    with pytest.raises(RuntimeError, match="invalid"):
        bad.validate_or_throw()


def test_pytorch_export():
    p = synthetic_plan("1f1b", ranks=4, microbatches=8, seed=1, same_shape=True)
    ok, why = p.pytorch_exportable()
    assert ok, why
    rows = p.pytorch_csv().splitlines()
    assert len(rows) == 4
    assert rows[0].split(",")[0] == "0F0"
    q = synthetic_plan("1f1b", ranks=4, microbatches=8, seed=1)
    ok, why = q.pytorch_exportable()
    assert not ok and "one shape" in why
    with pytest.raises(RuntimeError, match="PyTorch"):
        q.pytorch_csv()


def _replicas(duplicate):
    js = [json.loads(synthetic_plan("1f1b", ranks=2, microbatches=3, seed=30 + k).to_json()) for k in range(2)]
    nxt, tokens, loss = 0, 0, 0
    for k, j in enumerate(js):
        j["iteration"], j["dp"], j["replica"] = 0, 2, k
        for mb in j["microbatches"]:
            mb["samples"] = list(range(nxt, nxt + len(mb["samples"])))
            mb.pop("refs", None)
            nxt += len(mb["samples"])
            tokens += mb["tokens"]
            loss += mb["loss_tokens"]
    if duplicate:
        js[1]["microbatches"][0]["samples"][0] = js[0]["microbatches"][0]["samples"][0]
    for j in js:
        j["global_tokens"], j["global_loss_tokens"] = tokens, loss
        for mb in j["microbatches"]:
            mb["loss_weight"] = mb["loss_tokens"] / loss
    return [packpipe.Plan.from_json(json.dumps(j)) for j in js]


def test_validate_replicas():
    good = _replicas(False)
    assert all(p.validate()["ok"] for p in good)
    assert packpipe.validate_replicas(good) == []
    bad = packpipe.validate_replicas(_replicas(True))
    assert bad and all(v["kind"] == "replicas" for v in bad)
    assert any("also in replica 0" in v["message"] and v["replica"] == 1 for v in bad)
    missing = packpipe.validate_replicas(good[:1])
    assert missing and missing[0]["replica"] == -1 and "expected dp = 2" in missing[0]["message"]
    # the plans out of order, or one twice: named by their place in the list, with what each holds ("replica 0 has
    # 1, replica 0 has 0" before)
    swapped = [v["message"] for v in packpipe.validate_replicas([good[1], good[0]])]
    assert "replica: plans[0] has replica 1, expected 0 (the plans in replica order)" in swapped
    assert "replica: plans[1] has replica 0, expected 1 (the plans in replica order)" in swapped
    twice = [v["message"] for v in packpipe.validate_replicas([good[0], good[0]])]
    assert "replica: plans[1] has replica 0, expected 1 (the plans in replica order)" in twice


def test_plan_json_refuses_unknown_and_duplicate_keys():
    text = synthetic_plan("gpipe", ranks=2, microbatches=2, seed=4).to_json(-1)
    with pytest.raises(RuntimeError, match="unknown field"):
        packpipe.Plan.from_json(text.replace('"samples":', '"refz":[],"samples":', 1))
    with pytest.raises(RuntimeError, match="iteration"):
        packpipe.Plan.from_json(text.replace('"iteration":4', '"iteration":4,"iteration":5', 1))

"""Nothing lost on the training path: a token or index file truncated under a live loader is a
RuntimeError naming it (never SIGBUS), an incomplete plan file is trained only when asked for, a
plan file writer refuses at once what no reader opens, and the identities that loader states carry
(the dataset's and the plan file's fingerprints) tell other manifests and other plans apart."""
import gc
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

import packpipe
from packpipe import PartitionOptions, PipelineShape

DEMO = pathlib.Path(__file__).resolve().parents[2] / "data" / "demo"
SHAPE = PipelineShape(stages=2)


def demo_copy(tmp_path, tasks=None):
    """The demo's files in a folder of their own (a test may truncate them), with a manifest of `tasks`
    (the demo's, in their order, when None)."""
    d = tmp_path / "demo"
    if not d.exists():
        shutil.copytree(DEMO, d)
    m = json.loads((DEMO / "manifest.json").read_text())
    if tasks is not None:
        by_name = {t["name"]: t for t in m["tasks"]}
        m["tasks"] = [dict(by_name[name]) for name in tasks]
    path = d / ("manifest-" + "-".join(t["name"] for t in m["tasks"]) + ".json")
    path.write_text(json.dumps(m))
    return str(path)


def run_isolated(code):
    """Runs `code` in a child interpreter (a SIGBUS there ends only the child): (returncode, stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                       timeout=300)
    return r.returncode, r.stdout + r.stderr


@pytest.mark.parametrize("source", ["planner", "plan_file"])
@pytest.mark.parametrize("victim", ["bin", "idx"])
def test_a_file_truncated_under_a_live_rank_loader_is_an_error_naming_it(tmp_path, source, victim):
    manifest = demo_copy(tmp_path)
    rc, out = run_isolated(f"""
        import glob, os, packpipe
        from packpipe import PipelineShape
        ds = packpipe.MultiTaskDataset({manifest!r})
        gpt = packpipe.CostModel("gpt-350m", "A100-40GB")
        kw = dict(shape=PipelineShape(stages=2), global_batch_tokens=2000, iterations=12)
        if {source!r} == "plan_file":
            path = {str(tmp_path / "e.plans")!r}
            with packpipe.PlanFileWriter(path) as w:
                its = list(packpipe.plan_epoch(gpt, ds, **kw))
                w.expect_iterations(0, len(its))
                for it in its:
                    w.append(it.result.plans[0])
            loader = packpipe.RankLoader(ds, plan_file=path, depth=1, rank=None)
        else:
            loader = packpipe.RankLoader(ds, packpipe.plan_epoch(gpt, ds, **kw), depth=1, rank=None)
        next(loader)  # training has started
        for f in glob.glob(os.path.join(os.path.dirname({manifest!r}), "*.{victim}")):
            os.truncate(f, 0)  # as another process would
        try:
            for it in loader:
                pass
        except RuntimeError as e:
            print("ERROR:", e)
        else:
            print("NO ERROR")
        """)
    assert rc == 0, out  # no signal
    assert "ERROR:" in out and f".{victim}'" in out and "truncated" in out, out


def test_an_idx_truncated_under_a_live_torch_plan_loader_is_an_error_naming_it(tmp_path):
    pytest.importorskip("torch")
    manifest = demo_copy(tmp_path)
    rc, out = run_isolated(f"""
        import glob, os, packpipe, packpipe.torch as pt
        loader = pt.PlanLoader({manifest!r}, cost_model=packpipe.CostModel("gpt-350m", "A100-40GB"), dtype="fp32",
                               shape=packpipe.PipelineShape(stages=2), global_batch_tokens=2000, iterations=12,
                               rank=None, depth=1, calibrate=False)
        batches = iter(loader)
        next(batches)  # training has started
        for f in glob.glob(os.path.join(os.path.dirname({manifest!r}), "*.idx")):
            os.truncate(f, 0)
        try:
            for it in batches:
                pass
        except RuntimeError as e:
            print("ERROR:", e)
        else:
            print("NO ERROR")
        """)
    assert rc == 0, out
    assert "ERROR:" in out and ".idx'" in out and "truncated" in out, out


def test_an_idx_truncated_under_a_live_dataset_keeps_its_lengths_and_names_it_for_the_rest(tmp_path):
    manifest = demo_copy(tmp_path)
    prefix = os.path.join(os.path.dirname(manifest), "demo_man_text")
    rc, out = run_isolated(f"""
        import os, packpipe
        ds = packpipe.IndexedDataset({prefix!r})
        sizes = ds.sizes.copy()
        os.truncate({prefix + ".idx"!r}, 0)
        assert (ds.sizes == sizes).all() and len(ds) == len(sizes)  # the sizes are a copy made at open
        for name in ("pointers", "doc_idx"):
            try:
                getattr(ds, name)
            except RuntimeError as e:
                print("ERROR:", name, e)
        try:
            ds.get(len(ds) - 1)
        except RuntimeError as e:
            print("ERROR: get", e)
        """)
    assert rc == 0, out
    for what in ("pointers", "doc_idx", "get"):
        assert f"ERROR: {what} " in out, out
    assert out.count(".idx'") >= 3 and "truncated" in out, out


def test_a_bin_truncated_under_a_prefetcher_is_an_error_and_delivered_batches_keep_their_tokens(tmp_path):
    manifest = demo_copy(tmp_path)
    rc, out = run_isolated(f"""
        import glob, os, packpipe
        ds = packpipe.MultiTaskDataset({manifest!r})
        pf = packpipe.Prefetcher(ds, packpipe.Sampler(ds, seed=1, global_batch_tokens=4000), depth=1)
        batch = next(iter(pf))
        tokens = [(a.copy(), b.copy()) for a, b in batch["samples"]]
        for f in glob.glob(os.path.join(os.path.dirname({manifest!r}), "*.bin")):
            os.truncate(f, 0)
        assert all((a == x).all() and (b == y).all() for (a, b), (x, y) in zip(batch["samples"], tokens))
        try:
            for b in pf:
                pass
        except RuntimeError as e:
            print("ERROR:", e)
        """)
    assert rc == 0, out
    assert "ERROR:" in out and ".bin" in out and "truncated" in out, out


def test_an_incomplete_plan_file_is_loaded_only_when_asked_for(tmp_path):
    ds = packpipe.MultiTaskDataset(str(DEMO / "manifest.json"))
    gpt = packpipe.CostModel("gpt-350m", "A100-40GB")
    its = list(packpipe.plan_epoch(gpt, ds, shape=SHAPE, global_batch_tokens=2000, iterations=5))
    path = str(tmp_path / "part.plans")
    with packpipe.PlanFileWriter(path) as w:
        w.expect_iterations(0, 5)
        for it in its[:2]:
            w.append(it.result.plans[0])
    r = packpipe.PlanFileReader(path)
    assert r.complete is False and r.expected_iterations == 5 and len(r) == 2
    with pytest.raises(RuntimeError, match=r"part.plans: incomplete plan file: it holds 2 of the 5 iterations .*"
                                           r"allow_incomplete=True"):
        packpipe.RankLoader(ds, plan_file=path)
    assert len(list(packpipe.RankLoader(ds, plan_file=path, allow_incomplete=True))) == 2
    with pytest.raises(ValueError, match="allow_incomplete must be True or False"):
        packpipe.RankLoader(ds, plan_file=path, allow_incomplete=1)


def test_the_plan_file_writer_refuses_at_once_what_no_reader_opens(tmp_path):
    ds = packpipe.MultiTaskDataset(str(DEMO / "manifest.json"))
    gpt = packpipe.CostModel("gpt-350m", "A100-40GB")
    p0, p1, p2 = (it.result.plans[0] for it in packpipe.plan_epoch(gpt, ds, shape=SHAPE, global_batch_tokens=2000,
                                                                   iterations=3))
    path = tmp_path / "w.plans"
    with packpipe.PlanFileWriter(str(path)) as w:
        w.append(p0)
        with pytest.raises(ValueError, match="iteration 2 appended after iteration 0: expected iteration 0 or 1"):
            w.append(p2)
        with pytest.raises(ValueError, match="iteration 0 replica 0 after its replica 0"):
            w.append(p0)
        assert w.plans_written == 1
        w.append(p1)
    assert len(packpipe.PlanFileReader(str(path))) == 2
    # A reader of this process holds the path: a writer onto it is refused at once, nothing changes;
    # once the reader is gone the path is an output again.
    before = packpipe.PlanFileReader(str(path))
    with pytest.raises(RuntimeError, match="is open for reading by a PlanFileReader"):
        packpipe.PlanFileWriter(str(path))
    assert len(before) == 2 and before.read(1) == p1
    del before
    gc.collect()
    with packpipe.PlanFileWriter(str(path)) as w:
        w.append(p0)
    assert len(packpipe.PlanFileReader(str(path))) == 1


def test_fingerprints_tell_reordered_manifests_and_other_plans_apart(tmp_path):
    names = ["define", "synonyms", "translate", "man_summarize", "man_explain", "man_text"]
    a = packpipe.MultiTaskDataset(demo_copy(tmp_path, names))
    b = packpipe.MultiTaskDataset(demo_copy(tmp_path, [names[1], names[0]] + names[2:]))
    assert len(a) == len(b) and a.fingerprint() != b.fingerprint()
    assert a.fingerprint() == packpipe.MultiTaskDataset(str(DEMO / "manifest.json")).fingerprint()  # moved data
    assert len(a.fingerprint()) == 16
    gpt = packpipe.CostModel("gpt-350m", "A100-40GB")
    files = []
    for k, tokens in enumerate((2000, 3000)):
        files.append(str(tmp_path / f"{k}.plans"))
        with packpipe.PlanFileWriter(files[-1]) as w:
            for it in packpipe.plan_epoch(gpt, a, shape=SHAPE, global_batch_tokens=tokens, iterations=2):
                w.append(it.result.plans[0])
    fps = [packpipe.PlanFileReader(f).fingerprint() for f in files]
    assert fps[0] != fps[1] and fps[0] == packpipe.PlanFileReader(files[0]).fingerprint()

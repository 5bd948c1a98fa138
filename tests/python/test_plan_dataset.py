"""A plan file is loaded only with the dataset it was planned from. Plans record the dataset's
fingerprint and plan files its task names and sample counts too; RankLoader and
assemble_microbatch refuse another dataset (the tasks reordered, a task dropped, a task over other
data) with a ValueError naming the plan file, the manifest and what differs, planned against found.
A file that records no dataset (an older one) loads unchecked."""
import json
import os
import pathlib
import re
import subprocess

import pytest

import packpipe
from packpipe import PipelineShape

DEMO = pathlib.Path(__file__).resolve().parents[2] / "data" / "demo"
KW = dict(shape=PipelineShape(stages=2), global_batch_tokens=2000, iterations=3)


def manifest(directory, name, edit=None):
    """The demo manifest with absolute prefixes, its task list as `edit` leaves it, written as `name`."""
    m = json.loads((DEMO / "manifest.json").read_text())
    for task in m["tasks"]:
        for key in ("inputs", "targets", "dataset"):
            if key in task:
                task[key] = str(DEMO / task[key])
    if edit is not None:
        edit(m["tasks"])
    path = pathlib.Path(directory) / name
    path.write_text(json.dumps(m))
    return str(path)


def reorder(tasks):
    tasks[0], tasks[1] = tasks[1], tasks[0]


def drop(tasks):
    del tasks[-1]


def replace(tasks):
    """Task 'translate' over another dataset (synonyms'): other lengths, another sample count."""
    tasks[2]["inputs"], tasks[2]["targets"] = tasks[1]["inputs"], tasks[1]["targets"]


def rebuild(tasks):
    """Task 'man_explain' with inputs and targets swapped: the same names and counts, other lengths."""
    tasks[4]["inputs"], tasks[4]["targets"] = tasks[4]["targets"], tasks[4]["inputs"]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """(the plan file of three iterations of the demo manifest, the dataset, the planned iterations)."""
    d = tmp_path_factory.mktemp("planned")
    demo = packpipe.MultiTaskDataset(str(DEMO / "manifest.json"))
    its = list(packpipe.plan_epoch(packpipe.CostModel("gpt-350m", "A100-40GB"), demo, **KW))
    path = str(d / "demo.plans")
    with packpipe.PlanFileWriter(path) as w:
        w.expect_iterations(0, len(its))
        for it in its:
            for plan in it.result.plans:
                w.append(plan)
    return path, demo, its


def test_plans_and_plan_files_record_the_dataset_they_index(planned):
    path, demo, its = planned
    tasks = [{"name": n, "samples": demo.task_size(k)} for k, n in enumerate(demo.task_names)]
    want = {"fingerprint": demo.fingerprint(), "tasks": tasks}
    assert its[0].result.plans[0].dataset == want
    reader = packpipe.PlanFileReader(path)
    assert reader.dataset == want
    assert reader[0].dataset == want
    # A plan alone stores the fingerprint; the tasks are the file's.
    assert packpipe.Plan.from_bytes(its[0].result.plans[0].to_bytes()).dataset == {"fingerprint": want["fingerprint"],
                                                                                   "tasks": None}
    assert f'"dataset": "{want["fingerprint"]}"' in its[0].result.plans[0].to_json()


@pytest.mark.parametrize("edit, what", [
    (reorder, r"the tasks are in another order: planned 6 tasks \['define', 'synonyms', .*found 6 tasks "
              r"\['synonyms', 'define', "),
    (drop, r"other tasks \(planned task 'man_text' is missing\): planned 6 tasks .*found 5 tasks"),
    (replace, r"task 2 \('translate'\) held \d+ samples when planned, found \d+"),
    (rebuild, r"the same 6 tasks .* with the same sample counts, but other data"),
])
def test_a_rank_loader_refuses_a_plan_file_over_another_dataset(planned, tmp_path, edit, what):
    path, demo, _ = planned
    other = manifest(tmp_path, "other.json", edit)
    data = packpipe.MultiTaskDataset(other)
    assert data.fingerprint() != demo.fingerprint()
    with pytest.raises(ValueError, match=rf"plan file '{re.escape(path)}' was planned from another dataset than "
                                         rf"'{re.escape(other)}': {what}.*planned {demo.fingerprint()}, found "
                                         rf"{data.fingerprint()}"):
        packpipe.RankLoader(data, plan_file=path, rank=None)
    # A plan of the file assembled by hand against it: refused as well.
    with pytest.raises(ValueError, match=r"iteration 0: the plan was planned from another dataset"):
        packpipe.assemble_microbatch(data, packpipe.PlanFileReader(path)[0], 0, 0)


def test_the_manifest_it_was_planned_from_loads_wherever_it_lies(planned, tmp_path):
    path, demo, its = planned
    same = packpipe.MultiTaskDataset(manifest(tmp_path, "same.json"))
    assert same.fingerprint() == demo.fingerprint()
    got = list(packpipe.RankLoader(same, plan_file=path, rank=None))
    assert [it.iteration for it in got] == [it.iteration for it in its]
    assert all(g.plan == it.result.plans[0] for g, it in zip(got, its))


def test_a_file_that_records_no_dataset_loads_unchecked(planned, tmp_path):
    """As an older file: plans of format 4 (no dataset) in a file whose writer recorded none."""
    path, demo, its = planned
    old = str(tmp_path / "old.plans")
    with packpipe.PlanFileWriter(old) as w:
        for it in its:
            text = it.result.plans[0].to_json()
            text = text.replace(f'"dataset": "{demo.fingerprint()}",\n', "").replace('"version": 5', '"version": 4')
            plan = packpipe.Plan.from_json(text)
            assert plan.dataset is None
            w.append(plan)
    assert packpipe.PlanFileReader(old).dataset is None
    got = list(packpipe.RankLoader(demo, plan_file=old, rank=None))
    assert len(got) == len(its)
    # Unchecked: the caller vouches for the dataset (a reordered one would load other tokens).
    reordered = packpipe.MultiTaskDataset(manifest(tmp_path, "reordered.json", reorder))
    packpipe.RankLoader(reordered, plan_file=old, rank=None)


def test_a_writer_refuses_plans_of_two_datasets(planned, tmp_path):
    path, demo, its = planned
    other = packpipe.MultiTaskDataset(manifest(tmp_path, "reordered.json", reorder))
    theirs = next(iter(packpipe.plan_epoch(packpipe.CostModel("gpt-350m", "A100-40GB"), other, **KW)))
    with packpipe.PlanFileWriter(str(tmp_path / "mixed.plans")) as w:
        w.append(its[0].result.plans[0])
        plan = theirs.result.plans[0]
        with pytest.raises(ValueError, match=rf"indexes dataset {other.fingerprint()}, the file's plans dataset "
                                             rf"{demo.fingerprint()}"):
            w.append(packpipe.Plan.from_bytes(plan.to_bytes()))
        assert w.plans_written == 1


def test_a_cli_plan_file_is_refused_over_a_reordered_manifest(tmp_path):
    cli = os.environ.get("PACKPIPE_CLI")
    if not cli:
        pytest.fail("PACKPIPE_CLI is not set (run through ctest)")
    out = str(tmp_path / "cli.plans")
    subprocess.run([cli, "plan", "--manifest", str(DEMO / "manifest.json"), "--model", "gpt-350m", "--stages", "2",
                    "--global-batch-tokens", "2000", "--iterations", "2", "--no-baselines", "--out", out],
                   check=True, capture_output=True)
    demo = packpipe.MultiTaskDataset(str(DEMO / "manifest.json"))
    assert packpipe.PlanFileReader(out).dataset["fingerprint"] == demo.fingerprint()
    assert len(list(packpipe.RankLoader(demo, plan_file=out, rank=None))) == 2
    reordered = manifest(tmp_path, "reordered.json", reorder)
    with pytest.raises(ValueError, match=rf"plan file '{re.escape(out)}' was planned from another dataset than "
                                         rf"'{re.escape(reordered)}': the tasks are in another order"):
        packpipe.RankLoader(packpipe.MultiTaskDataset(reordered), plan_file=out, rank=None)

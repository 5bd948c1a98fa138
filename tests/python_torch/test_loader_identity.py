"""PlanLoader states restore only into a loader that delivers the same samples: the state's fingerprint
covers the manifest's identity (task names, order, files, weights) and the plan file's plans; a plan
file loads only over the manifest it was planned from; an incomplete plan file is read only with
allow_incomplete=True."""
import re

import pytest

import packpipe
import packpipe.torch as pt

import support


def planning_loader(directory, tasks, **kw):
    directory.mkdir(exist_ok=True)
    args = dict(cost_model=packpipe.CostModel("gpt-350m", "A100-40GB"), shape=packpipe.PipelineShape(stages=2),
                global_batch_tokens=500, seed=3, rank=None, iterations=4, dtype="bf16")
    args.update(kw)
    return pt.PlanLoader(support.short_manifest(directory, tasks), **args)


def test_a_state_does_not_restore_into_a_manifest_with_the_tasks_reordered(tmp_path):
    a = planning_loader(tmp_path / "a", ("define", "synonyms", "translate"))
    next(a)
    state = a.state_dict()
    same = planning_loader(tmp_path / "same", ("define", "synonyms", "translate"))
    same.load_state_dict(state)  # the same manifest elsewhere: restores
    assert next(same).iteration == 1
    for tasks in (("synonyms", "define", "translate"), ("define", "synonyms")):
        other = planning_loader(tmp_path / "-".join(tasks), tasks)
        with pytest.raises(ValueError, match="other settings"):
            other.load_state_dict(state)


def test_a_state_of_one_plan_file_does_not_restore_into_another(tmp_path):
    ds = support.short_manifest(tmp_path)
    paths = []
    for tokens in (500, 700):
        paths.append(str(tmp_path / f"{tokens}.plans"))
        with packpipe.PlanFileWriter(paths[-1]) as w:
            for it in planning_loader(tmp_path / "p", ("define", "synonyms", "translate"), global_batch_tokens=tokens):
                w.append(it.plan)
    first = pt.PlanLoader(ds, plan_file=paths[0], rank=None)
    next(first)
    state = first.state_dict()
    pt.PlanLoader(ds, plan_file=paths[0], rank=None).load_state_dict(state)
    # The same path planned again differently: refused.
    import shutil
    shutil.copyfile(paths[1], paths[0])
    with pytest.raises(ValueError, match="other settings"):
        pt.PlanLoader(ds, plan_file=paths[0], rank=None).load_state_dict(state)


def test_an_incomplete_plan_file_needs_allow_incomplete(tmp_path):
    path = str(tmp_path / "part.plans")
    with packpipe.PlanFileWriter(path) as w:
        w.expect_iterations(0, 4)
        for k, it in enumerate(planning_loader(tmp_path / "p", ("define", "synonyms", "translate"))):
            if k < 2:
                w.append(it.plan)
    ds = support.short_manifest(tmp_path)
    with pytest.raises(RuntimeError, match="incomplete plan file.*allow_incomplete=True"):
        next(iter(pt.PlanLoader(ds, plan_file=path, rank=None)))
    assert [it.iteration for it in pt.PlanLoader(ds, plan_file=path, rank=None, allow_incomplete=True)] == [0, 1]


def test_a_plan_file_loads_only_over_the_manifest_it_was_planned_from(tmp_path):
    path = str(tmp_path / "short.plans")
    with packpipe.PlanFileWriter(path) as w:
        for it in planning_loader(tmp_path / "p", ("define", "synonyms", "translate")):
            w.append(it.plan)
    (tmp_path / "same").mkdir()
    same = support.short_manifest(tmp_path / "same")
    assert [it.iteration for it in pt.PlanLoader(same, plan_file=path, rank=None)] == [0, 1, 2, 3]
    for name, tasks, files, what in (
            ("reordered", ("synonyms", "define", "translate"), None, r"the tasks are in another order"),
            ("dropped", ("define", "synonyms"), None, r"other tasks \(planned task 'translate' is missing\)"),
            ("replaced", ("define", "synonyms", "translate"), {"translate": "synonyms"},
             r"task 2 \('translate'\) held \d+ samples when planned, found \d+")):
        (tmp_path / name).mkdir()
        other = support.short_manifest(tmp_path / name, tasks, files)
        with pytest.raises(ValueError, match=rf"plan file '{re.escape(path)}' was planned from another dataset than "
                                             rf"'{re.escape(other)}': {what}"):
            pt.PlanLoader(other, plan_file=path, rank=None)

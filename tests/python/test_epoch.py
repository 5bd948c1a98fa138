"""packpipe.plan_epoch: every iteration of an epoch of a MultiTaskDataset, planned ahead in parallel
and delivered in order, the same plans as plan_batch and `packpipe plan`."""
import gc
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import packpipe
from packpipe import PartitionOptions, PipelineShape

GPT_PREFIX = "wordnet_gpt2_text_document"
SHAPE = PipelineShape(stages=4, layers_per_stage=4, memory_mb=36000)


@pytest.fixture(scope="module")
def gpt():
    return packpipe.CostModel("gpt-1.3b", "A100-40GB")


@pytest.fixture(scope="module")
def text(megatron):
    return packpipe.MultiTaskDataset(str(megatron / GPT_PREFIX))


def manifest(tmp_path, megatron):
    m = {"version": 1, "tasks": [
        {"name": "gpt", "dataset": str(megatron / GPT_PREFIX)},
        {"name": "mt", "inputs": str(megatron / "wordnet_mt_inputs_document"),
         "targets": str(megatron / "wordnet_mt_targets_document")}]}
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(m))
    return str(path)


def without_refs(plan):
    """A plan's JSON without the dataset names of its samples and the dataset's identity (plan_batch without
    refs has no dataset to name them)."""
    j = json.loads(plan.to_json())
    j.pop("dataset", None)
    for mb in j["microbatches"]:
        mb.pop("refs", None)
    return j


def test_iterates_in_order_with_the_sampled_lengths(gpt, text):
    e = packpipe.plan_epoch(gpt, text, shape=SHAPE, global_batch_samples=6, seed=7)
    assert isinstance(e, packpipe.EpochPlanner)
    assert len(e) == e.iterations == e.epoch_iterations == 11  # 64 samples, 6 a batch
    assert e.vstages == 4 and repr(e) == "EpochPlanner(iterations=11, vstages=4)"
    its = list(e)
    assert [it.iteration for it in its] == list(range(11))
    assert next(e, None) is None  # stays exhausted
    inputs, targets = text.lengths(0)
    seen = []
    for it in its:
        assert isinstance(it, packpipe.PlannedIteration) and isinstance(it.result, packpipe.IterationResult)
        assert it.result.iteration == it.iteration and it.blobs == []
        assert it.refs.dtype.names == ("task", "index", "offset") and np.all(it.refs["task"] == 0)
        assert np.all(it.refs["offset"] == 0)  # whole samples: no context length
        idx = it.refs["index"]
        # decoder-only: a sample is one sequence of its input and target tokens
        assert it.input_lengths.dtype == np.uint32 and len(it.target_lengths) == 0
        assert np.array_equal(it.input_lengths, inputs[idx] + targets[idx])
        assert it.result.samples == len(idx) and it.result.tokens == int(it.input_lengths.sum())
        names = [tuple(r) for mb in it.result.plans[0].microbatches for r in mb["refs"]]
        assert sorted(names) == sorted((0, int(i)) for i in idx)
        seen += idx.tolist()
    assert sorted(seen) == list(range(64))  # one epoch: every sample once


def test_equals_plan_batch_for_the_same_iteration(gpt, text):
    opts = PartitionOptions(round_multiple=16)
    for it in packpipe.plan_epoch(gpt, text, shape=SHAPE, options=opts, global_batch_samples=16, seed=3,
                                  first_iteration=1, iterations=2):
        b = packpipe.plan_batch(gpt, it.input_lengths, it.target_lengths, shape=SHAPE, options=opts, seed=3,
                                iteration=it.iteration)
        assert [without_refs(p) for p in b.plans] == [without_refs(p) for p in it.result.plans]
        assert b.packpipe.iteration_ms == it.result.packpipe.iteration_ms
        assert b.partition.objective_ms == it.result.partition.objective_ms
        # With the iteration's refs, plan_batch gives the same plans, refs included.
        named = packpipe.plan_batch(gpt, it.input_lengths, it.target_lengths, shape=SHAPE, options=opts, seed=3,
                                    iteration=it.iteration, refs=it.refs, dataset=text)
        assert [json.loads(p.to_json()) for p in named.plans] == [json.loads(p.to_json()) for p in it.result.plans]
        assert named.plans[0].dataset == it.result.plans[0].dataset
        assert named.plans[0].dataset["fingerprint"] == text.fingerprint()
    assert it.iteration == 2


def test_follows_shape_stage_layers(gpt, text):
    split = packpipe.balanced_stage_layers(gpt, SHAPE, 1, 512)  # gpt-1.3b: 24 layers
    shape = PipelineShape(stages=4, memory_mb=36000, stage_layers=split)
    ends = np.cumsum(split).tolist()
    for it in packpipe.plan_epoch(gpt, text, shape=shape, global_batch_samples=16, iterations=2):
        for plan in it.result.plans:
            assert [st["encoder_layers"] for st in plan.stages] == [(e - n, e) for e, n in zip(ends, split)]


def test_encoder_decoder_manifest(tmp_path, megatron):
    mt = packpipe.MultiTaskDataset(manifest(tmp_path, megatron))
    t5 = packpipe.CostModel("t5-770m", "A100-40GB")
    shape = PipelineShape(stages=2, memory_mb=36000)
    its = list(packpipe.plan_epoch(t5, mt, shape=shape, global_batch_tokens=400, iterations=3, threads=2))
    assert [it.iteration for it in its] == [0, 1, 2]
    for it in its:
        assert len(it.target_lengths) == len(it.input_lengths) == len(it.refs) > 0
        for (task, index, _), i, t in zip(it.refs.tolist(), it.input_lengths, it.target_lengths):
            inp, tgt = mt.lengths(task)
            assert (i, t) == (max(inp[index], 1), max(tgt[index], 1))  # an empty side counts one token
        b = packpipe.plan_batch(t5, it.input_lengths, it.target_lengths, shape=shape, iteration=it.iteration,
                                loss_tokens=it.loss_tokens)
        assert [without_refs(p) for p in b.plans] == [without_refs(p) for p in it.result.plans]


def test_deterministic_whatever_the_threads(gpt, text):
    def blobs(threads, depth):
        e = packpipe.plan_epoch(gpt, text, shape=PipelineShape(stages=4, layers_per_stage=4, dp=2, memory_mb=36000),
                                options=PartitionOptions(method="fixed", mbs=2), global_batch_tokens=300,
                                threads=threads, depth=depth, encode=True)
        return [(it.iteration, it.blobs) for it in e]
    one, two = blobs(1, 1), blobs(2, 0)
    assert one == two
    assert len(one) > 2 and all(len(b) == 2 for _, b in one)  # one plan per replica
    plan = packpipe.Plan.from_bytes(one[0][1][1])
    assert plan.iteration == 0 and plan.replica == 1


def test_same_plans_as_the_cli(tmp_path, megatron, gpt, text):
    cli = os.environ.get("PACKPIPE_CLI")
    if not cli:
        pytest.skip("PACKPIPE_CLI not set")
    out = tmp_path / "e.plans"
    subprocess.run([cli, "plan", "--dataset", str(megatron / GPT_PREFIX), "--model", "gpt-1.3b", "--stages", "4",
                    "--layers-per-stage", "4", "--memory-mb", "36000", "--global-batch-samples", "8", "--seed", "11",
                    "--no-baselines", "--out", str(out)], check=True, capture_output=True)
    reader = packpipe.PlanFileReader(str(out))
    its = list(packpipe.plan_epoch(gpt, text, shape=SHAPE, global_batch_samples=8, seed=11, encode=True))
    assert len(reader) == len(its) == 8
    for it in its:
        assert it.blobs[0] == reader.read(it.iteration).to_bytes()
        assert it.result.plans[0] == reader.read(it.iteration)


def test_keeps_the_dataset_and_the_cost_model_alive(megatron):
    e = packpipe.plan_epoch(packpipe.CostModel("gpt-1.3b"), packpipe.MultiTaskDataset(str(megatron / GPT_PREFIX)),
                            shape=SHAPE, global_batch_samples=32)
    gc.collect()
    assert [it.result.samples for it in e] == [32, 32]


def write_dataset(prefix, lengths):
    b = packpipe.IndexedDatasetBuilder(str(prefix), dtype=np.uint16)
    for n in lengths:
        b.add_item(np.ones(n, dtype=np.uint16))
        b.end_document()
    b.finalize()
    return packpipe.MultiTaskDataset(str(prefix))


def test_an_error_names_the_iteration_after_every_earlier_one(tmp_path):
    cm = packpipe.CostModel("gpt-6.7b", "A100-40GB")
    shape = PipelineShape(stages=4, layers_per_stage=4, memory_mb=36000)
    lengths = [100 + k for k in range(40)]
    lengths[13] = 1_000_000  # cannot fit even alone
    data = write_dataset(tmp_path / "long", lengths)
    dropped = list(packpipe.plan_epoch(cm, data, shape=shape, global_batch_samples=4,
                                       options=PartitionOptions(oversize="drop")))
    where = next(it.iteration for it in dropped if it.result.dropped)
    assert 13 in dropped[where].refs["index"].tolist()
    e = packpipe.plan_epoch(cm, data, shape=shape, global_batch_samples=4, threads=2)
    delivered = []
    with pytest.raises(ValueError, match=rf"iteration {where}, task '.*', dataset sample 13 \(length 1000000\) "
                                         r"does not fit"):
        for it in e:
            delivered.append(it.iteration)
    assert delivered == list(range(where))
    with pytest.raises(ValueError, match=rf"iteration {where}, "):
        next(e)  # and on every later call


def test_arguments_are_checked(gpt, text):
    for kw, msg in [
        (dict(), r"give exactly one of a global batch token budget \(global_batch_tokens / --global-batch-tokens\) "
                r"and a global batch sample count \(global_batch_samples / --global-batch-samples\)"),
        (dict(global_batch_samples=8, global_batch_tokens=100), "give exactly one of"),
        (dict(global_batch_samples=-8), "global_batch_samples must not be negative"),
        (dict(global_batch_samples=8, threads=-1), "threads must not be negative"),
        (dict(global_batch_samples=8, threads=5000), r"threads must be in \[0, 4096\]"),
        (dict(global_batch_samples=8, split="holdout"), "holdout"),
        (dict(global_batch_samples=8, schedule="pipedream"), "unknown schedule 'pipedream'"),
        (dict(global_batch_samples=8, first_iteration=99), "first iteration 99 is past the end of epoch 0"),
        (dict(global_batch_samples=8, shape=PipelineShape(stages=64)), "64 virtual stages exceed the 24 layers"),
    ]:
        with pytest.raises(ValueError, match=msg):
            packpipe.plan_epoch(gpt, text, **kw)
    with pytest.raises(TypeError):
        packpipe.plan_epoch(text, gpt, global_batch_samples=8)  # one order: the cost model first


def test_early_break_and_exit_do_not_hang(megatron):
    """Leaving the loop early (and exiting with a planner mid-epoch) stops the background planning."""
    script = textwrap.dedent(f"""
        import packpipe
        cm = packpipe.CostModel("gpt-1.3b")
        data = packpipe.MultiTaskDataset({str(megatron / GPT_PREFIX)!r})
        shape = packpipe.PipelineShape(stages=4, layers_per_stage=4, memory_mb=36000)
        for k in range(20):
            e = packpipe.plan_epoch(cm, data, shape=shape, global_batch_samples=2, threads=2, depth=1)
            for it in e:
                break
            del e
        kept = packpipe.plan_epoch(cm, data, shape=shape, global_batch_samples=2, threads=2, depth=1)
        assert next(kept).iteration == 0
        print("done")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={**os.environ})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "done"


@pytest.mark.parametrize("policy", ["truncate", "drop", "split"])
def test_context_length_plans_agree_with_the_cli_and_plan_batch(tmp_path, gpt, policy):
    """One rule under a context length: plan_epoch, the CLI's plan file and plan_batch of the iteration's
    lengths (within the context length already) give the same plans."""
    cli = os.environ.get("PACKPIPE_CLI")
    assert cli, "PACKPIPE_CLI is not set (run through ctest)"
    demo = os.path.join(os.path.dirname(__file__), "..", "..", "data", "demo", "manifest.json")
    out = tmp_path / "ctx.plans"
    subprocess.run([cli, "plan", "--manifest", demo, "--model", "gpt-1.3b", "--stages", "4", "--layers-per-stage", "4",
                    "--memory-mb", "36000", "--global-batch-tokens", "16384", "--seed", "11", "--iterations", "3",
                    "--loss", "targets", "--no-baselines", "--max-seq-len", "512", "--seq-policy", policy,
                    "--out", str(out)], check=True, capture_output=True)
    reader = packpipe.PlanFileReader(str(out))
    ds = packpipe.MultiTaskDataset(demo)
    kw = dict(shape=SHAPE, global_batch_tokens=16384, seed=11, loss="targets", max_seq_len=512, seq_policy=policy)
    its = list(packpipe.plan_epoch(gpt, ds, iterations=3, encode=True, **kw))
    assert len(reader) == len(its) == 3
    for it in its:
        assert it.blobs[0] == reader.read(it.iteration).to_bytes()
        b = packpipe.plan_batch(gpt, it.input_lengths, shape=SHAPE, seed=11, loss="targets", max_seq_len=512,
                                seq_policy=policy, iteration=it.iteration, loss_tokens=it.loss_tokens, refs=it.refs,
                                dataset=ds)
        assert [p.to_bytes() for p in b.plans] == it.blobs
        assert b.seq_truncated == b.seq_dropped == b.seq_split == 0  # the lengths are within it already


@pytest.mark.parametrize("policy", ["truncate", "drop", "split"])
def test_a_context_of_one_token_is_refused_before_planning(tmp_path, gpt, policy):
    """A decoder-only context length of 1 leaves no token with a label (0 loss tokens every iteration):
    plan_epoch, plan_batch and the CLI refuse it by name, under every policy."""
    demo = os.path.join(os.path.dirname(__file__), "..", "..", "data", "demo", "manifest.json")
    ds = packpipe.MultiTaskDataset(demo)
    with pytest.raises(ValueError, match=r"max_seq_len 1 leaves no token to train.*at least 2"):
        packpipe.plan_epoch(gpt, ds, iterations=1, shape=SHAPE, global_batch_tokens=4096, max_seq_len=1,
                            seq_policy=policy)
    with pytest.raises(ValueError, match=r"max_seq_len 1 leaves no token to train"):
        packpipe.plan_batch(gpt, [5, 9], shape=SHAPE, max_seq_len=1, seq_policy=policy)
    # a context of 2 trains one token a sample
    b = packpipe.plan_batch(gpt, [5, 9], shape=SHAPE, max_seq_len=2, seq_policy="truncate")
    assert list(b.trained_loss_tokens) == [1, 1]
    cli = os.environ.get("PACKPIPE_CLI")
    assert cli, "PACKPIPE_CLI is not set (run through ctest)"
    r = subprocess.run([cli, "plan", "--manifest", demo, "--model", "gpt-1.3b", "--stages", "4", "--iterations", "1",
                        "--no-baselines", "--global-batch-tokens", "4096", "--max-seq-len", "1", "--seq-policy", policy, "--out",
                        str(tmp_path / "x.plans")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--max-seq-len 1 leaves no token to train" in r.stderr, r.stderr
    assert not (tmp_path / "x.plans").exists()


@pytest.mark.parametrize("policy", ["truncate", "drop"])
def test_the_token_budget_counts_what_is_trained(gpt, policy):
    """Under a context length the global batch's token budget counts the tokens trained (a truncated
    sample its first max_seq_len, a dropped one none), so every batch but an epoch's last trains
    within one context length of the budget, as many tokens as asked for."""
    demo = os.path.join(os.path.dirname(__file__), "..", "..", "data", "demo", "manifest.json")
    ds = packpipe.MultiTaskDataset(demo)
    budget, L = 4096, 256
    its = list(packpipe.plan_epoch(gpt, ds, iterations=6, shape=SHAPE, global_batch_tokens=budget, seed=3,
                                   max_seq_len=L, seq_policy=policy))
    dropped = 0
    for it in its:
        trained = int(np.sum(it.trained_input_lengths))
        assert budget - L < trained <= budget, (it.iteration, trained)
        dropped += it.result.seq_dropped
    if policy == "drop":
        assert dropped > 0  # the demo has samples over 256 tokens: dropped, and the budget refilled


def test_the_activation_dtype_comes_from_the_model_file(tmp_path, megatron, text):
    """A model file's "dtype" is the plans' when plan_epoch, plan_batch and `packpipe plan` are given none;
    dtype= and --dtype override it; a model file without one plans bf16."""
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"name": "tiny", "num_layers": 4, "hidden": 256, "heads": 4, "dtype": "fp64"}))
    cost = packpipe.CostModel(str(model), "A100-40GB")
    assert cost.model["dtype"] == "fp64"
    shape = PipelineShape(stages=2)
    kw = dict(shape=shape, global_batch_samples=8, iterations=2, encode=True)
    its = list(packpipe.plan_epoch(cost, text, **kw))
    assert {it.result.plans[0].dtype for it in its} == {"fp64"}
    assert packpipe.plan_batch(cost, [30, 40, 50], shape=shape).plans[0].dtype == "fp64"
    assert {it.result.plans[0].dtype for it in packpipe.plan_epoch(cost, text, dtype="bf16", **kw)} == {"bf16"}
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"name": "tiny", "num_layers": 4, "hidden": 256, "heads": 4}))
    bare = packpipe.CostModel(str(plain), "A100-40GB")
    assert bare.model["dtype"] is None
    assert packpipe.plan_batch(bare, [30, 40, 50], shape=shape).plans[0].dtype == "bf16"
    with pytest.raises(ValueError, match="dtype must be one of fp16, bf16, fp32, fp64, or None"):
        packpipe.plan_epoch(cost, text, dtype=5, **kw)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "tiny", "num_layers": 4, "hidden": 256, "heads": 4, "dtype": "int8"}))
    with pytest.raises(ValueError, match="dtype must be one of fp16, bf16, fp32, fp64"):
        packpipe.CostModel(str(bad), "A100-40GB")
    cli = os.environ.get("PACKPIPE_CLI")
    assert cli, "PACKPIPE_CLI is set by the test runner (make test)"
    for extra, want in (([], "fp64"), (["--dtype", "fp16"], "fp16")):
        out = tmp_path / ("cli%s.plans" % len(extra))
        subprocess.run([cli, "plan", "--dataset", str(megatron / GPT_PREFIX), "--model", str(model), "--stages", "2",
                        "--global-batch-samples", "8", "--iterations", "2", "--no-baselines", "--out", str(out)]
                       + extra, check=True, capture_output=True)
        reader = packpipe.PlanFileReader(str(out))
        assert {reader.read(i).dtype for i in range(2)} == {want}
        if not extra:
            assert reader.read(0).to_bytes() == its[0].blobs[0]

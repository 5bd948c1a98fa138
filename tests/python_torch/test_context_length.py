"""The context length through PlanLoader (issue 22's first friction point): a model with fewer
positions than the demo's longest samples (~3,000 tokens) trains on every iteration under
max_seq_len with each seq_policy, never indexing past its position table; the plans say so."""
import math

import pytest
import torch

import packpipe
import packpipe.torch as pt
from packpipe.torch import models

import support

torch.set_num_threads(1)

POSITIONS = 128
GPT = models.GPTConfig(vocab_size=50257, hidden=8, layers=2, heads=2, max_positions=POSITIONS,
                       dtype=torch.float32, seed=1)


@pytest.mark.parametrize("policy", ["truncate", "drop", "split"])
def test_a_model_with_fewer_positions_trains_on_the_demo(tmp_path, policy):
    data = packpipe.MultiTaskDataset(str(support.DEMO / "manifest.json"))
    loader = pt.PlanLoader(data, cost_model=support.cost_model(GPT, tmp_path), rank=None, iterations=2,
                           shape=packpipe.PipelineShape(stages=2), global_batch_tokens=1024, seed=5, dtype="fp32",
                           calibrate=False, max_seq_len=POSITIONS, seq_policy=policy)
    model = models.GPT(GPT)
    pipe = None
    longer = 0  # samples of the batches longer than the model's positions
    for it in loader:
        plan = it.plan
        assert plan.max_seq_len == POSITIONS
        for mb in plan.microbatches:
            assert max(mb["lengths"]) <= POSITIONS
            for (task, index), offset in zip(mb["refs"], mb["offsets"]):
                inp, tgt = data.lengths(task)
                longer += int(inp[index] + tgt[index]) > POSITIONS
                assert offset == 0 or policy == "split"
        for m in range(len(plan.microbatches)):
            batch = it.microbatch(m, stage=0)
            assert int(batch.position_ids.max()) < POSITIONS
        if pipe is None:
            stages = {v: model.stage(plan.stages[v]) for v in range(plan.vstages)}
            pipe = pt.LocalPipeline(stages, models.gpt_loss, lambda ps: torch.optim.SGD(ps, lr=0.01),
                                    dtype=torch.float32, timeout_s=120)
        result = pipe.run(it)
        assert math.isfinite(result.loss)
    # The batches held samples over the context length: truncated and split ones are trained.
    if policy == "drop":
        assert longer == 0
    else:
        assert longer > 0


def test_the_context_length_is_read_from_the_module(tmp_path):
    """pt.cost_model reads the module's position limit (a learned position table here, a config's
    max_position_embeddings for HF models): PlanLoader plans with it when max_seq_len is left out,
    and refuses a max_seq_len past it (or 0, no limit) naming the limit and where it was read."""
    model = models.GPT(GPT)
    cm = pt.cost_model(model, support.CPU_DEVICE)
    assert cm.max_positions == POSITIONS and "positions" in cm.max_positions_from
    data = packpipe.MultiTaskDataset(str(support.DEMO / "manifest.json"))
    kw = dict(cost_model=cm, rank=None, iterations=2, shape=packpipe.PipelineShape(stages=1),
              global_batch_tokens=2048, seed=5, calibrate=False)
    longer = 0
    for it in pt.PlanLoader(data, **kw):
        assert it.plan.max_seq_len == POSITIONS
        for m in range(len(it.plan.microbatches)):
            assert int(it.microbatch(m).position_ids.max()) < POSITIONS
            for (task, index) in it.plan.microbatches[m]["refs"]:
                inp, tgt = data.lengths(task)
                longer += int(inp[index] + tgt[index]) > POSITIONS
    assert longer > 0  # the batches held samples longer than the model takes: truncated, not crashed
    for bad in (POSITIONS + 1, 0):
        with pytest.raises(ValueError, match=rf"max_seq_len {bad} .*beyond the model's {POSITIONS} positions "
                                             rf"\(GPT\..*positions.*at most {POSITIONS}"):
            pt.PlanLoader(data, max_seq_len=bad, **kw)
    assert next(iter(pt.PlanLoader(data, max_seq_len=64, **kw))).plan.max_seq_len == 64

    class HFConfig:
        max_position_embeddings = 96

    model.config = HFConfig()
    assert pt.cost_model(model, support.CPU_DEVICE).max_positions == 96

"""packpipe.torch.attention against a dense reference: on real plans' micro-batches of every layout,
attention in the layout (varlen segments for packed rows, dense rows for padded ones) equals dense
attention under the block-diagonal masks at every real token, and so do the gradients of q, k and v
(fp64, to 1e-10); no (sum l)^2 tensor is made for a packed row."""
import numpy as np
import pytest
import torch

import packpipe
import packpipe.torch as pt
from packpipe.torch import attention as attn
from packpipe.torch import models

import support

GPT = models.GPTConfig(vocab_size=96, hidden=16, layers=2, heads=2, dtype=torch.float64)
T5C = models.T5Config(vocab_size=96, hidden=16, encoder_layers=2, decoder_layers=2, heads=2, dtype=torch.float64)


def batches(tmp_path, cfg, layouts, manifest=None):
    ld = pt.PlanLoader(manifest or support.short_manifest(tmp_path), cost_model=support.cost_model(cfg, tmp_path),
                       shape=packpipe.PipelineShape(stages=2), global_batch_tokens=700, seed=9, dtype="fp64",
                       rank=None, iterations=3, calibrate=False, options=packpipe.PartitionOptions(layouts=layouts))
    for it in ld:
        for mb in range(len(it.plan.microbatches)):
            yield it.microbatch(mb)


def check(out, ref, grads, ref_grads, real):
    """Outputs [rows, heads, n, d] equal at real positions; gradients equal everywhere."""
    keep = real[:, None, :, None].expand_as(out)
    assert torch.allclose(out[keep], ref[keep], rtol=1e-10, atol=1e-12)
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, rtol=1e-10, atol=1e-12)


def run(fn, q, k, v, seed_grad):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    y = fn(q, k, v)
    (y * seed_grad).sum().backward()
    return y.detach(), [q.grad, k.grad, v.grad]


@pytest.mark.parametrize("layouts", [("packed",), ("padded",)])
def test_self_attention_equals_the_dense_block_diagonal_reference(tmp_path, layouts):
    g = torch.Generator().manual_seed(1)
    seen = 0
    for batch in batches(tmp_path, GPT, layouts):
        assert batch.layout == layouts[0]
        rows, n, heads, d = batch.rows, batch.seq, 2, 8
        q, k, v = (torch.randn(rows, heads, n, d, dtype=torch.float64, generator=g) for _ in range(3))
        real = batch.segment_ids > 0
        # Gradients only through the real positions' outputs (padding carries no loss).
        seed_grad = torch.randn(rows, heads, n, d, dtype=torch.float64, generator=g) * real[:, None, :, None]
        for causal in (True, False):
            out, grads = run(lambda q, k, v: attn.attention(q, k, v, batch, causal=causal), q, k, v, seed_grad)
            mask = batch.attention_mask(causal=causal)
            ref, ref_grads = run(lambda q, k, v: attn._attend(q, k, v, mask, False), q, k, v, seed_grad)
            check(out, ref, grads, ref_grads, real)
        seen += 1
    assert seen >= 3


def test_cross_attention_equals_the_dense_reference(tmp_path):
    g = torch.Generator().manual_seed(2)
    seen = 0
    for batch in batches(tmp_path, T5C, ("packed",)):
        assert batch.layout == "packed" and batch.rows == 1
        heads, d = 2, 8
        q = torch.randn(1, heads, batch.dec_seq, d, dtype=torch.float64, generator=g)
        k, v = (torch.randn(1, heads, batch.seq, d, dtype=torch.float64, generator=g) for _ in range(2))
        real = batch.decoder_segment_ids > 0
        seed_grad = torch.randn(1, heads, batch.dec_seq, d, dtype=torch.float64, generator=g) * real[:, None, :, None]
        out, grads = run(lambda q, k, v: attn.cross_attention(q, k, v, batch), q, k, v, seed_grad)
        mask = batch.cross_attention_mask()
        ref, ref_grads = run(lambda q, k, v: attn._attend(q, k, v, mask, False), q, k, v, seed_grad)
        check(out, ref, grads, ref_grads, real)
        # The decoder's own segments, causal.
        kd, vd = (torch.randn(1, heads, batch.dec_seq, d, dtype=torch.float64, generator=g) for _ in range(2))
        out, grads = run(lambda q, k, v: attn.attention(q, k, v, batch, causal=True, decoder=True), q, kd, vd,
                         seed_grad)
        mask = batch.attention_mask(causal=True, decoder=True)
        ref, ref_grads = run(lambda q, k, v: attn._attend(q, k, v, mask, False), q, kd, vd, seed_grad)
        check(out, ref, grads, ref_grads, real)
        seen += 1
    assert seen >= 2


def test_a_packed_row_is_grouped_by_length_without_a_quadratic_tensor(tmp_path):
    for batch in batches(tmp_path, GPT, ("packed",), manifest=str(support.DEMO / "manifest.json")):
        groups = attn._segments(batch, False)
        lengths = np.diff(batch.cu_seqlens.numpy())
        assert sum(int(gr.valid.sum()) for gr in groups) == int(lengths.sum()) == batch.seq
        # every group's segments within GROUP_RATIO of its longest, and its scores bounded
        for gr in groups:
            lens = gr.valid.sum(dim=1)
            assert int(lens.max()) == gr.length and float(lens.min()) * attn.GROUP_RATIO >= gr.length
            assert gr.idx.shape[0] * gr.length ** 2 <= max(attn.GROUP_SCORES, gr.length ** 2)
        # the work is about the sum of squares, not the row's square
        padded_work = sum(gr.idx.shape[0] * gr.length ** 2 for gr in groups)
        assert padded_work <= attn.GROUP_RATIO ** 2 * float((lengths.astype(np.float64) ** 2).sum()) + 1
        if len(lengths) > 1:
            assert padded_work < batch.seq ** 2
        # HF's names for the boundaries of a packed row
        assert torch.equal(batch.cu_seq_lens_q, batch.cu_seqlens) and batch.max_length_k == int(lengths.max())

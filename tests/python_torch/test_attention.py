"""packpipe.torch.attention against a dense reference: on real plans' micro-batches of every layout,
attention in the layout (varlen segments for packed rows, dense rows for padded ones) equals dense
attention under the block-diagonal masks at every real token, and so do the gradients of q, k and v
(fp64, to 1e-10); no (sum l)^2 tensor is made for a packed row."""
import types

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


def batches(tmp_path, cfg, layouts, manifest=None, options=None):
    ld = pt.PlanLoader(manifest or support.short_manifest(tmp_path), cost_model=support.cost_model(cfg, tmp_path),
                       shape=packpipe.PipelineShape(stages=2), global_batch_tokens=700, seed=9, dtype="fp64",
                       rank=None, iterations=3, calibrate=False,
                       options=options or packpipe.PartitionOptions(layouts=layouts))
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


def inputs(batch, g, heads=2, d=8):
    """Random q, k, v [rows, heads, seq, d] of a micro-batch, its real positions, and an output gradient
    only through the real positions (padding carries no loss)."""
    rows, n = batch.rows, batch.seq
    q, k, v = (torch.randn(rows, heads, n, d, dtype=torch.float64, generator=g) for _ in range(3))
    real = batch.segment_ids > 0
    seed_grad = torch.randn(rows, heads, n, d, dtype=torch.float64, generator=g) * real[:, None, :, None]
    return q, k, v, real, seed_grad


@pytest.mark.parametrize("layouts", [("packed",), ("padded",)])
def test_self_attention_equals_the_dense_block_diagonal_reference(tmp_path, layouts):
    g = torch.Generator().manual_seed(1)
    seen = 0
    for batch in batches(tmp_path, GPT, layouts):
        assert batch.layout == layouts[0]
        q, k, v, real, seed_grad = inputs(batch, g)
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
        # (the key side of a continuing slice also covers its prefix, kept from earlier slices)
        keys = np.diff(batch.cu_seqlens_k.numpy())
        assert torch.equal(batch.cu_seq_lens_q, batch.cu_seqlens) and batch.max_length_q == int(lengths.max())
        assert torch.equal(batch.cu_seq_lens_k, batch.cu_seqlens_k) and batch.max_length_k == int(keys.max())
        assert (keys >= lengths).all() and int((keys - lengths).sum()) == int(np.asarray(batch.prefix).sum())


def _math(q, k, v, mask):
    """The definition, for references that must not go through a patched kernel."""
    scores = torch.matmul(q, k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def test_the_fused_kernel_paths_are_called_as_their_apis_define(tmp_path, monkeypatch):
    """The GPU paths, on this CPU: PyTorch's scaled_dot_product_attention (absent from torch 1.13) and
    flash-attn's flash_attn_varlen_func (absent without a GPU) are replaced by implementations of
    their documented contracts (a boolean attn_mask is True where a query may attend; is_causal and
    attn_mask are not given together; varlen takes [total, heads, d] tensors and int32 cu_seqlens
    from 0 to total, with max_seqlen its longest sequence). Every layout then equals the dense
    reference, values and gradients, so what reaches the kernels is what their APIs define."""
    sdpa_calls, flash_calls = [], []

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
        assert not (is_causal and attn_mask is not None), "torch refuses is_causal with attn_mask"
        assert attn_mask is None or attn_mask.dtype == torch.bool
        sdpa_calls.append(is_causal)
        if is_causal:
            attn_mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        return _math(q, k, v, attn_mask)

    def flash(q, k, v, cu_q, cu_k, max_q, max_k, causal=False):
        assert q.dim() == 3 and q.shape == k.shape == v.shape
        assert cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k) and max_q == max_k
        cu = cu_q.tolist()
        assert cu[0] == 0 and cu[-1] == q.shape[0] and all(a < b for a, b in zip(cu, cu[1:]))
        assert max_q == max(b - a for a, b in zip(cu, cu[1:]))
        out = torch.empty_like(q)  # like the kernel: nothing is written outside the sequences
        for a, b in zip(cu, cu[1:]):
            qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))  # [heads, l, d]
            mask = torch.ones(b - a, b - a, dtype=torch.bool).tril() if causal else None
            out[a:b] = _math(qs, ks, vs, mask).transpose(0, 1)
        flash_calls.append(len(cu) - 1)
        return out

    g = torch.Generator().manual_seed(4)
    seen = 0
    # packed-mask rows: DynaPipe's packing baseline, 2 rows of 128 tokens a micro-batch.
    mask_rows = packpipe.PartitionOptions(method="packing", layout="packed-mask", mbs=2, capacity=128)
    for layouts in (("packed",), ("padded",), ("packed-mask",)):
        for batch in batches(tmp_path, GPT, layouts, options=mask_rows if layouts == ("packed-mask",) else None):
            assert batch.layout == layouts[0]
            q, k, v, real, seed_grad = inputs(batch, g)
            for causal in (True, False):
                mask = batch.attention_mask(causal=causal)
                ref, ref_grads = run(lambda q, k, v: _math(q, k, v, mask), q, k, v, seed_grad)
                with monkeypatch.context() as m:
                    m.setattr(attn, "_SDPA", sdpa)
                    m.setattr(attn, "_flash_varlen", None)
                    out, grads = run(lambda q, k, v: attn.attention(q, k, v, batch, causal=causal), q, k, v,
                                     seed_grad)
                check(out, ref, grads, ref_grads, real)
                if layouts == ("packed",):
                    with monkeypatch.context() as m:
                        m.setattr(attn, "_flash_varlen", flash)
                        m.setattr(attn, "_flash_ok", lambda t: True)
                        out, grads = run(lambda q, k, v: attn.attention(q, k, v, batch, causal=causal), q, k, v,
                                         seed_grad)
                    check(out, ref, grads, ref_grads, real)
            seen += 1
    assert seen >= 9
    # Both kernels ran, SDPA both with a mask and causal without one; flash on multi-sample rows.
    assert True in sdpa_calls and False in sdpa_calls
    assert flash_calls and max(flash_calls) > 1
    # Flash takes CUDA tensors in fp16 or bf16 only.
    for cuda, dtype, ok in ((True, torch.float16, True), (True, torch.bfloat16, True), (True, torch.float32, False),
                            (True, torch.float64, False), (False, torch.float16, False)):
        assert attn._flash_ok(types.SimpleNamespace(is_cuda=cuda, dtype=dtype)) == ok


@pytest.mark.parametrize("n,offset", [(1, 0), (127, 0), (128, 0), (129, 0), (300, 0), (513, 0),
                                      (1, 700), (130, 5), (300, 256), (513, 1024)])
def test_causal_attention_by_blocks_equals_the_masked_square(n, offset, monkeypatch):
    """Without a fused kernel causal attention runs by blocks of CAUSAL_BLOCK queries over the keys
    each may see (also aligned bottom-right after `offset` kept keys, as a slice): values and
    gradients equal the whole masked square's in fp64, across block edges."""
    monkeypatch.setattr(attn, "_SDPA", None)  # (the path of torch 1.13, whatever torch runs this)
    g = torch.Generator().manual_seed(n + offset)
    q = torch.randn(2, 3, n, 8, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(2, 3, n + offset, 8, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(2, 3, n + offset, 8, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(2, 3, n, 8, dtype=torch.float64, generator=g)
    see = torch.ones(n, n + offset, dtype=torch.bool).tril(diagonal=offset)
    ref = _math(q, k, v, see)
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))
    out = attn._attend(q, k, v, None, True, offset=offset)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    assert (n > attn.CAUSAL_BLOCK) == (len(range(0, n, attn.CAUSAL_BLOCK)) > 1)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layouts", [("packed",), ("padded",)])
def test_shapes_that_do_not_match_the_micro_batch_are_refused(tmp_path, layouts):
    """q, k, v are checked against the micro-batch and each other: a row too many gave a row of zeros, positions past
    the micro-batch zeros, one too few an IndexError, a shorter k was cut silently, a 3-D q a bare unpacking error and
    batch=None an AttributeError."""
    batch = next(batches(tmp_path, GPT, layouts))
    g = torch.Generator().manual_seed(7)
    q, k, v, _, _ = inputs(batch, g)
    rows, n = batch.rows, batch.seq
    attn.attention(q, k, v, batch, causal=True)  # the right shapes
    r = lambda *shape: torch.randn(*shape, dtype=torch.float64, generator=g)  # noqa: E731
    for args, message in [((r(rows + 1, 2, n, 8), k, v), rf"q is \({rows + 1}, 2, {n}, 8\); micro-batch .* has {rows} "
                                                          rf"rows of {n} tokens"),
                          ((r(rows, 2, n + 5, 8), k, v), rf"expected \[{rows}, heads, {n}, head_dim\]"),
                          ((r(rows, 2, n - 1, 8), k, v), rf"q is \({rows}, 2, {n - 1}, 8\)"),
                          ((q, r(rows, 2, n - 1, 8), v), rf"k is \({rows}, 2, {n - 1}, 8\)"),
                          ((q, k, r(rows, 2, n, 4)), "expected k and v of one shape"),
                          ((q, r(rows, 3, n, 8), r(rows, 3, n, 8)), "q's heads a multiple of theirs"),
                          ((q[0], k, v), r"q must be a 4-D tensor \[rows, heads, seq, head_dim\], found a 3-D tensor")]:
        with pytest.raises(ValueError, match=message):
            attn.attention(*args, batch, causal=True)
    with pytest.raises(TypeError, match="batch must be a packpipe.torch.MicroBatch .* found NoneType"):
        attn.attention(q, k, v, None, causal=True)

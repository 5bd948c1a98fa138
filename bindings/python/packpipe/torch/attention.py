"""Attention over a packpipe micro-batch in its layout: what the cost model charges is what runs.

``attention(q, k, v, batch, causal=...)`` computes scaled dot-product attention for the query, key
and value tensors of a micro-batch's rows (``[rows, heads, seq, head_dim]``, as a model makes them)
the way the micro-batch's layout says (``batch.layout``, from the plan):

* ``packed``: the samples of the one row attend each to itself only (varlen attention). With the
  ``flash_attn`` package on a GPU in fp16/bf16 this is ``flash_attn_varlen_func`` on
  ``batch.cu_seqlens``; otherwise the segments are grouped by length (each group padded to its
  longest, at most a quarter longer than its shortest) and each group is one batched attention
  (PyTorch's fused ``scaled_dot_product_attention`` where the installed torch has it). No
  ``(sum l)^2`` mask or score matrix is ever made: the work is about ``sum l^2``, as costed.
* ``padded``: dense attention over every padded row (the padding is computed, as the cost model
  charges it and as Megatron and DynaPipe run it); keys on padding are masked.
* ``packed-mask``: dense attention over each row under the block-diagonal mask.

A packed micro-batch may hold *slices* of long samples (docs/design/015-long-context.md): a slice
attends to the keys and values its sample's earlier slices kept (flash-attn varlen with
``cu_seqlens_q`` != ``cu_seqlens_k``, causal aligned bottom-right; on CPU one attention per slice),
and a slice that continues keeps its own for the later ones. The runners attach what a micro-batch
keeps (``packpipe.torch.slices``); a model of one's own gets slices through this same call.

Every layout gives the result of attending each sample alone (up to rounding) at every real token;
a padding position's output is zero (packed) or finite (padded rows) and carries no loss.
``cross_attention`` is the decoder-to-encoder attention of an encoder-decoder micro-batch: each
decoder segment attends to its own sample's encoder segment.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from packpipe import _check

try:  # the varlen kernel, where installed (GPU machines)
    from flash_attn import flash_attn_varlen_func as _flash_varlen  # type: ignore
except Exception:  # pragma: no cover - not on the development machine
    _flash_varlen = None

_SDPA = getattr(F, "scaled_dot_product_attention", None)

# Segments whose lengths are within this ratio of a group's longest share its padded batch.
GROUP_RATIO = 1.25
# At most this many score elements (segments x length^2) per group and head: bounds the memory
# of one batched attention.
GROUP_SCORES = 1 << 22
# Without a fused kernel (CPU, torch 1.13), causal attention runs by blocks of this many queries,
# each over the keys it may see (measured on this project's 2-core VM, 4 heads of 16: 250 ns per
# score at 128 tokens, 80 ns from 4K tokens; the whole masked square took 740 ns per score at 2K).
CAUSAL_BLOCK = 128


class _Group:
    """Segments of about one length: flattened token positions [m, L] (padding repeats a valid
    position) and which of them are real [m, L]."""

    def __init__(self, idx: torch.Tensor, valid: torch.Tensor):
        self.idx = idx
        self.valid = valid
        self.length = int(idx.shape[1])


def _runs(seg: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Segments of `seg` [rows, n] (runs of one non-zero id within a row): their flattened start,
    length, row and id."""
    rows, n = seg.shape
    flat = seg.reshape(-1).astype(np.int64)
    pos = np.arange(flat.size)
    row = pos // max(n, 1)
    new = np.ones(flat.size, dtype=bool)
    if flat.size:
        new[1:] = (flat[1:] != flat[:-1]) | (row[1:] != row[:-1])
    starts = pos[new & (flat > 0)]
    # A run ends where the next one starts (or its row ends).
    all_starts = pos[new]
    ends = np.append(all_starts[1:], flat.size)
    ends = ends[(flat[all_starts] > 0)]
    return starts, ends - starts, starts // max(n, 1), flat[starts]


def _group(starts: np.ndarray, lengths: np.ndarray, device) -> List[_Group]:
    """Segments grouped by length, longest first."""
    order = np.argsort(-lengths, kind="stable")
    groups: List[_Group] = []
    k = 0
    while k < order.size:
        top = int(lengths[order[k]])
        members = [order[k]]
        k += 1
        while k < order.size and lengths[order[k]] * GROUP_RATIO >= top and \
                (len(members) + 1) * top * top <= GROUP_SCORES:
            members.append(order[k])
            k += 1
        m = np.asarray(members)
        ar = np.arange(top)
        ln = lengths[m][:, None]
        idx = starts[m][:, None] + np.minimum(ar[None, :], ln - 1)
        groups.append(_Group(torch.from_numpy(idx).to(device), torch.from_numpy(ar[None, :] < ln).to(device)))
    return groups


def _segments(batch, decoder: bool) -> List[_Group]:
    """The micro-batch's segments of one side, grouped (cached on the micro-batch's layout)."""
    def make():
        seg = batch._layout.native(decoder)["segment_ids"]
        starts, lengths, _, _ = _runs(np.asarray(seg))
        return _group(starts, lengths, batch._device)
    return batch._layout.cached(("segments", decoder), batch._device, make)


def _cross_segments(batch) -> List[Tuple[_Group, torch.Tensor, torch.Tensor]]:
    """Decoder segments grouped by (decoder length, encoder length), each with its sample's
    encoder positions [m, Le] and their validity."""
    def make():
        dec = np.asarray(batch._layout.native(True)["segment_ids"])
        enc = np.asarray(batch._layout.native(False)["segment_ids"])
        ds, dl, dr, did = _runs(dec)
        es, el, er, eid = _runs(enc)
        where = {(int(r), int(i)): (int(s), int(n)) for s, n, r, i in zip(es, el, er, eid)}
        pairs = [where[(int(r), int(i))] for r, i in zip(dr, did)]
        e_start = np.asarray([p[0] for p in pairs], dtype=np.int64)
        e_len = np.asarray([p[1] for p in pairs], dtype=np.int64)
        out = []
        order = np.lexsort((-e_len, -dl))
        k = 0
        while k < order.size:
            top_d, top_e = int(dl[order[k]]), int(e_len[order[k]])
            members = [order[k]]
            k += 1
            while k < order.size and dl[order[k]] * GROUP_RATIO >= top_d and \
                    (len(members) + 1) * top_d * max(top_e, int(e_len[order[k]])) <= GROUP_SCORES:
                top_e = max(top_e, int(e_len[order[k]]))
                members.append(order[k])
                k += 1
            m = np.asarray(members)
            ar_d, ar_e = np.arange(top_d), np.arange(top_e)
            q_idx = ds[m][:, None] + np.minimum(ar_d[None, :], dl[m][:, None] - 1)
            k_idx = e_start[m][:, None] + np.minimum(ar_e[None, :], e_len[m][:, None] - 1)
            g = _Group(torch.from_numpy(q_idx).to(batch._device),
                       torch.from_numpy(ar_d[None, :] < dl[m][:, None]).to(batch._device))
            out.append((g, torch.from_numpy(k_idx).to(batch._device),
                        torch.from_numpy(ar_e[None, :] < e_len[m][:, None]).to(batch._device)))
        return out
    return batch._layout.cached(("cross-segments",), batch._device, make)


def _causal_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int) -> torch.Tensor:
    """Causal attention without a fused kernel, by blocks of CAUSAL_BLOCK queries: each block's
    scores cover only the keys it may see (query i sees keys 0 .. offset + i), so about half the
    square is computed and stored, and each block's scores stay small (one square over a long
    segment ran several times slower per score than short ones: 015). The same values as the
    masked square, row by row."""
    n = q.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    outs = []
    for a in range(0, n, CAUSAL_BLOCK):
        e = min(n, a + CAUSAL_BLOCK)
        keys = offset + e
        scores = torch.matmul(q[..., a:e, :], k[..., :keys, :].transpose(-1, -2)) * scale
        if keys > offset + a + 1:  # (a block of one query at the diagonal sees every key it is given)
            see = torch.ones(e - a, keys, dtype=torch.bool, device=q.device).tril(diagonal=offset + a)
            scores = scores.masked_fill(~see, float("-inf"))
        outs.append(torch.matmul(torch.softmax(scores, dim=-1), v[..., :keys, :]))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
            causal: bool, offset: int = 0) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) under `mask` (True: may attend), or causal) v for [b, heads, n, d].
    Causal with `offset`: aligned bottom-right, query i sees keys 0 .. offset + i (a slice after
    `offset` kept keys; only without a mask)."""
    if offset:
        assert causal and mask is None and k.shape[-2] == q.shape[-2] + offset
    if _SDPA is not None:
        if mask is None and causal and not offset:
            return _SDPA(q, k, v, is_causal=True)
        if causal:
            tri = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril(diagonal=offset)
            mask = tri if mask is None else mask & tri
        return _SDPA(q, k, v, attn_mask=mask)
    if causal and mask is None:
        return _causal_blocks(q, k, v, offset)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        tri = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        mask = tri if mask is None else mask & tri
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def _flatten(x: torch.Tensor) -> torch.Tensor:
    """[rows, heads, n, d] as [rows * n, heads, d]."""
    rows, heads, n, d = x.shape
    return x.transpose(1, 2).reshape(rows * n, heads, d)


def _unflatten(x: torch.Tensor, rows: int, n: int) -> torch.Tensor:
    return x.view(rows, n, x.shape[1], x.shape[2]).transpose(1, 2)


def _grouped(q, k, v, groups, causal: bool, key_groups=None) -> torch.Tensor:
    """Grouped segment attention on flattened [N, heads, d] tensors: each group one batched
    attention; positions in no segment get zero."""
    out = q.new_zeros(q.shape)
    pos, vals = [], []
    for n, g in enumerate(groups):
        qi = q[g.idx].transpose(1, 2)  # [m, heads, L, d]
        if key_groups is None:
            kidx, kvalid = g.idx, g.valid
        else:
            kidx, kvalid = key_groups[n]
        ki, vi = k[kidx].transpose(1, 2), v[kidx].transpose(1, 2)
        # Causal self-attention never reaches the padding after a segment; other attention masks it.
        mask = None if causal and key_groups is None else kvalid[:, None, None, :]
        y = _attend(qi, ki, vi, mask, causal and key_groups is None).transpose(1, 2)  # [m, L, heads, d]
        pos.append(g.idx[g.valid])
        vals.append(y[g.valid])
    if not pos:
        return out
    return out.index_copy(0, torch.cat(pos), torch.cat(vals))


def _flash_ok(q: torch.Tensor) -> bool:
    """Whether flash-attn's varlen kernel takes q: a CUDA tensor in fp16 or bf16."""
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


def kernel(device, dtype: torch.dtype) -> str:
    """The attention kernel :func:`attention` runs for tensors of `dtype` on `device`, as packpipe's
    cost model names it: 'flash' (no stored scores: flash-attn's varlen kernel, or PyTorch's fused
    scaled_dot_product_attention on a GPU) or 'eager' (the scores materialised: the explicit
    matmul-softmax on CPU and on torch 1.13)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return "eager"
    if _flash_varlen is not None and dtype in (torch.float16, torch.bfloat16):
        return "flash"
    return "flash" if _SDPA is not None else "eager"


def _sliced(q, k, v, batch, sl, causal: bool) -> torch.Tensor:
    """Self-attention of a packed micro-batch holding slices (015): entries that continue keep their
    keys and values (one attention call of the stage = one layer), entries after a cut attend to the
    kept prefix of their sample and then to their own tokens, causally aligned bottom-right; the other
    entries as `attention` computes them."""
    if not causal:
        raise ValueError(f"micro-batch {batch.index}: slices are for causal (decoder-only) self-attention")
    rows, heads, n, d = q.shape
    call = sl.next_call()
    qf, kf, vf = _flatten(q), _flatten(k), _flatten(v)
    b = sl.bounds
    special = [i for i in range(len(sl.samples)) if sl.prefix[i] > 0]
    for i in range(len(sl.samples)):
        if sl.continues[i]:
            sl.keep(i, call, kf[b[i]:b[i + 1]], vf[b[i]:b[i + 1]])
    if _flash_varlen is not None and _flash_ok(q):
        # One kernel call: each entry's keys are its kept prefix's, then its own (cu_seqlens_k).
        ks, vs = [], []
        for i in range(len(sl.samples)):
            if sl.prefix[i] > 0:
                pk, pv = sl.prefix_kv(i, call)
                ks.append(pk)
                vs.append(pv)
            ks.append(kf[b[i]:b[i + 1]])
            vs.append(vf[b[i]:b[i + 1]])
        cu_q = batch.cu_seqlens.to(torch.int32)
        cu_k = batch.cu_seqlens_k.to(torch.int32)
        y = _flash_varlen(qf, torch.cat(ks), torch.cat(vs), cu_q, cu_k, batch.max_seqlen, batch.max_seqlen_k,
                          causal=True)
        return _unflatten(y, rows, n)
    # CPU (and GPUs without flash-attn): the entries without a prefix grouped as `attention` groups
    # them, each entry after a cut one attention over its prefix and itself.
    plain = [i for i in range(len(sl.samples)) if sl.prefix[i] == 0]
    starts = np.asarray([b[i] for i in plain], dtype=np.int64)
    lengths = np.asarray([b[i + 1] - b[i] for i in plain], dtype=np.int64)
    out = _grouped(qf, kf, vf, _group(starts, lengths, q.device), causal) if plain else qf.new_zeros(qf.shape)
    if not special:
        return _unflatten(out, rows, n)
    pos, vals = [], []
    for i in special:
        pk, pv = sl.prefix_kv(i, call)
        kk = torch.cat([pk, kf[b[i]:b[i + 1]]])
        vv = torch.cat([pv, vf[b[i]:b[i + 1]]])
        qi = qf[b[i]:b[i + 1]].transpose(0, 1)[None]  # [1, heads, l, d]
        y = _attend(qi, kk.transpose(0, 1)[None], vv.transpose(0, 1)[None], None, True,
                    offset=kk.shape[0] - qi.shape[2])
        pos.append(torch.arange(b[i], b[i + 1], device=q.device))
        vals.append(y[0].transpose(0, 1))
    out = out.index_copy(0, torch.cat(pos), torch.cat(vals))
    return _unflatten(out, rows, n)


def _check_qkv(where: str, q, k, v, batch, q_side: str, k_side: str) -> None:
    """q, k, v against each other and against the micro-batch: [rows, heads, seq, head_dim] with the
    micro-batch's rows and its `q_side` / `k_side` length ("seq" or "dec_seq"), k and v alike, q's
    heads a multiple of k's (grouped-query attention). A ValueError names the tensor, what was
    expected and what was found (a wrong shape gave zeros past the micro-batch, a cut key, or an
    IndexError). Objects without rows and seq (MaskedBatch) are checked for consistency only."""
    if batch is None or not hasattr(batch, "layout"):
        raise TypeError(f"{where}: batch must be a packpipe.torch.MicroBatch (the micro-batch the stage module was "
                        f"called with), found {type(batch).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            found = f"a {t.dim()}-D tensor {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{where}: {name} must be a 4-D tensor [rows, heads, seq, head_dim], found {found}")
    rows = getattr(batch, "rows", None)
    q_len, k_len = getattr(batch, q_side, None), getattr(batch, k_side, None)
    for name, t, n in (("q", q, q_len), ("k", k, k_len), ("v", v, k_len)):
        if rows is not None and n is not None and (t.shape[0] != rows or t.shape[2] != n):
            raise ValueError(f"{where}: {name} is {tuple(t.shape)}; micro-batch {getattr(batch, 'index', '?')} has "
                             f"{rows} rows of {n} tokens ({k_side if name != 'q' else q_side}): expected "
                             f"[{rows}, heads, {n}, head_dim]")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3] or q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"{where}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected k and v of one "
                         f"shape, with q's rows and head_dim, and q's heads a multiple of theirs")
    if q_side == k_side and k.shape[2] != q.shape[2]:
        raise ValueError(f"{where}: q has {q.shape[2]} positions and k {k.shape[2]}: self-attention expects the same")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch, *, causal: bool,
              decoder: bool = False) -> torch.Tensor:
    """Self-attention of micro-batch `batch` in its layout; q, k, v [rows, heads, seq, head_dim]
    (decoder=True: the decoder side of an encoder-decoder micro-batch). Returns the same shape.
    A micro-batch holding slices of long samples (docs/design/015-long-context.md; the runners
    attach them) attends each slice to the kept keys and values of its sample's earlier slices:
    call attention once per layer, in the same order in every micro-batch of a stage."""
    causal = _check.boolean("attention", "causal", causal)
    decoder = _check.boolean("attention", "decoder", decoder)
    side = "dec_seq" if decoder else "seq"
    _check_qkv("attention", q, k, v, batch, side, side)
    rows, heads, n, d = q.shape
    layout = getattr(batch, "layout", "padded")
    sl = getattr(batch, "_slices", None)
    if sl is not None and layout == "packed" and not decoder:
        return _sliced(q, k, v, batch, sl, causal)
    if layout == "packed":
        if _flash_varlen is not None and _flash_ok(q):
            cu = (batch.decoder_cu_seqlens if decoder else batch.cu_seqlens).to(torch.int32)
            mx = batch.decoder_max_seqlen if decoder else batch.max_seqlen
            y = _flash_varlen(_flatten(q), _flatten(k), _flatten(v), cu, cu, mx, mx, causal=causal)
            return _unflatten(y, rows, n)
        y = _grouped(_flatten(q), _flatten(k), _flatten(v), _segments(batch, decoder), causal)
        return _unflatten(y, rows, n)
    if layout == "packed-mask":
        return _attend(q, k, v, batch.attention_mask(causal=causal, decoder=decoder), False)
    # padded: every row dense, keys on padding masked (causal attention never reaches them)
    seg = batch.decoder_segment_ids if decoder else batch.segment_ids
    mask = None if causal else (seg > 0)[:, None, None, :]
    return _attend(q, k, v, mask, causal)


def cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch) -> torch.Tensor:
    """Decoder-to-encoder attention: q [rows, heads, dec_seq, d] from the decoder rows, k and v
    [rows, heads, seq, d] from the encoder rows; each decoder sample attends to its own encoder
    sample. Returns q's shape."""
    _check_qkv("cross_attention", q, k, v, batch, "dec_seq", "seq")
    rows, heads, n, d = q.shape
    layout = getattr(batch, "layout", "padded")
    if layout == "packed":
        groups = _cross_segments(batch)
        y = _grouped(_flatten(q), _flatten(k), _flatten(v), [g for g, _, _ in groups], False,
                     [(ki, kv) for _, ki, kv in groups])
        return _unflatten(y, rows, n)
    return _attend(q, k, v, batch.cross_attention_mask(), False)

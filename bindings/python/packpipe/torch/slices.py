"""Keys and values of sliced samples, kept between the micro-batches of one pipeline rank.

A sliced sample (docs/design/015-long-context.md) is cut into consecutive micro-batch entries. Its
slice j attends to its own tokens and to every token of slices 0..j-1: on every stage, each attention
call of slice j needs the keys and values the same call of the earlier slices produced. The stage
handler keeps them here:

* a slice that continues (a later slice exists) *keeps* its keys and values per attention call: the
  tensors of its own graph (roots of its backward) and a leaf copy that the later slices attend to;
* a later slice concatenates the leaves of the slices before it in front of its own keys and values
  (flash-attn varlen's ``cu_seqlens_k``; causal aligned bottom-right);
* backward runs in reverse slice order (the plan's streams keep it), so when slice j goes back, the
  leaves it kept already hold the gradients of every later slice: its backward propagates them
  together with its output gradient (:meth:`SliceKV.roots`), and the parameters receive the gradients
  of the unsliced sample.

Full recompute re-runs a slice's forward before its backward: its keys are kept again as roots, its
leaves (which the later slices used) stay. The store holds one iteration; ``clear()`` at its start.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import torch


class _Kept:
    __slots__ = ("leaf_k", "leaf_v", "root_k", "root_v")

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.root_k, self.root_v = k, v
        self.leaf_k = k.detach().requires_grad_(k.is_floating_point())
        self.leaf_v = v.detach().requires_grad_(v.is_floating_point())


class SliceForward:
    """One forward of one (micro-batch, stage): its entries' slice facts and the attention-call count
    (the i-th attention call of a stage's forward is the same layer in every slice's forward)."""

    def __init__(self, store: "SliceKV", mb: int, stage: int, samples: List[int], prefix: np.ndarray,
                 continues: np.ndarray, bounds: List[int]):
        self.store = store
        self.mb = mb
        self.stage = stage
        self.samples = samples
        self.prefix = [int(p) for p in prefix]
        self.continues = [bool(c) for c in continues]
        self.bounds = bounds  # the entries' token bounds in the packed row (cu_seqlens, without padding)
        self.calls = 0

    def sliced(self) -> bool:
        return any(self.continues) or any(p > 0 for p in self.prefix)

    def next_call(self) -> int:
        c = self.calls
        self.calls += 1
        return c

    def keep(self, entry: int, call: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Entry `entry` continues: keep its keys and values [l, heads, d] of attention call `call`."""
        key = (self.samples[entry], self.stage, call, self.prefix[entry])
        kept = self.store._kept.get(key)
        if kept is None:
            self.store._kept[key] = _Kept(k, v)
            self.store._made.setdefault((self.mb, self.stage), []).append(key)
        else:  # recompute: the same values again, now with a graph; the leaves later slices used stay
            kept.root_k, kept.root_v = k, v

    def prefix_kv(self, entry: int, call: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The kept keys and values of the slices before entry `entry`, in order, as [p, heads, d]."""
        s, p = self.samples[entry], self.prefix[entry]
        mine = sorted((q, kept) for (smp, st, c, q), kept in self.store._kept.items()
                      if smp == s and st == self.stage and c == call and q < p)
        if not mine or sum(kept.leaf_k.shape[0] for _, kept in mine) != p:
            raise RuntimeError(f"micro-batch {self.mb}, stage {self.stage}: sample {s}'s slice from token {p} finds "
                               f"{sum(kept.leaf_k.shape[0] for _, kept in mine)} kept tokens of attention call "
                               f"{call}; its earlier slices must run forward on this stage first, with the same "
                               "attention calls")
        used = self.store._used.setdefault((self.mb, self.stage), [])
        for _, kept in mine:
            for leaf in (kept.leaf_k, kept.leaf_v):
                if not any(leaf is u for u in used):  # a recompute asks again
                    used.append(leaf)
        return (torch.cat([kept.leaf_k for _, kept in mine]), torch.cat([kept.leaf_v for _, kept in mine]))


class SliceKV:
    """The kept keys and values of one pipeline rank (one per stage handler)."""

    def __init__(self):
        self._kept: Dict[tuple, _Kept] = {}
        self._made: Dict[Tuple[int, int], List[tuple]] = {}
        self._used: Dict[Tuple[int, int], List[torch.Tensor]] = {}

    def clear(self) -> None:
        self._kept.clear()
        self._made.clear()
        self._used.clear()

    def forward(self, batch, mb: int, stage: int) -> Optional[SliceForward]:
        """The slice context of (mb, stage)'s forward, attached to `batch` (None when the micro-batch
        holds no slice)."""
        lay = batch._layout
        if lay.encdec or lay.layout != "packed":
            return None
        native = lay.native(False)
        prefix, continues = native.get("prefix"), native.get("continues")
        if prefix is None or (not np.any(prefix) and not np.any(continues)):
            return None
        samples = [int(s) for s in lay.info["samples"]]
        cu = [int(x) for x in native["cu_seqlens"]]
        fwd = SliceForward(self, mb, stage, samples, prefix, continues, cu[:len(samples) + 1])
        batch._slices = fwd
        return fwd

    def roots(self, mb: int, stage: int) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """The keys and values (mb, stage) kept for later slices, with the gradients those slices'
        backwards gave their leaves: extra roots of its backward."""
        outs, grads = [], []
        for key in self._made.get((mb, stage), []):
            kept = self._kept[key]
            for root, leaf in ((kept.root_k, kept.leaf_k), (kept.root_v, kept.leaf_v)):
                if leaf.grad is not None and root.requires_grad:
                    outs.append(root)
                    grads.append(leaf.grad)
        return outs, grads

    def used_leaves(self, mb: int, stage: int) -> List[torch.Tensor]:
        """The kept leaves (mb, stage)'s forward attended to (a split backward's inputs)."""
        return self._used.get((mb, stage), [])

    def release(self, mb: int, stage: int) -> None:
        """(mb, stage)'s backward is done: forget what it kept (every later slice went back before it)."""
        for key in self._made.pop((mb, stage), []):
            self._kept.pop(key, None)
        self._used.pop((mb, stage), None)


def plan_has_slices(plan) -> bool:
    """Whether any micro-batch of `plan` holds a slice after a first one."""
    return any(len(m.get("prev", [])) for m in plan.microbatches)

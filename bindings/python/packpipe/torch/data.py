"""The per-rank loader: from packpipe plans to ready torch tensors.

:class:`PlanLoader` yields, for one (pipeline rank, replica), every iteration of an epoch: this
replica's plan and, for every micro-batch a stage of this rank loads, its tensors. Planning runs on
every rank deterministically through the library's epoch planner (``packpipe.plan_epoch``), or
plans are read from a plan file by (iteration, replica). The native loader
(``packpipe.RankLoader``) plans and assembles ahead on background threads, so both overlap with
training.

:class:`MicroBatch` is what a stage module sees: the loaded tensors (``input_ids``, ``labels``,
``decoder_input_ids``, ``decoder_labels``) on the stages that load them, and on every stage the
row layout of the micro-batch (positions restarting per sample, segment ids, ``cu_seqlens``,
``max_seqlen``, block-diagonal masks), which follows from the plan alone.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

import packpipe
from packpipe import _check

IGNORE_INDEX = -100


class MicroBatch:
    """One micro-batch as a stage module sees it (``packpipe.torch.MicroBatch``; not to be confused
    with ``packpipe.MicroBatch``, the planner's record of a micro-batch's samples and costs).

    Loaded tensors (int64 [rows, seq] or [rows, dec_seq]): ``input_ids``, ``labels``,
    ``decoder_input_ids``, ``decoder_labels``, on the stages whose plan entry loads them (the
    embedding's stage loads the inputs, the head's the labels; a one-stage plan loads all). Reading
    one that this micro-batch does not hold raises AttributeError naming the stages that load it
    (``loaded`` is the dict of what it holds; ``getattr(batch, "labels", None)`` tests for one).
    ``labels`` are shifted (``labels[t]`` is the token after ``input_ids[t]``) unless the loader was
    made with ``labels="unshifted"`` (``labels_shifted`` False: Hugging Face's convention, the
    model shifts); positions without loss hold ``ignore_index`` (-100 unless the loader was given
    another; packpipe's losses read it from the micro-batch). Layout (every stage): ``layout`` ("padded": one sample a row; "packed": every
    sample in one row, attended apart with varlen attention; "packed-mask": rows under a block
    mask), ``position_ids`` and ``segment_ids`` [rows, seq] (segments 1, 2, ... per sample within a
    row, 0 on padding), ``cu_seqlens`` (int32 sample boundaries over the flattened rows, starting at
    0, each row's padding a segment of its own; a packed row has none: flash-attn's and Megatron
    THD's ``cu_seqlens``), ``max_seqlen``, HF's names for them (``cu_seq_lens_q/k``,
    ``max_length_q/k``); the ``decoder_*`` equivalents for encoder-decoder plans.
    ``packpipe.torch.attention`` computes attention in the layout. ``lengths`` (and
    ``target_lengths``) are the samples' lengths as trained (after any truncation), in row order.
    """

    def __init__(self, layout: "_Layout", device, loaded: Optional[Dict[str, torch.Tensor]] = None,
                 stage: Optional[int] = None, labels_shifted: bool = True, ignore_index: int = IGNORE_INDEX):
        labels_shifted = _check.boolean("MicroBatch", "labels_shifted", labels_shifted)
        #: the label of positions without loss (PlanLoader(ignore_index=)): packpipe's losses read it
        self.ignore_index: int = _check.integer("MicroBatch", "ignore_index", ignore_index, *_check.INT64)
        self._layout = layout
        self._device = device
        self._loaded = loaded or {}
        self._stage = stage
        self.index: int = layout.mb
        self.layout: str = layout.layout
        self.rows: int = layout.rows
        self.seq: int = layout.seq
        self.dec_seq: int = layout.dec_seq
        self.loss_tokens: int = layout.loss_tokens
        self.labels_shifted: bool = labels_shifted

    @property
    def encoder_decoder(self) -> bool:
        """Whether the plan is an encoder-decoder model's (the loss is over decoder_labels)."""
        return self._layout.encdec

    def _get(self, name):
        t = self._loaded.get(name)
        if t is None:
            raise AttributeError(self._layout.not_loaded(name, self._stage, sorted(self._loaded)))
        return t

    @property
    def input_ids(self) -> torch.Tensor:
        return self._get("input_ids")

    @property
    def labels(self) -> torch.Tensor:
        return self._get("labels")

    @property
    def decoder_input_ids(self) -> torch.Tensor:
        return self._get("decoder_input_ids")

    @property
    def decoder_labels(self) -> torch.Tensor:
        return self._get("decoder_labels")

    @property
    def loaded(self) -> Dict[str, torch.Tensor]:
        """The tensors this micro-batch holds on this stage (its LOAD_MB's), by name."""
        return dict(self._loaded)

    def _with_labels(self, name: str, labels: torch.Tensor, loss_tokens: int) -> "MicroBatch":
        """A copy whose `name` tensor is `labels` and that counts `loss_tokens` (the loss check's probe)."""
        other = MicroBatch(self._layout, self._device, dict(self._loaded, **{name: labels}), self._stage,
                           self.labels_shifted, self.ignore_index)
        other.loss_tokens = loss_tokens
        return other

    @property
    def lengths(self) -> np.ndarray:
        """Each sample's trained length (decoder-only: the whole sample; encoder-decoder: its input), in
        row order, after any truncation (``PlannedIteration.input_lengths`` are the lengths before)."""
        return np.asarray(self._layout.info["lengths"], dtype=np.int64)

    @property
    def target_lengths(self) -> np.ndarray:
        """Each sample's trained target length (encoder-decoder plans; empty for decoder-only)."""
        return np.asarray(self._layout.info["target_lengths"], dtype=np.int64)

    @property
    def position_ids(self) -> torch.Tensor:
        return self._layout.tensor("position_ids", False, self._device)

    @property
    def segment_ids(self) -> torch.Tensor:
        return self._layout.tensor("segment_ids", False, self._device)

    @property
    def cu_seqlens(self) -> torch.Tensor:
        return self._layout.tensor("cu_seqlens", False, self._device)

    @property
    def max_seqlen(self) -> int:
        return self._layout.max_seqlen(False)

    @property
    def cu_seqlens_k(self) -> torch.Tensor:
        """The keys' side of each query segment (flash-attn varlen's ``cu_seqlens_k``): a slice of a long
        sample attends to its kept prefix and then to its own tokens, prefix + length keys; without
        slices, ``cu_seqlens``."""
        return self._layout.tensor("cu_seqlens_k", False, self._device)

    @property
    def max_seqlen_k(self) -> int:
        """The longest keys' segment (``max_seqlen_k``): ``max_seqlen`` without slices."""
        return int(self._layout.native(False)["max_seqlen_k"])

    @property
    def prefix(self) -> np.ndarray:
        """Per sample entry, in row order: the tokens of its sample before it that it attends to (a
        slice after a cut; 0 otherwise). Positions continue from it."""
        return np.asarray(self._layout.native(False)["prefix"], dtype=np.int64)

    # flash-attn and HF transformers spell the self-attention boundaries of a packed row so
    # (DataCollatorWithFlattening's cu_seq_lens_q/k and max_length_q/k).
    @property
    def cu_seq_lens_q(self) -> torch.Tensor:
        return self.cu_seqlens

    @property
    def cu_seq_lens_k(self) -> torch.Tensor:
        return self.cu_seqlens_k

    @property
    def max_length_q(self) -> int:
        return self.max_seqlen

    @property
    def max_length_k(self) -> int:
        return self.max_seqlen_k

    @property
    def seq_idx(self) -> torch.Tensor:
        """HF's ``seq_idx`` (``DataCollatorWithFlattening(return_seq_idx=True)``): int32 ``[1, tokens]``,
        the 0-based index of the sample each token belongs to, over a packed micro-batch's one row (no
        padding). Padded and packed-mask micro-batches are not HF's flattened form: ValueError (plan
        with ``PartitionOptions(layouts=("packed",))`` for an HF varlen model)."""
        if self.layout != "packed" or self.rows != 1:
            raise ValueError(f"micro-batch {self.index}: seq_idx is HF's flattened form ([1, tokens], no padding): "
                             f"a packed micro-batch of one row; this one is {self.layout} with {self.rows} rows "
                             f"(plan with PartitionOptions(layouts=('packed',)) for an HF varlen model)")
        return self._layout.cached(("seq_idx",), self._device,
                                   lambda: (self.segment_ids - 1).to(torch.int32))

    @property
    def loss_mask(self) -> torch.Tensor:
        """Megatron's ``loss_mask``: float32 ``[rows, seq]``, 1 where ``labels`` (``decoder_labels`` for
        encoder-decoder micro-batches) carry loss, 0 elsewhere. Megatron's loss takes it beside labels
        that index the vocabulary everywhere: ``labels.clamp(min=0)`` (packpipe marks no-loss positions
        ``ignore_index``, -100 unless the loader was given another, as PyTorch's and HF's cross-entropy
        expect)."""
        labels = self.decoder_labels if self.encoder_decoder else self.labels
        return (labels != self.ignore_index).to(torch.float32)

    @property
    def decoder_position_ids(self) -> torch.Tensor:
        return self._layout.tensor("position_ids", True, self._device)

    @property
    def decoder_segment_ids(self) -> torch.Tensor:
        return self._layout.tensor("segment_ids", True, self._device)

    @property
    def decoder_cu_seqlens(self) -> torch.Tensor:
        return self._layout.tensor("cu_seqlens", True, self._device)

    @property
    def decoder_max_seqlen(self) -> int:
        return self._layout.max_seqlen(True)

    def attention_mask(self, causal: bool = True, decoder: bool = False) -> torch.Tensor:
        """Boolean [rows, 1, n, n] (True: may attend): within a sample only, and causal if asked.
        A padding position attends to itself only, so no softmax row is empty."""
        causal = _check.boolean("MicroBatch.attention_mask", "causal", causal)
        decoder = _check.boolean("MicroBatch.attention_mask", "decoder", decoder)
        key = ("mask", causal, decoder)
        return self._layout.cached(key, self._device, lambda: _self_mask(
            self._layout.tensor("segment_ids", decoder, self._device), causal))

    def cross_attention_mask(self) -> torch.Tensor:
        """Boolean [rows, 1, dec_seq, seq]: each decoder position attends to its own sample's encoder
        positions (padding rows attend to every encoder position; they carry no loss)."""
        return self._layout.cached(("cross",), self._device, lambda: _cross_mask(
            self._layout.tensor("segment_ids", True, self._device),
            self._layout.tensor("segment_ids", False, self._device)))

    def split_boundary(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """A decoder stage's boundary tensor [rows, dec_seq + seq, hidden] as (decoder hidden states,
        encoder output)."""
        if x is None or x.dim() != 3 or x.shape[1] != self.dec_seq + self.seq:
            raise ValueError(f"micro-batch {self.index}: a decoder boundary tensor is [rows, {self.dec_seq} + "
                             f"{self.seq}, hidden], found {None if x is None else tuple(x.shape)}")
        return x[:, :self.dec_seq], x[:, self.dec_seq:]

    @staticmethod
    def join_boundary(decoder_hidden: torch.Tensor, encoder_output: torch.Tensor) -> torch.Tensor:
        """The boundary tensor of decoder stages: decoder hidden states, then the encoder output."""
        return torch.cat([decoder_hidden, encoder_output], dim=1)


def _self_mask(seg: torch.Tensor, causal: bool) -> torch.Tensor:
    n = seg.shape[1]
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] > 0)
    if causal:
        same &= torch.ones(n, n, dtype=torch.bool, device=seg.device).tril()
    same |= torch.eye(n, dtype=torch.bool, device=seg.device)[None]
    return same[:, None]


def _cross_mask(dec_seg: torch.Tensor, enc_seg: torch.Tensor) -> torch.Tensor:
    m = (dec_seg[:, :, None] == enc_seg[:, None, :]) & (dec_seg[:, :, None] > 0)
    m |= (dec_seg == 0)[:, :, None]
    return m[:, None]


class _Layout:
    """The layout of one micro-batch of a plan, computed on first use and kept per device."""

    def __init__(self, plan: packpipe.Plan, mb: int, encdec: bool):
        info = plan.microbatches[mb]
        self.plan = plan
        self.mb = mb
        self.encdec = encdec
        self.layout = str(info.get("layout", "packed-mask" if len(info["row_offsets"]) else "padded"))
        self.rows = int(info["rows"])
        self.seq = int(info["padded_len"])
        self.dec_seq = int(info["padded_dec_len"])
        self.loss_tokens = int(info.get("loss_tokens", 0))
        self.info = info
        self._native: Dict[bool, Dict[str, Any]] = {}
        self._cache: Dict[Any, torch.Tensor] = {}

    def __repr__(self) -> str:
        sliced = sum(1 for p in self.native(False).get("prefix", []) if p) if not self.encdec else 0
        return (f"Layout(iteration {self.plan.iteration}, micro-batch {self.mb}: {self.layout}, {self.rows} row"
                f"{'s' if self.rows != 1 else ''} x {self.seq} tokens"
                + (f" (decoder {self.dec_seq})" if self.encdec else "")
                + f", {len(self.info['samples'])} samples, {self.loss_tokens} loss tokens"
                + (f", {sliced} continuing a slice" if sliced else "") + ")")

    def not_loaded(self, name: str, stage: Optional[int], held: List[str]) -> str:
        """Why a MicroBatch has no `name` tensor: which stages load it, if any."""
        where = f"micro-batch {self.mb}" + (f" on stage {stage}" if stage is not None else "")
        loading = [v for v, spec in enumerate(self.plan.stages) if name in spec["loads"]]
        if not loading:
            kind = "decoder-only" if not self.encdec else "encoder-decoder"
            return (f"{where}: a {kind} plan loads no {name} (its stages load "
                    f"{sorted({n for spec in self.plan.stages for n in spec['loads']})})")
        return (f"{where}: {name} is loaded on stage{'s' if len(loading) > 1 else ''} "
                f"{', '.join(map(str, loading))}, not here (this micro-batch holds {held or 'no loaded tensor'}; "
                f"MicroBatch.loaded is what it holds)")

    def native(self, decoder: bool) -> Dict[str, Any]:
        if decoder and not self.encdec:
            raise ValueError(f"micro-batch {self.mb}: a decoder-only plan has no decoder side")
        if decoder not in self._native:
            self._native[decoder] = packpipe.microbatch_layout(self.plan, self.mb, decoder=decoder)
        return self._native[decoder]

    def tensor(self, name: str, decoder: bool, device) -> torch.Tensor:
        key = (name, decoder, str(device))
        t = self._cache.get(key)
        if t is None:
            a = self.native(decoder)[name]
            t = torch.from_numpy(np.ascontiguousarray(a).astype(np.int32 if name.startswith("cu_seqlens") else np.int64))
            t = t.to(device)
            self._cache[key] = t
        return t

    def max_seqlen(self, decoder: bool) -> int:
        return int(self.native(decoder)["max_seqlen"])

    def cached(self, key, device, make):
        k = (key, str(device))
        t = self._cache.get(k)
        if t is None:
            t = make()
            self._cache[k] = t
        return t


def _without_slices(where: str, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """plan_epoch's keywords for labels="unshifted": slices off (a slice's last label is the next
    slice's first token, which labels aligned with the inputs cannot hold); a plan that must slice
    (method "slicing", oversize "slice") is refused, naming the setting."""
    import copy
    opts = kwargs.get("options")
    if opts is None:
        opts = packpipe.PartitionOptions()
    elif not isinstance(opts, packpipe.PartitionOptions):
        return kwargs  # plan_epoch names the wrong type
    asked = [f"{k}={v!r}" for k, v in (("method", opts.method), ("oversize", opts.oversize)) if v == "slicing" or v == "slice"]
    if asked:
        raise ValueError(f"{where}: labels='unshifted' cannot carry the label of a slice's last token (the next slice's "
                         f"first token, in another micro-batch), and the options ask for slices ({', '.join(asked)}): "
                         f"load labels='shifted', or plan without slices")
    if opts.slicing != "off" or not opts.slices_refused:
        opts = copy.copy(opts)
        opts.slicing = "off"
        # (so that a sample too long for one micro-batch is refused with this reason, not offered slices)
        opts.slices_refused = ("cannot carry the label of a slice's last token under labels='unshifted' (load "
                               "labels='shifted' to allow them)")
        kwargs = dict(kwargs, options=opts)
    return kwargs


def _unshifted(labels: torch.Tensor, positions: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Labels aligned with the inputs, as Hugging Face causal LMs take them: the shifted labels moved
    one position right within each row, ignore_index at each sample's first position (position 0)
    and on padding, so a model that shifts them back never crosses a sample's boundary."""
    out = torch.full_like(labels, ignore_index)
    out[:, 1:] = labels[:, :-1]
    out[positions == 0] = ignore_index
    return out


class Iteration:
    """One iteration for one rank (``packpipe.torch.Iteration``, what PlanLoader yields): the
    replica's plan and the tensors of the micro-batches this rank loads. The planner's
    ``packpipe.PlannedIteration`` (plan_epoch) holds every replica's plans and figures;
    ``packpipe.RankIteration`` (RankLoader) is the native form this one wraps."""

    def __init__(self, native, encdec: bool, labels_shifted: bool = True, ignore_index: int = IGNORE_INDEX):
        encdec = _check.boolean("Iteration", "encdec", encdec)
        labels_shifted = _check.boolean("Iteration", "labels_shifted", labels_shifted)
        self._observer = None  # the loader's calibration: the runners hand it this step's result
        self.iteration: int = int(native.iteration)
        self.plan: packpipe.Plan = native.plan
        self._encdec = encdec
        self.labels_shifted = labels_shifted
        self.ignore_index = ignore_index
        self._loads: Dict[Tuple[int, int], Dict[str, torch.Tensor]] = {}
        with warnings.catch_warnings():
            # The arrays are read-only views of the loader's own memory, which nothing else uses:
            # sharing it is safe (torch warns about any read-only array).
            warnings.simplefilter("ignore", UserWarning)
            for lt in native.loads:
                self._loads[(int(lt.mb), int(lt.stage))] = {name: torch.from_numpy(a)
                                                           for name, a in lt.tensors.items()}
        self._layouts: Dict[int, _Layout] = {}
        if not labels_shifted:
            for (mb, _), tensors in self._loads.items():
                continues = None if encdec else self.layout(mb).native(False).get("continues")
                if continues is not None and np.any(continues):
                    raise ValueError(
                        f"iteration {self.iteration}, micro-batch {mb}: labels='unshifted' cannot carry the label of "
                        f"a slice's last token (the next slice's first token, in another micro-batch): a model that "
                        f"shifts the labels itself drops it. Load labels='shifted', or plan without slices "
                        f"(PartitionOptions(slicing='off'))")
                if "labels" in tensors:
                    tensors["labels"] = _unshifted(tensors["labels"],
                                                   self.layout(mb).tensor("position_ids", False, "cpu"), ignore_index)
        mbs = self.plan.microbatches
        self.tokens: int = sum(int(m["tokens"]) for m in mbs)
        self.loss_tokens: int = sum(int(m.get("loss_tokens", 0)) for m in mbs)
        # (a sample cut into slices sits in several micro-batches: it is one sample)
        self.samples: int = len({int(x) for m in mbs for x in m["samples"]})

    @property
    def predicted_ms(self) -> float:
        """The plan's simulated iteration time (the cost model's units)."""
        return float(self.plan.makespan_ms)

    @property
    def global_loss_tokens(self) -> int:
        """Loss tokens of the whole global batch (every replica): what each micro-batch's summed loss
        is divided by, so that the replicas' gradients add up to the batch's."""
        return int(self.plan.global_loss_tokens)

    def loaded(self, mb: int, stage: int) -> Dict[str, torch.Tensor]:
        """The CPU tensors of (micro-batch, stage)'s LOAD_MB (KeyError if this rank does not load it)."""
        try:
            return self._loads[(mb, stage)]
        except KeyError:
            raise KeyError(f"iteration {self.iteration}: this loader has no inputs of micro-batch {mb} stage {stage} "
                           f"(it assembles the loads of its rank only; rank=None assembles every rank's)") from None

    def layout(self, mb: int) -> _Layout:
        lay = self._layouts.get(mb)
        if lay is None:
            if not 0 <= mb < len(self.plan.microbatches):
                raise IndexError(f"iteration {self.iteration}: micro-batch {mb} of {len(self.plan.microbatches)}")
            lay = self._layouts[mb] = _Layout(self.plan, mb, self._encdec)
        return lay

    def microbatch(self, mb: int, stage: Optional[int] = None, device="cpu",
                   loaded: Optional[Dict[str, torch.Tensor]] = None) -> MicroBatch:
        """The MicroBatch a stage module sees, its layout on `device`: with `loaded`, those tensors;
        with a `stage`, what this rank loads for (mb, stage) (KeyError if it loads nothing there);
        with neither, every tensor this rank loads for `mb` over all its stages (a one-stage plan, or
        rank=None: input_ids, labels and all; none on a rank that loads nothing of mb's, whose
        MicroBatch then raises AttributeError naming the stages that load a tensor asked for)."""
        lay = self.layout(mb)
        if loaded is None:
            if stage is not None:
                loaded = {k: v.to(device) for k, v in self.loaded(mb, stage).items()}
            else:
                loaded = {}
                for s in [s for (m, s) in sorted(self._loads) if m == mb]:
                    loaded.update({k: v.to(device) for k, v in self._loads[(mb, s)].items()})
        return MicroBatch(lay, device, loaded, stage, self.labels_shifted, self.ignore_index)

    def microbatches(self, device="cpu") -> List[MicroBatch]:
        """Every micro-batch of this replica with every tensor this rank loads for it (microbatch(m)
        for each m): the micro-batches of one data-parallel replica to accumulate gradients over, in a
        one-stage plan (stages=1)."""
        return [self.microbatch(m, device=device) for m in range(len(self.plan.microbatches))]


_STATE_FIELDS = ("epoch", "next_iteration", "config", "calibration")  # what state_dict() returns


# What calibrate="auto" (or True) fits with: a couple of warm-up steps unmeasured, a handful
# measured, then one fit (the boundary) and calibrated plans from the next iteration on.
AUTO_CALIBRATION = {"warmup": 2, "fit_after": 6}


def _calibrate_settings(where: str, calibrate: Any, cost_model) -> Optional[Dict[str, Any]]:
    """The Calibrator settings of PlanLoader(calibrate=) (None: no calibration). calibrate takes 'auto',
    True, False (numpy bools too) or a dict of Calibrator settings; anything else (None, 1, 'yes') is
    refused naming them."""
    allowed = "calibrate must be 'auto', True, False or a dict of Calibrator settings"
    if isinstance(calibrate, str):
        if calibrate != "auto":
            raise ValueError(f"{where}: {allowed}, found {calibrate!r}")
        # A model already tuned to its machine (a calibration, or measured profiles) is kept.
        tuned = cost_model is None or isinstance(cost_model, packpipe.CalibratedCostModel) or \
            "profiled" in cost_model.describe()
        return None if tuned else dict(AUTO_CALIBRATION)
    if not isinstance(calibrate, dict):
        if not _check.is_boolean(calibrate):
            raise TypeError(f"{where}: {allowed}, found {type(calibrate).__name__} {calibrate!r}")
        if not calibrate:
            return None
    if cost_model is None:
        raise ValueError(f"{where}: calibrate={calibrate!r} needs a loader that plans (cost_model): a plan file's "
                         "plans are fixed")
    if not isinstance(calibrate, dict):
        return dict(AUTO_CALIBRATION)
    allowed_keys = {"fit_after", "refit_every", "warmup", "options", "save", "tp", "timeout_s", "inputs"}
    unknown = sorted(set(calibrate) - allowed_keys)
    if unknown:
        raise ValueError(f"{where}: calibrate: unknown Calibrator settings {unknown} (expected some of "
                         f"{sorted(allowed_keys)})")
    return {**AUTO_CALIBRATION, **calibrate}


def _is_encdec(plan: packpipe.Plan) -> bool:
    return any(s["decoder_layers"][1] > s["decoder_layers"][0] for s in plan.stages)


_TORCH_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


def _dtype_name(where: str, dtype: Any) -> str:
    """A plan dtype name from a name or a torch dtype (ValueError naming the choices otherwise)."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _TORCH_DTYPE_NAMES:
            raise ValueError(f"{where}: dtype {dtype} is not an activation dtype (one of "
                             f"{', '.join(str(d) for d in _TORCH_DTYPE_NAMES)})")
        return _TORCH_DTYPE_NAMES[dtype]
    if isinstance(dtype, str) and dtype in _TORCH_DTYPE_NAMES.values():
        return dtype
    raise ValueError(f"{where}: dtype must be a torch dtype or one of {', '.join(_TORCH_DTYPE_NAMES.values())}, "
                     f"found {dtype!r}")


def _world_size() -> int:
    """torch.distributed's world size (1 when it is not initialised)."""
    import torch.distributed as dist
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def distributed_ranks(where: str, pp: int, dp: int) -> Tuple[int, Optional[int]]:
    """(replica, pipeline rank) of this process in a pp x dp job with packpipe's rank layout (world
    rank = replica x pp + pipeline rank, as ProcessGroups.create): (0, None), every rank, when
    torch.distributed is not initialised or has one process; ValueError when its world size is not
    pp x dp."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return 0, None
    world = dist.get_world_size()
    if pp * dp != world:
        raise ValueError(f"{where}: torch.distributed has {world} ranks, but the plans are for {pp} pipeline ranks x "
                         f"{dp} replicas; plan for the job's shape (PipelineShape(stages=, dp=) with stages x dp = "
                         f"{world}) or give replica= and rank=")
    return divmod(dist.get_rank(), pp)


class PlanLoader:
    """An iterable over the iterations of an epoch for one pipeline rank of one replica.

    Either plans on every rank with the library's epoch planner (give ``cost_model`` and the
    ``plan_epoch`` settings: ``shape``, ``options``, ``global_batch_tokens`` or
    ``global_batch_samples``, ``seed``, ``loss``, ``schedule``, ...), or reads ``plan_file`` by
    (iteration, replica).

    Defaults for PyTorch: ``shape`` one stage and one replica per process of torch.distributed
    (``PipelineShape(stages=1, dp=world size)``: data parallelism; plan_epoch's own default is 4
    stages); ``dtype`` (the activations between stages) is the model's: give it (a
    torch dtype or 'fp32', 'bf16', ...) unless the cost model comes from
    :func:`packpipe.torch.cost_model`, which knows it; ``split_backward`` False (zero-bubble's split
    backward costs PyTorch more than the cost model charges), unless ``schedule`` or
    ``schedule_family`` names "zero-bubble"; ``replica`` and ``rank`` "auto": from
    torch.distributed's rank and the plans' shape (world rank = replica x stages + pipeline rank, as
    ProcessGroups.create), or rank None (every rank's loads: LocalPipeline, one process) when
    torch.distributed is not initialised. ``labels="unshifted"`` loads labels aligned with the
    inputs (Hugging Face's convention; the default "shifted": labels[t] is the token after
    input_ids[t]); it plans without slices (``slicing="off"``: a slice's last label is the next
    slice's first token, which a model that shifts the labels itself cannot see), refuses options
    that must slice, and refuses a plan file's iteration that holds a slice that continues.

    Epochs follow ``DistributedSampler``: ``for it in loader`` runs one pass over the current epoch;
    call ``set_epoch(e)`` (on every rank, with the same e) before each epoch. A second pass without
    it raises RuntimeError (a pass that ended is never repeated silently). ``len(loader)`` is the
    iterations of one pass. ``state_dict()`` / ``load_state_dict()`` carry the epoch and the next
    iteration: the next iteration after a resume is the one an uninterrupted run would have
    delivered. ``stages`` gives the virtual stages' layer ranges before the first iteration.
    """

    def __init__(self, dataset, *, cost_model=None, plan_file: Optional[str] = None, replica: Any = "auto",
                 rank: Any = "auto", epoch: int = 0, first_iteration: int = 0, iterations: int = 0,
                 depth: int = 2, ignore_index: int = IGNORE_INDEX, pad_id: int = 0, decoder_start_id: int = 0,
                 allow_incomplete: bool = False, calibrate: Any = "auto", labels: str = "shifted",
                 dtype: Any = None, split_backward: Optional[bool] = None, **plan_epoch_kwargs):
        where = "PlanLoader"
        if isinstance(dataset, (str, os.PathLike)):
            dataset = packpipe.MultiTaskDataset(_check.path(where, "dataset", dataset))
        _check.instance(where, "dataset", dataset, packpipe.MultiTaskDataset,
                        "a MultiTaskDataset, or the path of a manifest or a dataset prefix")
        if (cost_model is None) == (plan_file is None):
            raise ValueError("PlanLoader: give exactly one of cost_model (plan every iteration on every rank) or "
                             "plan_file (read the plans)")
        if cost_model is not None:
            _check.instance(where, "cost_model", cost_model, packpipe.CostModel)
        else:
            plan_file = _check.path(where, "plan_file", plan_file)
        # Planning settings go to packpipe.plan_epoch: its keywords, less what the loader sets itself.
        _check.keywords(where, plan_epoch_kwargs, packpipe.plan_epoch,
                        exclude=("cost_model", "dataset", "epoch", "first_iteration", "iterations", "depth", "encode",
                                 "dtype", "split_backward"))
        if plan_file is not None and (plan_epoch_kwargs or dtype is not None):
            given = sorted(plan_epoch_kwargs) + (["dtype"] if dtype is not None else [])
            raise ValueError(f"PlanLoader: planning settings {given} do not apply to a plan file")
        if split_backward is None:  # only where the zero-bubble schedules are asked for by name
            split_backward = "zero-bubble" in (plan_epoch_kwargs.get("schedule"), plan_epoch_kwargs.get("schedule_family"))
        _check.boolean(where, "split_backward", split_backward)
        self.labels = _check.one_of(where, "labels", labels, ("shifted", "unshifted"))
        if self.labels == "unshifted" and cost_model is not None:
            plan_epoch_kwargs = _without_slices(where, plan_epoch_kwargs)
        if cost_model is not None:
            if dtype is None:
                dtype = getattr(cost_model, "torch_dtype", None)
            if dtype is None and isinstance(cost_model, packpipe.CostModel):
                dtype = cost_model.model.get("dtype")  # a model file's "dtype"
            if dtype is None:
                raise ValueError("PlanLoader: dtype is required: the dtype of the activations between stages, the "
                                 "model's (e.g. dtype=torch.float32 or 'bf16'; next(model.parameters()).dtype); a cost "
                                 "model from packpipe.torch.cost_model(module, ...), or a model file with \"dtype\", "
                                 "supplies it")
            limit = getattr(cost_model, "max_positions", None)
            if limit is not None:  # the module's positions: the context length, and its ceiling
                given = plan_epoch_kwargs.get("max_seq_len")
                if given is None:
                    plan_epoch_kwargs = dict(plan_epoch_kwargs, max_seq_len=limit)
                elif isinstance(given, int) and not isinstance(given, bool) and not 0 < given <= limit:
                    raise ValueError(
                        f"{where}: max_seq_len {given} {'(no context length)' if given == 0 else ''} is beyond the "
                        f"model's {limit} positions ({cost_model.max_positions_from}): position ids past it would "
                        f"index outside the model; give max_seq_len of at most {limit}, or leave it out (the "
                        f"model's limit)".replace("  ", " "))
            plan_epoch_kwargs = dict(plan_epoch_kwargs, dtype=_dtype_name(where, dtype), split_backward=split_backward)
            if "shape" not in plan_epoch_kwargs:  # one stage, a replica per process (plan_epoch's default: 4 stages)
                plan_epoch_kwargs["shape"] = packpipe.PipelineShape(stages=1, dp=_world_size())
        self.dataset = dataset
        self.cost_model = cost_model
        self._base_cost_model = cost_model  # what the settings' fingerprint names (a calibration is saved beside)
        self._calibration: Optional[str] = None  # the calibration file's text the loader plans with, if any
        self.plan_file = plan_file
        self._kwargs = plan_epoch_kwargs
        if replica == "auto" or rank == "auto":
            pp, dp = self._job_shape()
            auto_replica, auto_rank = distributed_ranks(where, pp, dp)
            replica = auto_replica if replica == "auto" else replica
            rank = auto_rank if rank == "auto" else rank
        self.replica = _check.integer(where, "replica", replica, 0, _check.MAX_PIPELINE - 1)
        self.rank = None if rank is None else _check.integer(where, "rank", rank, 0, _check.MAX_PIPELINE - 1)
        self.epoch = _check.integer(where, "epoch", epoch, 0, _check.MAX_EPOCH)
        self._first = _check.integer(where, "first_iteration", first_iteration, 0, _check.MAX_COUNT)
        self.iterations = _check.integer(where, "iterations", iterations, 0, _check.MAX_COUNT)
        self.depth = _check.integer(where, "depth", depth, 1, _check.MAX_DEPTH)
        self._tokens = dict(ignore_index=_check.integer(where, "ignore_index", ignore_index, *_check.INT64),
                            pad_id=_check.integer(where, "pad_id", pad_id, 0, _check.INT64[1]),
                            decoder_start_id=_check.integer(where, "decoder_start_id", decoder_start_id, 0,
                                                            _check.INT64[1]))
        # a plan file whose planning run stopped early: refused unless True
        self._allow_incomplete = _check.boolean(where, "allow_incomplete", allow_incomplete)
        self._auto_settings = _calibrate_settings(where, calibrate, cost_model)
        self._auto = None  # the Calibrator of calibrate=, made at the first iteration delivered
        self._next = self._first  # the iteration the next __next__ delivers
        self._stop = self._first + self.iterations if self.iterations else None  # absolute end (None: the epoch's)
        self._done = False  # this epoch's pass has ended (a new pass needs set_epoch)
        self._native = None
        self._end: Optional[int] = None  # the iteration after a pass's last (known once a native loader opened)
        self._peeked = None  # a native iteration read ahead (stages), delivered next
        self._stage_table: Optional[Tuple[List[Dict[str, Any]], List[int]]] = None
        self._encdec: Optional[bool] = None
        # Opened now, so that a bad setting, plan file or rank fails here rather than at the first
        # iteration; it also starts planning and loading ahead while the trainer builds its model.
        self._open()

    def _job_shape(self) -> Tuple[int, int]:
        """(pipeline ranks, replicas) of the plans this loader delivers."""
        if self.plan_file is not None:
            reader = packpipe.PlanFileReader(self.plan_file)
            if len(reader) == 0:
                return 1, 1
            plan = reader[0]
            return int(plan.ranks), int(plan.dp)
        shape = self._kwargs["shape"]
        return int(shape.stages), int(shape.dp)

    # ---- configuration identity (a resume must use the same settings) ----
    def _config(self) -> str:
        """The job's settings, as a fingerprint: the same on every rank and replica of one job (a state
        saved on one rank restores on every other: where an epoch is, and the calibration, are the
        job's), different for anything that changes what is delivered."""
        d = {"plan_file": self.plan_file, "first": self._first,
             "stop": self._stop, "labels": self.labels,
             "tokens": self._tokens, "kwargs": {k: repr(v) for k, v in sorted(self._kwargs.items())},
             "cost_model": self._base_cost_model.describe() if self._base_cost_model is not None else None,
             # what is delivered: the manifest's identity (tasks, order, files, weights) and the plans'
             "dataset": self.dataset.fingerprint(),
             "plans": packpipe.PlanFileReader(self.plan_file).fingerprint() if self.plan_file is not None else None}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader is: its epoch, the next iteration it delivers, its settings' fingerprint,
        and the calibration it plans with (None: the cost model it was given). It is the job's: saved
        on rank 0, it restores on every rank and replica, each taking its own share."""
        return {"epoch": self.epoch, "next_iteration": self._next, "config": self._config(),
                "calibration": self._calibration}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume from state_dict(): the loader moves to state['epoch'] and delivers
        state['next_iteration'] next (a state saved at the end of an epoch's pass resumes there: call
        set_epoch for the next). A state that is not a state_dict() of a loader with the same
        settings is refused (ValueError naming the field; TypeError for a field of the wrong type:
        nothing is coerced)."""
        where = "PlanLoader.load_state_dict"
        if not isinstance(state, dict):
            raise TypeError(f"{where}: state must be the dict state_dict() returns, found {type(state).__name__}")
        missing = [k for k in _STATE_FIELDS if k not in state]
        unknown = sorted(str(k) for k in state if k not in _STATE_FIELDS)
        if missing or unknown:
            raise ValueError(f"{where}: state has fields {sorted(str(k) for k in state)}; expected "
                             f"{', '.join(_STATE_FIELDS)} (state_dict()'s)"
                             + (f": missing {', '.join(missing)}" if missing else "")
                             + (f": unknown {', '.join(unknown)}" if unknown else ""))
        config = state["config"]
        if not isinstance(config, str):
            raise TypeError(f"{where}: state['config'] must be a str (the settings' fingerprint), found "
                            f"{type(config).__name__} {config!r}"[:200])
        epoch = _check.integer(where, "state['epoch']", state["epoch"], 0, _check.MAX_EPOCH)
        nxt = _check.integer(where, "state['next_iteration']", state["next_iteration"], 0,
                             self._stop if self._stop is not None else _check.MAX_COUNT)
        calibration = state["calibration"]
        if calibration is not None and not isinstance(calibration, str):
            raise TypeError(f"{where}: state['calibration'] must be None or a str (a calibration file's text), "
                            f"found {type(calibration).__name__}")
        if config != self._config():
            raise ValueError(f"{where}: the state was saved by a loader with other settings "
                             f"(fingerprint {config}, this loader {self._config()})")
        if nxt < self._first:
            raise ValueError(f"{where}: state['next_iteration'] {nxt} is before this loader's first_iteration "
                             f"{self._first}")
        if calibration is not None and self.plan_file is not None:
            raise ValueError(f"{where}: the state has a calibration, but this loader reads a plan file")
        before = (self.epoch, self._end, self._next, self._done, self._calibration)
        if epoch != self.epoch:
            self._end = None
        self.epoch = epoch
        self._set_model(calibration or None, "the loader state's calibration")
        self._next = nxt
        try:
            end = self._pass_end()
            why = None if nxt <= end else f"iteration {end}; a state saved at the end of a pass says {end}"
        except ValueError as e:  # (the epoch's planner refuses a first iteration past its end)
            end, why = None, str(e)
        if why is not None:  # no state_dict() of this loader says that: refused, and the loader left as it was
            self.epoch, self._end, self._next, self._done, old_calibration = before
            self._set_model(old_calibration, "the loader's calibration")
            raise ValueError(f"{where}: state['next_iteration'] {nxt} is past the end of epoch {epoch}'s pass ({why})")
        self._done = nxt >= end

    def set_epoch(self, epoch: int) -> None:
        """Makes the next pass (``for it in loader``) run epoch `epoch`, from its first iteration, as
        ``DistributedSampler.set_epoch``: call it on every rank with the same epoch before each
        epoch. The same epoch again while its pass has not ended keeps the position (so a resumed
        loader continues where its state left off); after the pass ended it repeats the epoch."""
        epoch = _check.integer("PlanLoader.set_epoch", "epoch", epoch, 0, _check.MAX_EPOCH)
        if epoch == self.epoch and not self._done:
            return
        self.epoch = epoch
        self._next = self._first
        self._done = False
        self._end = None
        self._drop_native()

    def _drop_native(self) -> None:
        self._native = None
        self._peeked = None

    def _set_model(self, calibration: Optional[str], what: str) -> None:
        """Plans with the base model calibrated by the calibration file text `calibration` (None:
        the base model); what planned ahead with the old model is dropped."""
        if calibration is None:
            self.cost_model = self._base_cost_model
        else:
            cal = packpipe.Calibration.from_json(calibration, what)
            self.cost_model = packpipe.CalibratedCostModel(self._base_cost_model, cal)
        self._calibration = calibration
        self._drop_native()

    @property
    def input_files(self) -> List[str]:
        """The files this loader reads (the manifest, every dataset file, the plan file): what no
        output of the job may be (packpipe.write_file_atomic's inputs)."""
        return packpipe.dataset_files(self.dataset) + ([self.plan_file] if self.plan_file is not None else [])

    @property
    def base_cost_model(self):
        """The cost model the loader was given (before any calibration)."""
        return self._base_cost_model

    @property
    def dtype(self) -> Optional[torch.dtype]:
        """The torch dtype of the activations the plans send between stages (None: a plan file's)."""
        name = self._kwargs.get("dtype")
        return None if name is None else {v: k for k, v in _TORCH_DTYPE_NAMES.items()}[name]

    def set_calibration(self, calibration_json: Optional[str]) -> None:
        """Plans from the next iteration not yet delivered on with the loader's cost model
        calibrated by `calibration_json` (a "packpipe-calibration" file's text; None: uncalibrated
        again). Every rank must switch at the same iteration for their plans to agree."""
        if self.plan_file is not None:
            raise ValueError("PlanLoader.set_calibration: this loader reads a plan file; it does not plan")
        self._set_model(calibration_json, "the calibration")

    def _open(self):
        count = self._stop - self._next if self._stop is not None else 0
        common = dict(replica=self.replica, rank=self.rank, depth=self.depth, **self._tokens)
        if self.plan_file is not None:
            self._native = packpipe.RankLoader(self.dataset, plan_file=self.plan_file, first_iteration=self._next,
                                               iterations=count, allow_incomplete=self._allow_incomplete, **common)
        else:
            planner = packpipe.plan_epoch(self.cost_model, self.dataset, epoch=self.epoch,
                                          first_iteration=self._next, iterations=count, **self._kwargs)
            self._native = packpipe.RankLoader(self.dataset, planner, **common)
        self._end = self._next + len(self._native)

    def _pass_end(self) -> int:
        """The iteration after the last one of a pass (the stop, or the epoch's end)."""
        if self._end is None:
            if self._stop is not None and self._next >= self._stop:
                return self._stop
            self._open()
        return self._end

    def __iter__(self) -> Iterator[Iteration]:
        if self._done:
            raise RuntimeError(
                f"PlanLoader: the pass over epoch {self.epoch} has ended; call loader.set_epoch({self.epoch + 1}) before "
                f"the next pass (as DistributedSampler.set_epoch, on every rank with the same epoch), or "
                f"set_epoch({self.epoch}) to repeat this one")
        return self

    def _native_next(self):
        if self._peeked is not None:
            native, self._peeked = self._peeked, None
            return native
        if self._native is None:
            self._open()
        return next(self._native)

    def __next__(self) -> Iteration:
        if self._done or (self._stop is not None and self._next >= self._stop):
            self._done = True
            raise StopIteration
        try:
            native = self._native_next()
        except StopIteration:
            self._done = True
            raise
        self._remember(native.plan)
        self._next = int(native.iteration) + 1
        it = Iteration(native, self._encdec, self.labels == "shifted", self._tokens["ignore_index"])
        if self._auto_settings is not None and self._calibration is None and self._auto is None:
            from packpipe.torch.calibrate import Calibrator  # (it imports this module)
            settings = self._auto_settings
            self._auto = Calibrator(self, **settings)
            self._auto_settings = settings
        if self._auto is not None and (self._auto._next_fit is not None):
            it._observer = self._auto.observe  # the runners hand it each step's result
        return it

    def _remember(self, plan) -> None:
        if self._encdec is None:
            self._encdec = _is_encdec(plan)
        if self._stage_table is None:
            self._stage_table = (plan.stages, list(plan.stage_rank))

    def _table(self) -> Tuple[List[Dict[str, Any]], List[int]]:
        if self._stage_table is None:
            if self._done:
                raise RuntimeError("PlanLoader.stages: the pass has ended before any iteration was delivered")
            try:
                self._peeked = self._native_next()
            except StopIteration:
                raise RuntimeError(f"PlanLoader.stages: epoch {self.epoch} has no iteration to read the stage layout "
                                   "from") from None
            self._remember(self._peeked.plan)
        return self._stage_table

    @property
    def stages(self) -> List[Dict[str, Any]]:
        """The virtual stages of every plan this loader delivers (``Plan.stages``: for each, ``layers``
        (decoder-only models; an alias of ``encoder_layers``), ``encoder_layers``,
        ``decoder_layers`` as [begin, end) ranges, ``embedding``, ``head`` and ``loads``), known
        before the first iteration: build the stage modules from it, then iterate. It is fixed by
        the settings (the shape and the model's layers)."""
        return [dict(s) for s in self._table()[0]]

    @property
    def stage_rank(self) -> List[int]:
        """The pipeline rank of each virtual stage (``Plan.stage_rank``)."""
        return list(self._table()[1])

    @property
    def my_stages(self) -> List[int]:
        """The virtual stages this loader's rank runs (every stage with rank=None)."""
        ranks = self.stage_rank
        return [v for v, r in enumerate(ranks) if self.rank is None or r == self.rank]

    @property
    def calibration_reports(self) -> List[Any]:
        """What the calibration of calibrate= did so far (packpipe.torch.CalibrationReport each)."""
        return list(self._auto.reports) if self._auto is not None else []

    def __len__(self) -> int:
        """The iterations of one pass over an epoch (from first_iteration; at most `iterations`)."""
        return self._pass_end() - self._first

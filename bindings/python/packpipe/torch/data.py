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
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

import packpipe

IGNORE_INDEX = -100


class MicroBatch:
    """One micro-batch as a stage module sees it.

    Loaded tensors (int64 [rows, seq] or [rows, dec_seq]; None on stages that do not load them):
    ``input_ids``, ``labels``, ``decoder_input_ids``, ``decoder_labels``. Layout (every stage):
    ``layout`` ("padded": one sample a row; "packed": every sample in one row, attended apart with
    varlen attention; "packed-mask": rows under a block mask), ``position_ids`` and ``segment_ids``
    [rows, seq] (segments 1, 2, ... per sample within a row, 0 on padding), ``cu_seqlens`` (int32
    sample boundaries over the flattened rows, starting at 0, each row's padding a segment of its
    own; a packed row has none: flash-attn's and Megatron THD's ``cu_seqlens``), ``max_seqlen``,
    HF's names for them (``cu_seq_lens_q/k``, ``max_length_q/k``); the ``decoder_*`` equivalents for
    encoder-decoder plans. ``packpipe.torch.attention`` computes attention in the layout.
    """

    def __init__(self, layout: "_Layout", device, loaded: Optional[Dict[str, torch.Tensor]] = None):
        self._layout = layout
        self._device = device
        self._loaded = loaded or {}
        self.index: int = layout.mb
        self.layout: str = layout.layout
        self.rows: int = layout.rows
        self.seq: int = layout.seq
        self.dec_seq: int = layout.dec_seq
        self.loss_tokens: int = layout.loss_tokens

    def _get(self, name):
        t = self._loaded.get(name)
        return t

    @property
    def input_ids(self) -> Optional[torch.Tensor]:
        return self._get("input_ids")

    @property
    def labels(self) -> Optional[torch.Tensor]:
        return self._get("labels")

    @property
    def decoder_input_ids(self) -> Optional[torch.Tensor]:
        return self._get("decoder_input_ids")

    @property
    def decoder_labels(self) -> Optional[torch.Tensor]:
        return self._get("decoder_labels")

    @property
    def loaded(self) -> Dict[str, torch.Tensor]:
        """The tensors this stage's LOAD_MB brought, by name."""
        return dict(self._loaded)

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

    # flash-attn and HF transformers spell the self-attention boundaries of a packed row so
    # (DataCollatorWithFlattening's cu_seq_lens_q/k and max_length_q/k).
    @property
    def cu_seq_lens_q(self) -> torch.Tensor:
        return self.cu_seqlens

    @property
    def cu_seq_lens_k(self) -> torch.Tensor:
        return self.cu_seqlens

    @property
    def max_length_q(self) -> int:
        return self.max_seqlen

    @property
    def max_length_k(self) -> int:
        return self.max_seqlen

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
        self._native: Dict[bool, Dict[str, Any]] = {}
        self._cache: Dict[Any, torch.Tensor] = {}

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
            t = torch.from_numpy(np.ascontiguousarray(a).astype(np.int64 if name != "cu_seqlens" else np.int32))
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


class Iteration:
    """One iteration for one rank: the replica's plan and the micro-batches this rank loads."""

    def __init__(self, native, encdec: bool):
        self.iteration: int = int(native.iteration)
        self.plan: packpipe.Plan = native.plan
        self._encdec = encdec
        self._loads: Dict[Tuple[int, int], Dict[str, torch.Tensor]] = {}
        with warnings.catch_warnings():
            # The arrays are read-only views of the loader's own memory, which nothing else uses:
            # sharing it is safe (torch warns about any read-only array).
            warnings.simplefilter("ignore", UserWarning)
            for lt in native.loads:
                self._loads[(int(lt.mb), int(lt.stage))] = {name: torch.from_numpy(a)
                                                           for name, a in lt.tensors.items()}
        self._layouts: Dict[int, _Layout] = {}
        mbs = self.plan.microbatches
        self.tokens: int = sum(int(m["tokens"]) for m in mbs)
        self.loss_tokens: int = sum(int(m.get("loss_tokens", 0)) for m in mbs)
        self.samples: int = sum(len(m["samples"]) for m in mbs)

    @property
    def predicted_ms(self) -> float:
        """The plan's simulated iteration time (the cost model's units)."""
        return float(self.plan.makespan_ms)

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
        """The MicroBatch a stage module sees: the layout on `device`, and `loaded` (or, with a stage
        this rank loads, its loaded tensors moved to `device`)."""
        if loaded is None and stage is not None and (mb, stage) in self._loads:
            loaded = {k: v.to(device) for k, v in self._loads[(mb, stage)].items()}
        return MicroBatch(self.layout(mb), device, loaded)


def _is_encdec(plan: packpipe.Plan) -> bool:
    return any(s["decoder_layers"][1] > s["decoder_layers"][0] for s in plan.stages)


class PlanLoader:
    """An iterable over the iterations of an epoch for one pipeline rank of one replica.

    Either plans on every rank with the library's epoch planner (give ``cost_model`` and the
    ``plan_epoch`` settings: ``shape``, ``options``, ``global_batch_tokens`` or
    ``global_batch_samples``, ``seed``, ``loss``, ``dtype``, ``schedule``, ...), or reads
    ``plan_file`` by (iteration, replica). ``rank=None`` assembles every rank's loads (single-process
    training). ``state_dict()`` / ``load_state_dict()`` resume mid-epoch exactly: the next iteration
    after a resume is the one an uninterrupted run would have delivered.
    """

    def __init__(self, dataset, *, cost_model=None, plan_file: Optional[str] = None, replica: int = 0,
                 rank: Optional[int] = 0, epoch: int = 0, first_iteration: int = 0, iterations: int = 0,
                 depth: int = 2, ignore_index: int = IGNORE_INDEX, pad_id: int = 0, decoder_start_id: int = 0,
                 allow_incomplete: bool = False, **plan_epoch_kwargs):
        if isinstance(dataset, str):
            dataset = packpipe.MultiTaskDataset(dataset)
        if (cost_model is None) == (plan_file is None):
            raise ValueError("PlanLoader: give exactly one of cost_model (plan every iteration on every rank) or "
                             "plan_file (read the plans)")
        if plan_file is not None and plan_epoch_kwargs:
            raise ValueError(f"PlanLoader: planning settings {sorted(plan_epoch_kwargs)} do not apply to a plan file")
        for bad in ("first_iteration", "iterations", "epoch", "encode"):
            plan_epoch_kwargs.pop(bad, None)
        self.dataset = dataset
        self.cost_model = cost_model
        self._base_cost_model = cost_model  # what the settings' fingerprint names (a calibration is saved beside)
        self._calibration: Optional[str] = None  # the calibration file's text the loader plans with, if any
        self.plan_file = plan_file
        self.replica = replica
        self.rank = rank
        self.epoch = epoch
        self.iterations = iterations
        self.depth = depth
        self._tokens = dict(ignore_index=ignore_index, pad_id=pad_id, decoder_start_id=decoder_start_id)
        self._allow_incomplete = allow_incomplete  # a plan file whose planning run stopped early: refused unless True
        self._kwargs = plan_epoch_kwargs
        self._next = first_iteration  # the iteration the next __next__ delivers
        self._stop = first_iteration + iterations if iterations else None  # absolute end (None: the epoch's)
        self._native = None
        self._encdec: Optional[bool] = None

    # ---- configuration identity (a resume must use the same settings) ----
    def _config(self) -> str:
        d = {"plan_file": self.plan_file, "replica": self.replica, "rank": self.rank, "epoch": self.epoch,
             "stop": self._stop,
             "tokens": self._tokens, "kwargs": {k: repr(v) for k, v in sorted(self._kwargs.items())},
             "cost_model": self._base_cost_model.describe() if self._base_cost_model is not None else None,
             # what is delivered: the manifest's identity (tasks, order, files, weights) and the plans'
             "dataset": self.dataset.fingerprint(),
             "plans": packpipe.PlanFileReader(self.plan_file).fingerprint() if self.plan_file is not None else None}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    def state_dict(self) -> Dict[str, Any]:
        """Where the loader is: the next iteration it delivers, its settings' fingerprint, and the
        calibration it plans with (None: the cost model it was given)."""
        return {"epoch": self.epoch, "next_iteration": self._next, "config": self._config(),
                "calibration": self._calibration}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume from state_dict(): the next iteration delivered is state['next_iteration']."""
        if state.get("config") != self._config():
            raise ValueError("PlanLoader.load_state_dict: the state was saved by a loader with other settings "
                             f"(fingerprint {state.get('config')}, this loader {self._config()})")
        if int(state["epoch"]) != self.epoch:
            raise ValueError(f"PlanLoader.load_state_dict: state of epoch {state['epoch']}, this loader plans epoch "
                             f"{self.epoch}")
        self._native = None
        self._next = int(state["next_iteration"])
        self._set_model(state.get("calibration") or None, "the loader state's calibration")

    def _set_model(self, calibration: Optional[str], what: str) -> None:
        """Plans with the base model calibrated by the calibration file text `calibration` (None:
        the base model); what planned ahead with the old model is dropped."""
        if calibration is None:
            self.cost_model = self._base_cost_model
        else:
            cal = packpipe.Calibration.from_json(calibration, what)
            self.cost_model = packpipe.CalibratedCostModel(self._base_cost_model, cal)
        self._calibration = calibration
        self._native = None

    @property
    def base_cost_model(self):
        """The cost model the loader was given (before any calibration)."""
        return self._base_cost_model

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

    def __iter__(self) -> Iterator[Iteration]:
        return self

    def __next__(self) -> Iteration:
        if self._stop is not None and self._next >= self._stop:
            raise StopIteration
        if self._native is None:
            self._open()
        native = next(self._native)
        if self._encdec is None:
            self._encdec = _is_encdec(native.plan)
        self._next = int(native.iteration) + 1
        return Iteration(native, self._encdec)

    def __len__(self) -> int:
        if self._native is None:
            self._open()
        return len(self._native)

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
        self._observer = None  # the loader's calibration: the runners hand it this step's result
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


_STATE_FIELDS = ("epoch", "next_iteration", "config", "calibration")  # what state_dict() returns


# What calibrate="auto" (or True) fits with: a couple of warm-up steps unmeasured, a handful
# measured, then one fit (the boundary) and calibrated plans from the next iteration on.
AUTO_CALIBRATION = {"warmup": 2, "fit_after": 6}


def _calibrate_settings(where: str, calibrate: Any, cost_model) -> Optional[Dict[str, Any]]:
    """The Calibrator settings of PlanLoader(calibrate=) (None: no calibration)."""
    if isinstance(calibrate, str):
        if calibrate != "auto":
            raise ValueError(f"{where}: calibrate must be 'auto', True, False or a dict of Calibrator settings, "
                             f"found {calibrate!r}")
        # A model already tuned to its machine (a calibration, or measured profiles) is kept.
        tuned = cost_model is None or isinstance(cost_model, packpipe.CalibratedCostModel) or \
            "profiled" in cost_model.describe()
        return None if tuned else dict(AUTO_CALIBRATION)
    if calibrate is False or calibrate is None:
        return None
    if cost_model is None:
        raise ValueError(f"{where}: calibrate={calibrate!r} needs a loader that plans (cost_model): a plan file's "
                         "plans are fixed")
    if calibrate is True:
        return dict(AUTO_CALIBRATION)
    if isinstance(calibrate, dict):
        allowed = {"fit_after", "refit_every", "warmup", "options", "save", "tp", "timeout_s", "inputs"}
        unknown = sorted(set(calibrate) - allowed)
        if unknown:
            raise ValueError(f"{where}: calibrate: unknown Calibrator settings {unknown} (expected some of "
                             f"{sorted(allowed)})")
        return {**AUTO_CALIBRATION, **calibrate}
    raise TypeError(f"{where}: calibrate must be 'auto', True, False or a dict of Calibrator settings, found "
                    f"{type(calibrate).__name__}")


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
                 allow_incomplete: bool = False, calibrate: Any = "auto", **plan_epoch_kwargs):
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
                        exclude=("cost_model", "dataset", "epoch", "first_iteration", "iterations", "depth", "encode"))
        if plan_file is not None and plan_epoch_kwargs:
            raise ValueError(f"PlanLoader: planning settings {sorted(plan_epoch_kwargs)} do not apply to a plan file")
        self.dataset = dataset
        self.cost_model = cost_model
        self._base_cost_model = cost_model  # what the settings' fingerprint names (a calibration is saved beside)
        self._calibration: Optional[str] = None  # the calibration file's text the loader plans with, if any
        self.plan_file = plan_file
        self.replica = _check.integer(where, "replica", replica, 0, _check.MAX_PIPELINE - 1)
        self.rank = None if rank is None else _check.integer(where, "rank", rank, 0, _check.MAX_PIPELINE - 1)
        self.epoch = _check.integer(where, "epoch", epoch, 0, _check.MAX_EPOCH)
        first_iteration = _check.integer(where, "first_iteration", first_iteration, 0, _check.MAX_COUNT)
        self.iterations = _check.integer(where, "iterations", iterations, 0, _check.MAX_COUNT)
        self.depth = _check.integer(where, "depth", depth, 1, _check.MAX_DEPTH)
        self._tokens = dict(ignore_index=_check.integer(where, "ignore_index", ignore_index, *_check.INT64),
                            pad_id=_check.integer(where, "pad_id", pad_id, 0, _check.INT64[1]),
                            decoder_start_id=_check.integer(where, "decoder_start_id", decoder_start_id, 0,
                                                            _check.INT64[1]))
        # a plan file whose planning run stopped early: refused unless True
        self._allow_incomplete = _check.boolean(where, "allow_incomplete", allow_incomplete)
        self._kwargs = plan_epoch_kwargs
        self._auto_settings = _calibrate_settings(where, calibrate, cost_model)
        self._auto = None  # the Calibrator of calibrate=, made at the first iteration delivered
        self._next = first_iteration  # the iteration the next __next__ delivers
        self._stop = first_iteration + self.iterations if self.iterations else None  # absolute end (None: the epoch's)
        self._native = None
        self._encdec: Optional[bool] = None
        # Opened now, so that a bad setting, plan file or rank fails here rather than at the first
        # iteration; it also starts planning and loading ahead while the trainer builds its model.
        self._open()

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
        """Resume from state_dict(): the next iteration delivered is state['next_iteration']. A state
        that is not a state_dict() of a loader with the same settings is refused (ValueError naming
        the field; TypeError for a field of the wrong type: nothing is coerced)."""
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
        if epoch != self.epoch:
            raise ValueError(f"{where}: state of epoch {epoch}, this loader plans epoch {self.epoch}")
        if calibration is not None and self.plan_file is not None:
            raise ValueError(f"{where}: the state has a calibration, but this loader reads a plan file")
        self._set_model(calibration or None, "the loader state's calibration")
        self._next = nxt

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
    def input_files(self) -> List[str]:
        """The files this loader reads (the manifest, every dataset file, the plan file): what no
        output of the job may be (packpipe.write_file_atomic's inputs)."""
        return packpipe.dataset_files(self.dataset) + ([self.plan_file] if self.plan_file is not None else [])

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
        it = Iteration(native, self._encdec)
        if self._auto_settings is not None and self._calibration is None and self._auto is None:
            from packpipe.torch.calibrate import Calibrator  # (it imports this module)
            settings = self._auto_settings
            self._auto = Calibrator(self, **settings)
            self._auto_settings = settings
        if self._auto is not None and (self._auto._next_fit is not None):
            it._observer = self._auto.observe  # the runners hand it each step's result
        return it

    @property
    def calibration_reports(self) -> List[Any]:
        """What the calibration of calibrate= did so far (packpipe.torch.CalibrationReport each)."""
        return list(self._auto.reports) if self._auto is not None else []

    def __len__(self) -> int:
        if self._native is None:
            self._open()
        return len(self._native)

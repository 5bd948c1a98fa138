"""Type stubs of packpipe._core, the native core of packpipe (re-exported by the package)."""
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

# Arrays of tokens per sample: a 1-D integer numpy array (any integer dtype, strided views too) or
# a list of ints. Float, bool, complex and object arrays are refused with ValueError.
_Lengths = Union[npt.NDArray[np.integer], Sequence[int]]
# Cost arrays: a numpy array of a floating or integer dtype, or nested lists of numbers.
_Costs = Union[npt.NDArray[Union[np.floating, np.integer]], Sequence[Any]]
# A micro-batch for ScheduleProblem: a MicroBatch or (rows, padded_len[, padded_dec_len[, recompute]]).
_MicroBatchShape = Union["MicroBatch", Tuple[int, int], Tuple[int, int, int], Tuple[int, int, int, str]]

__version__: str
built_with_cuda: bool
"""Whether this build has CUDA support."""

def cuda_device_count() -> int:
    """Number of usable CUDA devices (0 without CUDA or without a device)."""

# ---- data loader -------------------------------------------------------------------------------

class IndexedDataset:
    """A Megatron indexed dataset (<prefix>.idx + <prefix>.bin or .bin.zst), memory-mapped."""
    def __init__(self, prefix: str, modes: str = "auto") -> None:
        """Open a dataset; modes: 'auto', 'present' or 'absent' (sequence modes of multimodal datasets)."""
    def __len__(self) -> int:
        """Number of sequences."""
    def __getitem__(self, idx: Union[int, slice]) -> Any:
        """Tokens of sequence idx (a read-only view into the map), or a list of them for a slice."""
    def get(self, idx: int, offset: int = 0, length: int = -1) -> np.ndarray:
        """Tokens [offset, offset + length) of sequence idx (length -1: to the end)."""
    @property
    def sizes(self) -> np.ndarray:
        """int32 tokens per sequence (a read-only view of the copy made at open)."""
    @property
    def pointers(self) -> np.ndarray:
        """int64 byte offset of each sequence in the .bin (a read-only copy, read through the guard of the
        mapped .idx: RuntimeError naming it if another process truncated it)."""
    @property
    def doc_idx(self) -> np.ndarray:
        """int64 first sequence of each document, plus the end (a read-only copy, as pointers)."""
    @property
    def modes(self) -> Optional[np.ndarray]:
        """int8 mode per sequence (multimodal datasets; a read-only copy, as pointers), else None."""
    @property
    def dtype(self) -> np.dtype:
        """Token dtype."""
    @property
    def prefix(self) -> str:
        """The path prefix opened."""
    @property
    def format(self) -> str:
        """Index format name."""
    @property
    def num_documents(self) -> int:
        """Number of documents."""
    @property
    def num_tokens(self) -> int:
        """Total tokens."""
    @property
    def compressed(self) -> bool:
        """Whether tokens are read from a seekable .bin.zst."""
    def verify(self, max_problems: int = 100) -> List[Tuple[str, str]]:
        """Full consistency check; a list of (file, message), empty when consistent."""

class IndexedDatasetBuilder:
    """Streaming writer of a Megatron MMIDIDX v1 dataset."""
    def __init__(self, prefix: str, dtype: Any = ..., multimodal: bool = False) -> None:
        """Start <prefix>.bin / .idx with tokens of `dtype` (default int32)."""
    def add_item(self, tokens: np.ndarray, mode: int = 0) -> None:
        """Append one sequence (a 1-D C-contiguous array of the builder's dtype)."""
    def end_document(self) -> None:
        """Close the current document."""
    def add_document(self, tokens: np.ndarray, lengths: _Lengths, modes: Optional[_Lengths] = None) -> None:
        """Append a document of sequences of `lengths` tokens taken from `tokens` (integer arrays or lists)."""
    def add_index(self, prefix: str) -> None:
        """Append every sequence of another dataset."""
    def finalize(self) -> None:
        """Write the index; the dataset is complete."""
    @property
    def num_sequences(self) -> int:
        """Sequences written so far."""
    @property
    def num_documents(self) -> int:
        """Documents written so far."""

def merge_datasets(inputs: List[str], output_prefix: str) -> None:
    """Concatenate datasets in constant memory."""

def compress_dataset(prefix: str, level: int = 3, frame_size: int = 262144) -> int:
    """Write <prefix>.bin.zst; returns its size in bytes."""

class MultiTaskDataset:
    """The datasets of a multi-task manifest, opened."""
    def __init__(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Open a manifest .json or a dataset prefix (str or os.PathLike)."""
    def __len__(self) -> int:
        """Samples over every task."""
    @property
    def num_tasks(self) -> int:
        """Number of tasks."""
    @property
    def task_names(self) -> List[str]:
        """Task names, by task number."""
    def task_size(self, task: int) -> int:
        """Samples of a task."""
    def has_targets(self, task: int) -> bool:
        """Whether a task's samples have a target part (a paired task), whatever the model: a decoder-only model
        trains on input + target."""
    def encoder_decoder(self, task: int) -> bool:
        """The same as has_targets (named for the encoder-decoder layout of paired samples; it says nothing about
        the model)."""
    def lengths(self, task: int) -> Tuple[np.ndarray, np.ndarray]:
        """(input_lengths, target_lengths) of every sample of a task, as uint32 arrays."""
    def sample(self, task: int, index: int) -> Tuple[np.ndarray, np.ndarray]:
        """(input_tokens, target_tokens) of a sample (target empty for a text-only task); IndexError out of range."""
    def fingerprint(self) -> str:
        """16 hex digits identifying what the dataset delivers: tasks in order (names, layouts, weights), files."""

class Sampler:
    """Deterministic, resumable multi-task sampler of global batches."""
    def __init__(self, dataset: MultiTaskDataset, *, seed: int = 1234, global_batch_tokens: int = 0,
                 global_batch_samples: int = 0, split: str = "train", weights: Optional[List[float]] = None,
                 epoch: int = 0) -> None:
        """A sampler of `dataset` (kept alive); exactly one of the two batch sizes is non-zero."""
    @property
    def epoch_size(self) -> int:
        """Samples per epoch."""
    @property
    def epoch(self) -> int:
        """The current epoch."""
    @property
    def position(self) -> int:
        """Next epoch position to deliver."""
    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning."""
    def next_batch(self) -> Optional[Dict[str, Any]]:
        """The next global batch as a dict (tasks, indices, tokens, ...), or None at the end of the epoch."""
    def __iter__(self) -> "Sampler":
        """The sampler itself."""
    def __next__(self) -> Dict[str, Any]:
        """The next global batch (StopIteration at the end of the epoch)."""
    def state(self) -> str:
        """Checkpoint as a JSON string."""
    def restore(self, state: str) -> None:
        """Resume from a checkpoint of state()."""

def shard_batch(batch: Dict[str, Any], dataset: MultiTaskDataset, rank: int, world: int) -> Dict[str, Any]:
    """The samples of a global batch that data-parallel rank `rank` of `world` takes."""

class Prefetcher:
    """Background sampling and assembly of the next global batches."""
    def __init__(self, dataset: MultiTaskDataset, sampler: Sampler, depth: int = 4) -> None:
        """Prefetch `depth` batches of `sampler` (both arguments kept alive)."""
    def __iter__(self) -> "Prefetcher":
        """The prefetcher itself."""
    def __next__(self) -> Dict[str, Any]:
        """The next batch dict with its 'samples': (input, target) token views."""
    def state(self) -> str:
        """Sampler state after the last delivered batch."""

# ---- cost model --------------------------------------------------------------------------------

class LayerCost:
    """Time (ms) and memory (bytes) of a cost-model query."""
    @property
    def forward_ms(self) -> float:
        """Forward time."""
    @property
    def backward_ms(self) -> float:
        """Backward time, excluding recompute."""
    @property
    def recompute_ms(self) -> float:
        """Recompute time."""
    @property
    def stored_bytes(self) -> float:
        """Activations kept from forward to backward."""
    @property
    def peak_bytes(self) -> float:
        """Transient peak, on top of stored."""
    @property
    def boundary_bytes(self) -> float:
        """Activation bytes at the layer boundary."""
    @property
    def total_ms(self) -> float:
        """Forward + backward + recompute."""
    @property
    def time_source(self) -> str:
        """Where the times come from (analytic, profiled, ...)."""
    @property
    def memory_source(self) -> str:
        """Where the memory figures come from."""
    def to_dict(self) -> Dict[str, Any]:
        """Every field as a dict."""

class StaticMemory:
    """Parameters, gradients and optimizer state on one GPU (bytes)."""
    @property
    def params_bytes(self) -> float:
        """Parameters."""
    @property
    def grads_bytes(self) -> float:
        """Gradients."""
    @property
    def optimizer_bytes(self) -> float:
        """Optimizer state."""
    @property
    def total_bytes(self) -> float:
        """The three together."""

class CostModel:
    """Cost model: analytic, or from profiles when given."""
    def __init__(self, model: str = "gpt-6.7b", device: str = "A100-40GB", profiles: List[str] = ...,
                 calibration: str = "", *, interpolation: str = "fit", attention: Optional[str] = None) -> None:
        """Model and device presets or .json files; profiles (files or folders) select the profiled model,
        interpolated by packpipe's fits ('fit') or DynaPipe's multilinear rule ('linear'); calibration (a
        file) is applied over it; attention the kernel the trainer runs ('eager' or 'flash'; None: the model
        file's, else the device's: flash on the GPU presets)."""
    @property
    def attention(self) -> str:
        """The attention kernel the costs are for: 'flash' (no stored scores) or 'eager'."""
    @property
    def calibration(self) -> Optional["Calibration"]:
        """The Calibration applied (a copy), or None."""
    def query(self, kind: str = "encoder", mbs: int = 1, seq: int = 0, dec_seq: int = 0, tp: int = 1,
              recompute: str = "none", layers: int = 1, segments: Optional[Sequence[int]] = None,
              dec_segments: Optional[Sequence[int]] = None, prefix: Optional[Sequence[int]] = None) -> LayerCost:
        """Time and memory of `layers` layers of `kind` for one micro-batch of `mbs` samples padded to `seq`, or
        for one packed row of `segments` (and `dec_segments`) under varlen attention; `prefix` (one per segment)
        makes them slices attending to that many kept tokens of their sample before them."""
    def stage_cost(self, encoder_layers: int = 0, decoder_layers: int = 0, has_embedding: bool = False,
                   has_postprocess: bool = False, mbs: int = 1, seq: int = 0, dec_seq: int = 0, tp: int = 1,
                   recompute: str = "none") -> LayerCost:
        """One micro-batch on a stage holding these layers (embedding and LM head included where flagged)."""
    def stage_static_memory(self, encoder_layers: int = 0, decoder_layers: int = 0, has_embedding: bool = False,
                            has_postprocess: bool = False, tp: int = 1, dp: int = 1, zero: int = 0) -> StaticMemory:
        """Model state of a stage holding these layers under tp, dp and ZeRO stage `zero`."""
    def p2p_ms(self, bytes: float, inter_node: bool = False) -> float:
        """Point-to-point transfer time."""
    def all_reduce_ms(self, bytes: float, n: int, inter_node: bool = False) -> float:
        """All-reduce time over n ranks."""
    def all_gather_ms(self, bytes: float, n: int, inter_node: bool = False) -> float:
        """All-gather time over n ranks."""
    def reduce_scatter_ms(self, bytes: float, n: int, inter_node: bool = False) -> float:
        """Reduce-scatter time over n ranks."""
    @property
    def model(self) -> Dict[str, Any]:
        """The model's specification (name, arch, layers, hidden, heads, ...)."""
    @property
    def device(self) -> Dict[str, Any]:
        """The device's specification (name, peak_tflops, memory_gb, links, ...)."""
    def describe(self) -> str:
        """One line naming the model, the device and the cost source."""

def static_memory(params: float, dp: int = 1, zero: int = 0) -> StaticMemory:
    """Mixed-precision Adam state of `params` parameters on one GPU under data parallelism and ZeRO stage `zero`."""

def write_profile(path: Union[str, "os.PathLike[str]"], points: List[Tuple[Any, ...]], model: str = "",
                  device: str = "", notes: List[str] = ..., sources: List[str] = ..., attention: str = "", *,
                  inputs: Any = ...) -> None:
    """Write packpipe's profile file atomically (points: kind, tp, rc, variant, mbs, seq, dec_seq, fwd_ms, bwd_ms, stored_bytes, peak_bytes; attention: the kernel measured, empty: eager); ValueError when path is one of inputs (by inode)."""

def read_profile(paths: List[str]) -> Dict[str, Any]:
    """Profiles in any format packpipe reads, merged: model, device, points, notes, sources, attention (the kernel measured)."""

def profile_leave_one_out(paths: List[str], model: str) -> Dict[str, Any]:
    """Leave-one-out errors (MAPE, percent) of the profiled model on the profiles' own points."""

def model_presets() -> List[str]:
    """Names of the model presets."""

def device_presets() -> List[str]:
    """Names of the device presets."""

def bigscience_params(model: str, seq: int) -> float:
    """P = l (12 h^2 + 13 h) + V h + s h + 2 h."""

def bigscience_tflops_per_gpu(params: float, seq: int, global_batch: int, iteration_s: float, gpus: int,
                              factor: int = 4) -> float:
    """P * factor * 2 * s * GBS / (T * N * 1e12); factor 4 with full recompute, 3 without."""

def training_flops(model: str, mbs: int, seq: int, dec_seq: int = 0) -> float:
    """Model FLOPs (3 x forward) of one dense micro-batch of mbs rows x seq tokens; for packed or
    sliced micro-batches use the planner's model_flops (IterationResult.model_flops)."""

def throughput_report(model_flops: float, samples: float, tokens: float, iteration_s: float, gpus: int,
                      device: str) -> Dict[str, float]:
    """Tokens per second, TFLOPs per GPU and MFU of an iteration."""

# ---- calibration -------------------------------------------------------------------------------

class Measurement:
    """One measured op: shape, duration and provenance (one line of a packpipe-measurements file)."""
    op: str
    """F, B, I, W (compute ops) or send, recv (one end of a transfer)."""
    encoder_layers: int
    """Encoder (decoder-only: all) layers of the stage."""
    decoder_layers: int
    """Decoder layers of the stage (encoder-decoder)."""
    embedding: bool
    """The stage holds the token embedding."""
    postprocess: bool
    """The stage holds the LM head and the loss."""
    tp: int
    """Tensor-parallel size."""
    rows: int
    """Micro-batch rows."""
    seq: int
    """Padded tokens per row (encoder side of encoder-decoder models)."""
    dec_seq: int
    """Padded decoder tokens per row, else 0."""
    recompute: str
    """none, selective or full."""
    bytes: int
    """Transfers: bytes moved; compute ops: 0."""
    ms: float
    """Measured duration."""
    iteration: int
    """Iteration."""
    replica: int
    """Data-parallel replica."""
    rank: int
    """Pipeline rank."""
    stage: int
    """Virtual stage of the instruction."""
    mb: int
    """Micro-batch."""
    index: int
    """Instruction index in its rank's stream."""
    start_ms: float
    """Start, ms after the iteration's first instruction started."""
    peer: int
    """Transfers: the other rank; compute ops: -1."""
    def __init__(self, op: str = "F", **fields: Any) -> None:
        """A measurement; any field above as a keyword (each checked as its setter checks it)."""
    @property
    def tokens(self) -> float:
        """rows x (seq + dec_seq)."""
    def __eq__(self, other: object) -> bool:
        """Same fields."""
    def __copy__(self) -> "Measurement":
        """A copy."""
    def __deepcopy__(self, memo: Any) -> "Measurement":
        """A copy."""

class IterationMeasurement:
    """One measured iteration of one replica: measured makespan beside the plan's."""
    iteration: int
    """Iteration."""
    replica: int
    """Data-parallel replica."""
    measured_ms: float
    """First start to last end over its ranks."""
    predicted_ms: float
    """The plan's makespan (0: unknown)."""
    @property
    def schedule(self) -> str:
        """The plan's schedule kind ('': unknown)."""
    def __init__(self, *, iteration: int = 0, replica: int = 0, measured_ms: float = 0.0,
                 predicted_ms: float = 0.0, schedule: str = "") -> None:
        """An iteration line."""
    def __eq__(self, other: object) -> bool:
        """Same fields."""
    def __copy__(self) -> "IterationMeasurement":
        """A copy."""
    def __deepcopy__(self, memo: Any) -> "IterationMeasurement":
        """A copy."""

class MeasurementSet:
    """Measurements of executed iterations: header, ops and iteration lines (picklable)."""
    ops: List[Measurement]
    """The op measurements (a copy: assign to change)."""
    iterations: List[IterationMeasurement]
    """The iteration lines (a copy: assign to change)."""
    model: str
    """The model the plans were made for."""
    device: str
    """Where they ran."""
    source: str
    """How they were measured."""
    def __init__(self, ops: List[Measurement] = ..., iterations: List[IterationMeasurement] = ..., *,
                 model: str = "", device: str = "", source: str = "") -> None:
        """A set from measurements."""
    def append(self, other: "MeasurementSet") -> None:
        """Appends other's ops and iterations (the header stays this one's)."""
    def to_jsonl(self) -> str:
        """The file form (packpipe-measurements v1 JSON Lines)."""
    def __len__(self) -> int:
        """Op measurements."""

def parse_measurements(text: str, what: str = "<measurements>") -> MeasurementSet:
    """Parse packpipe-measurements v1 JSON Lines read from `what`; errors name it, the line and the field."""

def read_measurements(path: str) -> MeasurementSet:
    """Read a measurement file."""

def write_measurements(path: Union[str, "os.PathLike[str]"], measurements: MeasurementSet, *,
                       inputs: Any = ...) -> None:
    """Write a measurement file atomically; ValueError when path is one of inputs (the files the job reads, by inode)."""

class FitOptions:
    """How fit_calibration fits (the CLI's calibrate flags)."""
    min_region_points: int
    """A log2(tokens) region with fewer points takes its op kind's global fit."""
    outlier_mads: float
    """Points beyond this many robust deviations (1.4826 MAD) of the median residual are rejected."""
    max_iterations: int
    """Fit / reject rounds at most."""
    regions: bool
    """Fit per log2(tokens) region (False: one fit per op kind)."""
    transfer_quantile: float
    """Quantile of one transfer size's measured times taken as its time."""
    def __init__(self, *, min_region_points: int = 8, outlier_mads: float = 3.0, max_iterations: int = 20,
                 regions: bool = True, transfer_quantile: float = 0.1) -> None:
        """Options; a value out of range raises ValueError naming it."""
    def __eq__(self, other: object) -> bool:
        """Same fields."""
    def __copy__(self) -> "FitOptions":
        """A copy."""
    def __deepcopy__(self, memo: Any) -> "FitOptions":
        """A copy."""

class Calibration:
    """A fitted calibration of a cost model (data; a packpipe-calibration JSON file)."""
    @staticmethod
    def from_json(text: str, what: str = "<calibration>") -> "Calibration":
        """Parse the file form read from `what` (e.g. bytes rank 0 broadcast); errors name it and the field."""
    @staticmethod
    def load(path: str) -> "Calibration":
        """Read a calibration file."""
    def save(self, path: str) -> None:
        """Write the file form atomically."""
    def to_json(self) -> str:
        """The file form (deterministic: the same fit gives the same bytes)."""
    def apply(self, op: str, tokens: float, predicted_ms: float, share: float = 0.0) -> float:
        """Calibrated time of compute op F, B, I or W predicted `predicted_ms` by the base model at `tokens`, the stage's attention share of forward FLOPs being `share` (the op's attention_gamma reweights it)."""
    @property
    def base(self) -> Dict[str, str]:
        """What it was fitted over: model, device, description, fingerprint."""
    @property
    def options(self) -> FitOptions:
        """The FitOptions used."""
    @property
    def measurements(self) -> int:
        """Measurements it was fitted on."""
    @property
    def source(self) -> str:
        """The file it was loaded from ('' otherwise)."""
    @property
    def compute(self) -> List[Dict[str, Any]]:
        """Per op kind F, B, I, W: fitted, from, global fit and regions (a, b, points, rejected, errors, ...)."""
    @property
    def transfers(self) -> List[Dict[str, Any]]:
        """Per link (intra, inter): fitted, latency_ms, bytes_per_ms, points, sizes, errors."""
    @property
    def schedules(self) -> List[Dict[str, Any]]:
        """Fitted schedule kinds: schedule, factor (measured / simulated makespan), iterations, spread."""
    def schedule_factor(self, schedule: str) -> float:
        """The factor the planner multiplies a schedule kind's simulated makespan by (a kind not fitted: the largest fitted one; 1 without any)."""

class CalibratedCostModel(CostModel):
    """A cost model with a calibration applied to its op times and transfers."""
    def __init__(self, base: CostModel, calibration: Calibration) -> None:
        """`base` calibrated; ValueError when the calibration was fitted over another model (naming both)."""
    @property
    def base(self) -> CostModel:
        """The uncalibrated model."""

def fit_calibration(cost_model: CostModel, measurements: Union[MeasurementSet, Sequence[Measurement]],
                    options: FitOptions = ...) -> Calibration:
    """Fit a Calibration of an uncalibrated cost model (any order of the measurements: the same bits)."""

def predict_ms(cost_model: CostModel, measurement: Measurement) -> float:
    """The cost model's time of a measurement's op and shape (calibrated when the model is)."""

def cost_model_fingerprint(cost_model: CostModel) -> str:
    """16 hex digits identifying an uncalibrated cost model (what a calibration is checked against)."""

# ---- packing -----------------------------------------------------------------------------------

class Packing:
    """Rows of packed samples in CSR form (row r: samples[row_offsets[r]:row_offsets[r + 1]])."""
    @property
    def samples(self) -> np.ndarray:
        """uint32 sample ids, row after row in placement order (read-only view)."""
    @property
    def row_offsets(self) -> np.ndarray:
        """uint64, rows + 1 entries."""
    @property
    def row_tokens(self) -> np.ndarray:
        """uint64 input tokens per row."""
    @property
    def row_target_tokens(self) -> np.ndarray:
        """uint64 target tokens per row (empty in one dimension)."""
    @property
    def rows(self) -> int:
        """Number of rows."""
    @property
    def capacity(self) -> int:
        """Input tokens per row."""
    @property
    def target_capacity(self) -> int:
        """Target tokens per row (0 in one dimension)."""
    @property
    def algorithm(self) -> str:
        """'ffd', 'bfd' or 'histogram'."""
    @property
    def efficiency(self) -> float:
        """Real tokens over rows x capacity (both dimensions together)."""
    def __len__(self) -> int:
        """Number of rows."""
    def row(self, r: int) -> np.ndarray:
        """Sample ids of row r (a copy)."""
    def row_tensors(self, padded_len: int = 0) -> Dict[str, Any]:
        """cu_seqlens, position_ids and segment_ids (int32 arrays) and max_seqlen of the rows."""

def pack(lengths: np.ndarray, capacity: int, algorithm: str = "bfd", target_lengths: Optional[np.ndarray] = None,
         target_capacity: int = 0, max_samples_per_row: int = 0) -> Packing:
    """Pack samples of uint32 `lengths` into rows of `capacity` tokens ('ffd', 'bfd' or 'histogram')."""

# ---- partition ---------------------------------------------------------------------------------

class PipelineShape:
    """The pipeline of one training job: ranks, interleaving, replicas, memory (the CLI's shape flags)."""
    stages: int
    """Pipeline ranks (--stages)."""
    chunks: int
    """Virtual stages per rank, for interleaved schedules (--chunks)."""
    layers_per_stage: int
    """Transformer layers per virtual stage; 0: the model's layers / (stages x chunks) (--layers-per-stage)."""
    dp: int
    """Data-parallel replicas (--dp)."""
    tp: int
    """Tensor-parallel ranks (--tp)."""
    zero: int
    """ZeRO stage of the optimizer state, 0-3 (--zero)."""
    memory_mb: float
    """Memory limit per device, MB = 1e6 bytes, at most the device's memory (planning refuses more); 0: all of it
    (--memory-mb)."""
    stage_layers: List[int]
    """Layers of each virtual stage, an uneven split (--layer-split); []: layers_per_stage or an even split."""
    def __init__(self, *, stages: int = 1, chunks: int = 1, layers_per_stage: int = 0, dp: int = 1, tp: int = 1,
                 zero: int = 1, memory_mb: float = 0.0, stage_layers: Sequence[int] = ()) -> None:
        """A shape; a size out of range (or negative) raises ValueError naming the field."""
    def __eq__(self, other: object) -> bool:
        """Same fields."""
    def __copy__(self) -> "PipelineShape":
        """A copy."""
    def __deepcopy__(self, memo: Any) -> "PipelineShape":
        """A copy."""

class PartitionOptions:
    """How a global batch is cut into micro-batches (the CLI's partition flags)."""
    method: str
    """dp, dynapipe, fixed, tokens, packing, wlb or slicing (--method)."""
    mbs: int
    """fixed / packing: samples (rows) per micro-batch (--mbs)."""
    tokens: int
    """tokens: padded tokens per micro-batch (--tokens)."""
    round_multiple: int
    """Padded lengths rounded up to this multiple (--round-multiple)."""
    recompute: str
    """Activation recompute allowed: auto, none, selective or full (--recompute)."""
    oversize: str
    """A sample that cannot fit alone: error, truncate, drop or slice (decoder-only: cut into slices that pipeline,
    trained as the whole sample) (--oversize)."""
    cost_basis: str
    """How micro-batch time and memory are computed: auto, stages or dynapipe (--cost-basis)."""
    order: str
    """Encoder-decoder sample order for dp: auto, sorted or path (--order)."""
    pack_windows: bool
    """dp / dynapipe: pack each window's samples when cheaper (--pack-windows)."""
    threads: int
    """Threads building the window table, 0: automatic (--threads); the result is the same."""
    layouts: Tuple[str, ...]
    """The layouts the executor runs: 'padded' and/or 'packed' (varlen attention), which dp's micro-batches may take,
    and 'packed-mask' (dense rows under a block mask); a baseline is a candidate for the plan only in one of them
    (--layouts)."""
    layout: Optional[str]
    """packing: 'packed' (rows flattened, varlen attention, the default) or 'packed-mask' (dense rows, block mask);
    fixed: 'padded' (the default) or 'packed' (HF's DataCollatorWithFlattening); None: the method's default
    (--layout)."""
    capacity: int
    """packing / wlb: tokens per row, 0: the longest sample's; slicing: the slice length (--capacity)."""
    slicing: str
    """dp, decoder-only: 'auto' (long samples may be cut into slices that pipeline) or 'off' (--slicing)."""
    min_slice_tokens: int
    """The shortest slice, tokens (--min-slice-tokens)."""
    slices_refused: str
    """Non-empty: slices cannot run where the plan is executed, and why (the partition cuts none)."""
    def __init__(self, *, method: str = "dp", mbs: int = 0, tokens: int = 0, round_multiple: int = 8,
                 recompute: str = "auto", oversize: str = "error", cost_basis: str = "auto", order: str = "auto",
                 pack_windows: bool = False, threads: int = 0, layouts: Sequence[str] = ("padded", "packed"),
                 layout: Optional[str] = None, capacity: int = 0, slicing: str = "auto",
                 min_slice_tokens: int = 64) -> None:
        """Options; an unknown name raises ValueError listing the valid ones, a negative count ValueError."""
    def __eq__(self, other: object) -> bool:
        """Same fields."""
    def __copy__(self) -> "PartitionOptions":
        """A copy."""
    def __deepcopy__(self, memo: Any) -> "PartitionOptions":
        """A copy."""

class MicroBatch:
    """Some samples of a global batch, their padded shape, recompute mode and costs (read-only)."""
    @property
    def samples(self) -> np.ndarray:
        """uint32 indices into the global batch, in row order (read-only view)."""
    @property
    def row_offsets(self) -> np.ndarray:
        """Packed rows as CSR offsets into samples (rows + 1 entries); empty: one row per sample."""
    @property
    def rows(self) -> int:
        """Rows (sequences)."""
    @property
    def layout(self) -> str:
        """'padded' (one sample a row), 'packed' (one row, varlen attention) or 'packed-mask' (rows, block mask)."""
    @property
    def attention(self) -> Tuple[int, int, int, int, int]:
        """packed: the attention sums (sum l^2, sum d^2, sum d x l, and over its slices sum l x p and sum p of
        their kept prefixes) the cost model charged; else zeros."""
    @property
    def spans(self) -> List[Tuple[int, int]]:
        """Slices: per sample in `samples`, (begin, length), the tokens of the sample it holds; empty: every
        sample whole."""
    @property
    def padded_len(self) -> int:
        """Tokens every row is padded to (encoder, or the whole sample)."""
    @property
    def padded_dec_len(self) -> int:
        """Decoder tokens per row (encoder-decoder), else 0."""
    @property
    def tokens(self) -> int:
        """Real tokens, input plus target."""
    @property
    def recompute(self) -> str:
        """Activation recompute: none, selective or full."""
    @property
    def time_ms(self) -> float:
        """Predicted forward + backward (+ recompute) time of its slowest stage."""
    @property
    def stored_mb(self) -> float:
        """Activations stored per in-flight copy on its largest stage (MB = 1e6 bytes)."""
    @property
    def peak_mb(self) -> float:
        """Transient peak on its largest stage."""
    def __getitem__(self, key: str) -> Any:
        """Deprecated (packpipe 0.1 dicts): the attribute `key`, with a DeprecationWarning."""

class Partition:
    """The micro-batches of one global batch and what they cost (read-only)."""
    @property
    def microbatches(self) -> List[MicroBatch]:
        """The micro-batches, in the order of the sample order used."""
    @property
    def alternatives(self) -> List["Partition"]:
        """dp: other partitions of the batch that fit (other micro-batch counts, tapered, sliced or not), which the
        planner simulates too (the objective is the 1F1B bound)."""
    @property
    def ranks(self) -> List[List[int]]:
        """Micro-batch indices per data-parallel rank, ascending."""
    @property
    def rank_time_ms(self) -> List[float]:
        """Sum of time_ms per data-parallel rank."""
    @property
    def order(self) -> np.ndarray:
        """uint32 sample order the windows were cut from."""
    @property
    def objective_ms(self) -> float:
        """What the method minimised ((S-1) tau/c + sum/d for dp and dynapipe)."""
    @property
    def tau_ms(self) -> float:
        """Cap charged (dynapipe: the chosen candidate; others: the realised max)."""
    @property
    def max_time_ms(self) -> float:
        """Realised max over micro-batches."""
    @property
    def sum_time_ms(self) -> float:
        """Sum over micro-batches."""
    @property
    def predicted_iteration_ms(self) -> float:
        """(S-1) max/c + sum/d: the 1F1B bound, not a simulation."""
    @property
    def input_tokens(self) -> int:
        """Real input tokens (after truncation)."""
    @property
    def target_tokens(self) -> int:
        """Real target tokens (after truncation)."""
    @property
    def padded_input_tokens(self) -> int:
        """Rows x padded lengths, input."""
    @property
    def padded_target_tokens(self) -> int:
        """Rows x padded lengths, target."""
    @property
    def efficiency(self) -> float:
        """Real / padded tokens, input and target together."""
    @property
    def input_efficiency(self) -> float:
        """Encoder (or whole-sample) side."""
    @property
    def target_efficiency(self) -> float:
        """Decoder side (0 for decoder-only)."""
    @property
    def cost_basis(self) -> str:
        """The basis the times and memory use: stages or dynapipe."""
    @property
    def dynapipe_recompute(self) -> str:
        """dynapipe: the iteration-wide recompute mode chosen."""
    @property
    def memory_limit_mb(self) -> float:
        """The memory limit checked."""
    @property
    def truncated(self) -> np.ndarray:
        """uint32 sample ids truncated (oversize 'truncate')."""
    @property
    def dropped(self) -> np.ndarray:
        """uint32 sample ids dropped (oversize 'drop')."""
    @property
    def tau_evaluations(self) -> int:
        """Min-sum DP runs (one per cap tried)."""
    def __getitem__(self, key: str) -> Any:
        """Deprecated (packpipe 0.1 dicts): the attribute `key`, with a DeprecationWarning."""

class PartitionCache:
    """Micro-batch shape costs kept across partition() / plan_batch() calls; one per thread."""
    def __init__(self) -> None:
        """An empty cache."""
    @property
    def shapes(self) -> int:
        """Micro-batch shapes (rows, lengths) memoised so far."""

def partition(cost_model: CostModel, input_lengths: _Lengths, target_lengths: Optional[_Lengths] = None, *,
              shape: PipelineShape = ..., options: PartitionOptions = ...,
              cache: Optional[PartitionCache] = None) -> Partition:
    """Micro-batches of one global batch (shape defaults to PipelineShape(): one stage)."""

def evaluate_partition(cost_model: CostModel, input_lengths: _Lengths, target_lengths: Optional[_Lengths] = None, *,
                       microbatches: List[Union[MicroBatch, _Lengths]], shape: PipelineShape = ...,
                       options: PartitionOptions = ..., basis: str = "stages", layout: str = "padded") -> Partition:
    """Given micro-batches (MicroBatch objects, or arrays of sample indices laid out as `layout`) costed on a
    basis ('stages' or 'dynapipe'): a Partition; samples in no micro-batch are its `dropped`, a sample given
    twice is a ValueError."""

def balanced_stage_layers(cost_model: CostModel, shape: PipelineShape, rows: int, seq: int,
                          dec_seq: int = 0) -> List[int]:
    """Layers per virtual stage balancing the stages' time on a rows x seq micro-batch (for stage_layers)."""

# ---- schedules ---------------------------------------------------------------------------------

class Schedule:
    """A simulated pipeline schedule: per-rank ops with start/end (ms)."""
    @property
    def name(self) -> str:
        """The schedule kind."""
    @property
    def ranks(self) -> int:
        """Pipeline ranks."""
    @property
    def vstages(self) -> int:
        """Virtual stages."""
    @property
    def microbatches(self) -> int:
        """Micro-batches."""
    @property
    def makespan_ms(self) -> float:
        """Simulated iteration time."""
    @property
    def bubble_fraction(self) -> float:
        """Idle fraction of the ranks."""
    @property
    def peak_bytes(self) -> List[float]:
        """Peak memory per rank."""
    @property
    def utilization(self) -> List[float]:
        """Busy fraction per rank."""
    @property
    def order(self) -> List[int]:
        """Micro-batch order used."""
    def ops(self, rank: int) -> np.ndarray:
        """Rank's ops as a zero-copy structured array (kind, mb, vstage, start_ms, end_ms)."""
    def op_list(self, rank: int) -> List[Tuple[str, int, int, float, float]]:
        """Rank's ops as (token, mb, vstage, start_ms, end_ms) tuples."""
    def chrome_trace(self, process_name: str = "packpipe") -> str:
        """Chrome trace / Perfetto JSON of the timeline."""

class ScheduleSearchResult:
    """Outcome of a schedule search."""
    @property
    def schedule(self) -> Schedule:
        """The best schedule found."""
    @property
    def feasible(self) -> bool:
        """Whether it fits the memory limit."""
    @property
    def recompute(self) -> str:
        """Recompute mode used."""
    @property
    def simulations(self) -> int:
        """Schedules simulated."""
    @property
    def early_exits(self) -> int:
        """Simulations cut short by the bound."""
    @property
    def lower_bound_ms(self) -> float:
        """Makespan lower bound."""

class ScheduleProblem:
    """_Costs of one iteration's micro-batches on a pipeline."""
    def __init__(self, cost_model: CostModel, microbatches: Union[Partition, Sequence[_MicroBatchShape]], *,
                 shape: PipelineShape = ..., input_lengths: Optional[_Lengths] = None,
                 replica: Optional[int] = None) -> None:
        """From a cost model, micro-batches (a Partition, or its micro-batches) and the pipeline shape
        (default PipelineShape(stages=4)); micro-batches holding slices need their lengths (a Partition
        has them, else input_lengths=) so that every schedule keeps the slices in order; a Partition of
        several data-parallel replicas needs replica= (each replica is its own pipeline)."""
    @staticmethod
    def from_costs(forward_ms: _Costs, backward_ms: _Costs, backward_weight_ms: Optional[_Costs] = None,
                   stored_bytes: Optional[_Costs] = None, peak_bytes: Optional[_Costs] = None,
                   transfer_ms: Optional[_Costs] = None, static_bytes: Optional[_Costs] = None, ranks: int = 1,
                   memory_limit_bytes: float = 0.0) -> "ScheduleProblem":
        """From (micro-batches, virtual stages) cost arrays; transfer_ms[mb, v]: v -> v + 1. Every time and size in
        [0, 1e15], memory_limit_bytes finite (0: no limit), ranks in [1, 65536]: otherwise ValueError naming the entry."""
    @property
    def microbatches(self) -> int:
        """Micro-batches."""
    @property
    def vstages(self) -> int:
        """Virtual stages."""
    @property
    def ranks(self) -> int:
        """Pipeline ranks."""
    @property
    def memory_limit_bytes(self) -> float:
        """Memory limit per rank."""
    @property
    def lower_bound_ms(self) -> float:
        """Makespan lower bound."""
    def simulate(self, schedule: str, order: Optional[List[int]] = None) -> Schedule:
        """Build and simulate one schedule (see schedule_names())."""
    def search(self, seed: int = 0, schedules: Optional[List[str]] = None, reference: bool = False,
               local_rounds: int = 1) -> ScheduleSearchResult:
        """Search the schedule and micro-batch order (reference=True: the exhaustive DynaPipe-like search)."""

def schedule_names() -> List[str]:
    """Names of the pipeline schedules."""

# ---- plans -------------------------------------------------------------------------------------

class Instruction:
    """One instruction of a rank's stream."""
    @property
    def op(self) -> str:
        """Opcode name."""
    @property
    def opcode(self) -> int:
        """Opcode value."""
    @property
    def mb(self) -> Optional[int]:
        """Micro-batch (None: absent)."""
    @property
    def stage(self) -> Optional[int]:
        """Virtual stage (None: absent)."""
    @property
    def peer(self) -> Optional[int]:
        """Peer rank (None: absent)."""
    @property
    def in_(self) -> Optional[int]:
        """Buffer read (None: absent)."""
    @property
    def in2(self) -> Optional[int]:
        """Second buffer read (None: absent)."""
    @property
    def out(self) -> Optional[int]:
        """Buffer written (None: absent)."""
    @property
    def shape(self) -> Optional[int]:
        """Index into Plan.shapes (None: absent)."""
    @property
    def is_compute(self) -> bool:
        """Whether it is a compute instruction."""
    def __eq__(self, other: object) -> bool:
        """Same instruction."""

class Plan:
    """One iteration's plan: header and per-rank instruction streams."""
    @property
    def iteration(self) -> int:
        """The iteration."""
    @property
    def schedule(self) -> str:
        """The schedule."""
    @property
    def ranks(self) -> int:
        """Pipeline ranks."""
    @property
    def vstages(self) -> int:
        """Virtual stages."""
    @property
    def stage_rank(self) -> List[int]:
        """Rank of each virtual stage."""
    @property
    def dp(self) -> int:
        """Data-parallel replicas."""
    @property
    def replica(self) -> int:
        """This plan's replica."""
    @property
    def global_tokens(self) -> int:
        """Real tokens of the global batch (all replicas)."""
    @property
    def stages(self) -> List[Dict[str, Any]]:
        """Per virtual stage: layers (its [begin, end) range in the model's layer order: a decoder-only model's
        layers; an encoder-decoder model's encoder layers, then its decoder layers), encoder_layers / decoder_layers
        ranges (a decoder-only model's layers are its encoder_layers), embedding, head, loads."""
    @property
    def dtype(self) -> str:
        """Activations' and gradients' dtype between stages."""
    @property
    def loss_mode(self) -> str:
        """'all' or 'targets': which tokens carry loss."""
    @property
    def global_loss_tokens(self) -> int:
        """Loss tokens of the global batch over every replica."""
    @property
    def tied_embedding(self) -> bool:
        """Whether the embedding and the LM head share a weight (REDUCE_TIED)."""
    @property
    def max_seq_len(self) -> int:
        """The context length planned for (0: none): every microbatches[m]["lengths"] entry is at most it;
        position ids restart at 0 for each sample and chunk, so they stay below it."""
    @property
    def max_target_len(self) -> int:
        """Encoder-decoder plans: the decoder side's limit (0: none)."""
    @property
    def dataset(self) -> Optional[Dict[str, Any]]:
        """The dataset its sample refs index (loaders refuse another): None when unknown, else fingerprint (16 hex
        digits, MultiTaskDataset.fingerprint()) and tasks ([{name, samples}] in task order, None if not recorded)."""
    def world_rank(self, replica: int, rank: int) -> int:
        """World rank of pipeline rank `rank` of replica `replica`."""
    @property
    def makespan_ms(self) -> float:
        """Simulated iteration time."""
    @property
    def memory_limit_bytes(self) -> int:
        """Memory limit per device."""
    @property
    def static_bytes(self) -> List[int]:
        """Model state per rank."""
    @property
    def buffer_slots(self) -> List[int]:
        """Buffer slots per rank."""
    @property
    def stored_bytes(self) -> List[int]:
        """Stored activations, [mb * vstages + v]."""
    @property
    def peak_bytes(self) -> List[int]:
        """Transient peaks, [mb * vstages + v]."""
    @property
    def instruction_count(self) -> int:
        """Instructions over every rank."""
    @property
    def shapes(self) -> List[Dict[str, Any]]:
        """Tensor shapes (rows, seq, hidden, enc_seq, dtype, bytes)."""
    @property
    def microbatches(self) -> List[Dict[str, Any]]:
        """Micro-batches (rows, lengths, tokens, loss_weight, samples, refs as (task, index) pairs, offsets (per
        ref, where a chunk of a split sample or a slice starts in its tokens; 0 for a whole sample), row_offsets,
        recompute; slices: prefix (per entry, the kept tokens of its sample before it) and prev (the micro-batch
        holding its previous slice, None for none), both empty without a later slice here)."""
    @property
    def streams(self) -> List[List[Instruction]]:
        """Per rank, a list of Instruction objects (copies)."""
    @property
    def timeline(self) -> List[List[Tuple[str, int, int, float, float]]]:
        """Per rank, the simulated ops (token, mb, vstage, start_ms, end_ms)."""
    def instructions(self, rank: int) -> np.ndarray:
        """Rank's stream as a numpy structured array (-1 = absent)."""
    def validate(self, count_buffers: bool = False) -> Dict[str, Any]:
        """Every check of the validator; a dict with ok, violations and peaks."""
    def validate_or_throw(self) -> None:
        """Raises RuntimeError listing the first violations."""
    def to_json(self, indent: int = 1, rank: int = -1) -> str:
        """The JSON form (one rank's stream with rank >= 0)."""
    @staticmethod
    def from_json(text: str) -> "Plan":
        """A plan from its JSON form."""
    def to_bytes(self, compress: bool = False) -> bytes:
        """The binary form."""
    @staticmethod
    def from_bytes(data: bytes) -> "Plan":
        """A plan from its binary form."""
    def pytorch_exportable(self) -> Tuple[bool, str]:
        """(ok, reason): whether every micro-batch shares one shape."""
    def pytorch_csv(self) -> str:
        """PyTorch compute_only CSV (RuntimeError if shapes differ)."""
    def __eq__(self, other: object) -> bool:
        """Same plan."""

class PlanFileReader:
    """Reads a plan file by iteration (memory-mapped)."""
    def __init__(self, path: str) -> None:
        """Open a plan file."""
    def __len__(self) -> int:
        """Plans in the file."""
    def __getitem__(self, position: int) -> Plan:
        """The plan at `position` in the file."""
    @property
    def iterations(self) -> List[int]:
        """Iteration of each plan, by position."""
    @property
    def path(self) -> str:
        """The file."""
    def read(self, iteration: int, replica: int = 0) -> Plan:
        """The plan of `iteration` for data-parallel `replica` (IndexError if absent)."""
    @property
    def complete(self) -> bool:
        """Whether the file holds every iteration its writer declared (loaders refuse it otherwise)."""
    @property
    def expected_iterations(self) -> int:
        """Iterations the writer declared (0: none declared)."""
    def fingerprint(self) -> str:
        """16 hex digits identifying the plans the file holds."""
    @property
    def dataset(self) -> Optional[Dict[str, Any]]:
        """The dataset the plans index, as Plan.dataset (None: the file records none; loaders read it unchecked)."""

class PlanFileWriter:
    """Writes plans to one file, one iteration at a time."""
    def __init__(self, path: _Path, compress: bool = False, *,
                 inputs: Union[_Path, Sequence[_Path], "MultiTaskDataset"] = ()) -> None:
        """Start a plan file (it appears at close()); ValueError when `path` is one of `inputs` (paths, or the
        MultiTaskDataset the plans index: its manifest and dataset files)."""
    def append(self, plan: Plan) -> None:
        """Append a plan."""
    def close(self) -> None:
        """Write the index and move the file into place."""
    @property
    def plans_written(self) -> int:
        """Plans appended so far."""
    def expect_iterations(self, first_iteration: int, count: int) -> None:
        """Declare the iterations the file will hold; close() marks it complete only if it holds them."""
    def discard(self) -> None:
        """Drop what was written: nothing appears at the path."""
    def __enter__(self) -> "PlanFileWriter":
        """The writer."""
    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """close(), or discard() when the block raised."""

def validate_replicas(plans: List[Plan]) -> List[Dict[str, Any]]:
    """The plans of one iteration's replicas checked against each other; empty when they agree."""

def opcode_names() -> List[str]:
    """Instruction names by opcode value."""

# ---- planner -----------------------------------------------------------------------------------

class MethodFigures:
    """What one method achieves on one global batch (all data-parallel replicas)."""
    @property
    def feasible(self) -> bool:
        """Partitioned, and every replica's schedule within memory."""
    @property
    def microbatches(self) -> int:
        """Micro-batches (all replicas)."""
    @property
    def efficiency(self) -> float:
        """Real tokens / padded tokens."""
    @property
    def iteration_ms(self) -> float:
        """Simulated iteration time, max over replicas (inf when infeasible)."""
    @property
    def peak_mb(self) -> List[float]:
        """Peak memory per pipeline rank, max over replicas (MB = 1e6 bytes)."""
    @property
    def schedule(self) -> str:
        """The schedule used (of replica 0)."""
    @property
    def why(self) -> str:
        """Why infeasible ('' when feasible)."""
    def __getitem__(self, key: str) -> Any:
        """Deprecated (packpipe 0.1 dicts): the attribute `key`, with a DeprecationWarning."""

class BaselineFigures:
    """One baseline of the grid (a method and its setting) on one global batch (read-only)."""
    @property
    def family(self) -> str:
        """fixed, fixed-packed, tokens, packing, packing-mask, wlb or slicing."""
    @property
    def setting(self) -> str:
        """The method and its setting as a user reads it, e.g. 'packing (capacity 4096 x 2 rows)'."""
    @property
    def method(self) -> str:
        """The partition method (PartitionOptions.method)."""
    @property
    def mbs(self) -> int:
        """fixed: samples; packing: rows per micro-batch (else 0)."""
    @property
    def tokens(self) -> int:
        """tokens: padded tokens per micro-batch (else 0)."""
    @property
    def capacity(self) -> int:
        """packing: tokens per row; wlb: tokens per micro-batch (else 0)."""
    @property
    def layout(self) -> str:
        """Its micro-batches' layout."""
    @property
    def figures(self) -> MethodFigures:
        """MethodFigures under baseline_schedule: as run (1F1B over its order, by default) or packpipe's search."""
    @property
    def candidate(self) -> bool:
        """Whether its plan was a candidate for packpipe's (the dp method, and a layout PartitionOptions.layouts lists); False: reported only, and packpipe's plan may be slower."""
    @property
    def scheduled(self) -> bool:
        """Whether a schedule ran (False: its partition failed, or its schedule cannot run the micro-batch count; figures.why says)."""

class IterationResult:
    """The plans and figures of one global batch (read-only)."""
    @property
    def iteration(self) -> int:
        """The iteration planned."""
    @property
    def samples(self) -> int:
        """Samples trained (dropped ones out)."""
    @property
    def tokens(self) -> int:
        """Real tokens trained (truncated samples at their new length)."""
    @property
    def truncated(self) -> int:
        """Samples the oversize policy truncated."""
    @property
    def dropped(self) -> int:
        """Samples the oversize policy dropped."""
    @property
    def seq_truncated(self) -> int:
        """Samples the context length (max_seq_len) truncated."""
    @property
    def seq_dropped(self) -> int:
        """Samples the context length dropped (seq_policy='drop'): in no micro-batch."""
    @property
    def seq_split(self) -> int:
        """Samples the context length split into chunks (seq_policy='split')."""
    @property
    def seq_chunks(self) -> int:
        """Samples of the global batch the split samples became."""
    @property
    def seq_dropped_samples(self) -> npt.NDArray[np.uint32]:
        """Positions of the samples the context length dropped, in the batch as given (plan_batch:
        input_lengths; plan_epoch: the sampled global batch)."""
    @property
    def seq_dropped_refs(self) -> np.ndarray:
        """The dropped samples' refs (PlannedIteration.refs' dtype; empty without refs)."""
    @property
    def trained_input_lengths(self) -> npt.NDArray[np.uint32]:
        """Per sample of the batch planned, the tokens trained: after the context length and the memory
        oversize policy, 0 for a dropped sample; what Plan.microbatches[m]["lengths"] record, in batch order."""
    @property
    def trained_target_lengths(self) -> npt.NDArray[np.uint32]:
        """Decoder tokens trained per sample (encoder-decoder; empty for decoder-only models)."""
    @property
    def trained_loss_tokens(self) -> npt.NDArray[np.uint32]:
        """Loss tokens trained per sample (0 for a dropped sample)."""
    @property
    def model_flops(self) -> float:
        """Forward + backward FLOPs of the real samples (no padding, no recompute)."""
    @property
    def partition(self) -> Partition:
        """packpipe's Partition of the batch (every replica's micro-batches)."""
    @property
    def plans(self) -> List[Plan]:
        """One Plan per data-parallel replica, in replica order."""
    @property
    def schedules(self) -> List[Schedule]:
        """The simulated Schedule of each replica (for traces)."""
    @property
    def packpipe(self) -> MethodFigures:
        """Figures of packpipe's plan."""
    @property
    def source(self) -> str:
        """The partition method's name ('dp': packpipe's), or the setting of the baseline whose plan was simulated
        faster."""
    @property
    def from_baseline(self) -> bool:
        """Whether the plan is a baseline's (source names it)."""
    @property
    def baselines(self) -> List[BaselineFigures]:
        """Every baseline of the grid under baseline_schedule (empty without baselines)."""
    @property
    def fixed(self) -> Any:
        """The fixed entries of baselines (mbs, figures, settings)."""
    @property
    def packing(self) -> Any:
        """The packing entries of baselines (mbs: rows per micro-batch, figures, settings)."""
    @property
    def candidates_ms(self) -> float:
        """Wall time of the baselines' plans as candidates (and their report)."""
    @property
    def partition_ms(self) -> float:
        """Wall time of packpipe's partition."""
    @property
    def schedule_ms(self) -> float:
        """Wall time of the schedule search (all replicas)."""
    @property
    def build_ms(self) -> float:
        """Wall time of building (and validating) the plans."""
    @property
    def planning_ms(self) -> float:
        """Partition, schedule, candidates and build together."""
    @property
    def schedule_note(self) -> str:
        """Why a named schedule was not used (schedule_fallback=True), else ''."""
    def __getitem__(self, key: str) -> Any:
        """Deprecated (packpipe 0.1 dicts): the attribute `key`, with a DeprecationWarning."""

class PlannedIteration:
    """One iteration of plan_epoch(): the sampled batch and its IterationResult."""
    @property
    def loss_tokens(self) -> npt.NDArray[np.uint32]:
        """Tokens of each sample that carry loss, in batch order."""
    @property
    def iteration(self) -> int:
        """The batch's index in its epoch."""
    @property
    def input_lengths(self) -> np.ndarray:
        """uint32 input lengths (decoder-only: whole samples), in batch order, as planning saw them: after the
        context length (max_seq_len: a split sample is one entry per chunk, a dropped one has none), before the
        memory oversize policy. What was trained: trained_input_lengths; before the context length:
        sample_lengths."""
    @property
    def target_lengths(self) -> np.ndarray:
        """uint32 target lengths as planning saw them (encoder-decoder; empty for decoder-only models)."""
    @property
    def refs(self) -> np.ndarray:
        """Each entry's sample in the dataset: a structured array with fields task (u4), index (u8) and offset
        (u4: where a chunk of a sample split at the context length starts in its tokens; 0 for a whole sample)."""
    @property
    def trained_input_lengths(self) -> npt.NDArray[np.uint32]:
        """Tokens each entry of input_lengths trains: after the context length and the memory oversize
        policy, 0 for a dropped sample; what Plan.microbatches[m]["lengths"] record."""
    @property
    def trained_target_lengths(self) -> npt.NDArray[np.uint32]:
        """Decoder tokens each entry trains (encoder-decoder; empty for decoder-only models)."""
    @property
    def trained_loss_tokens(self) -> npt.NDArray[np.uint32]:
        """Loss tokens each entry trains (0 for a dropped sample)."""
    @property
    def sample_lengths(self) -> npt.NDArray[np.uint32]:
        """Per entry of input_lengths, its dataset sample's length before the context length (a chunk: its
        whole sample's; decoder-only: input + target)."""
    @property
    def sample_target_lengths(self) -> npt.NDArray[np.uint32]:
        """Per entry, its dataset sample's target length before the context length (encoder-decoder)."""
    @property
    def result(self) -> IterationResult:
        """The IterationResult."""
    @property
    def blobs(self) -> List[bytes]:
        """Encoded plans, one per replica, with plan_epoch(encode=True); else []."""

class EpochPlanner:
    """The iterations of an epoch planned in parallel and delivered in order (what plan_epoch() returns)."""
    @property
    def iterations(self) -> int:
        """Iterations this run plans (after first_iteration, at most `iterations`)."""
    @property
    def epoch_iterations(self) -> int:
        """Iterations the whole epoch holds."""
    @property
    def vstages(self) -> int:
        """Virtual stages planned for."""
    def __len__(self) -> int:
        """Iterations this run plans."""
    def __iter__(self) -> Iterator[PlannedIteration]:
        """The planner itself."""
    def __next__(self) -> PlannedIteration:
        """The next iteration in order; a planning error is raised here, naming the iteration."""

def plan_batch(cost_model: CostModel, input_lengths: _Lengths, target_lengths: Optional[_Lengths] = None, *,
               shape: PipelineShape = ..., options: PartitionOptions = ..., schedule: str = "search",
               seed: int = 1234, iteration: int = 0, validate: bool = False, baselines: bool = False,
               baseline_mbs: List[int] = ..., cache: Optional[PartitionCache] = None,
               loss_tokens: Optional[_Lengths] = None, loss: str = "all", tied_embedding: bool = False,
               dtype: Optional[str] = None, split_backward: bool = True, schedule_family: str = "any",
               schedule_fallback: bool = False,
               refs: Optional[Union[np.ndarray, Sequence[Tuple[int, ...]]]] = None,
               max_seq_len: int = 0, max_target_len: int = 0, seq_policy: str = "truncate",
               dataset: Optional[MultiTaskDataset] = None, min_gain: float = 0.02,
               baseline_schedule: str = "as-run") -> IterationResult:
    """Plan one global batch (shape defaults to PipelineShape(stages=4)); one Plan per replica.

    dataset: the MultiTaskDataset that refs index (each ref is checked against it); recorded in the plans
    (Plan.dataset) so that loaders refuse another dataset, as plan_epoch's plans are. None: unknown.
    min_gain: packpipe's own partition is the plan only when simulated at least this fraction faster than the
    best baseline's plan, which is the plan otherwise (in [0, 1); 0: the least makespan of all).
    baseline_schedule: what IterationResult.baselines run: 'as-run' (the schedule named, else 1F1B,
    interleaved with chunks, over their order, as their systems run them) or 'search' (packpipe's schedule
    search: the speed-up is the partition's alone). The plans are the same either way.

    A micro-batch's samples are positions in the input_lengths passed. refs: each sample's (task, index) in
    its dataset (a structured array with fields task u4, index u8 and optionally offset u4, as
    PlannedIteration.refs, or (task, index) pairs or (task, index, offset) triples), recorded in
    Plan.microbatches[m]["refs"] (and "offsets"); None: no refs. max_seq_len: the context length (0: none;
    encoder-decoder: the encoder side, max_target_len the decoder side, 0: max_seq_len); seq_policy
    'truncate' keeps a longer sample's first tokens, 'drop' leaves it out (IterationResult.seq_dropped_samples:
    positions in input_lengths), before the memory oversize policy; 'split' needs the samples' tokens
    (plan_epoch) and raises ValueError for a sample over the context length."""

def plan_epoch(cost_model: CostModel, dataset: MultiTaskDataset, *, shape: PipelineShape = ...,
               options: PartitionOptions = ..., global_batch_tokens: int = 0, global_batch_samples: int = 0,
               seed: int = 1234, split: str = "train", epoch: int = 0, first_iteration: int = 0,
               iterations: int = 0, schedule: str = "search", validate: bool = False, baselines: bool = False,
               baseline_mbs: List[int] = ..., threads: int = 0, depth: int = 0, encode: bool = False,
               compress: bool = False, loss: str = "all", tied_embedding: bool = False, dtype: Optional[str] = None,
               split_backward: bool = True, schedule_family: str = "any",
               schedule_fallback: bool = False, max_seq_len: int = 0, max_target_len: int = 0,
               seq_policy: str = "truncate", min_gain: float = 0.02,
               baseline_schedule: str = "as-run") -> EpochPlanner:
    """Plan the iterations of an epoch as `packpipe plan` does: an iterator of PlannedIteration, in order.

    min_gain: as plan_batch's (packpipe's own partition must be simulated this fraction faster than the best
    baseline's plan to be the plan); baseline_schedule: as plan_batch's.

    max_seq_len: the context length, every sample's tokens at most this (0: none; encoder-decoder: the
    encoder side, max_target_len the decoder side, 0: max_seq_len), recorded in the plans
    (Plan.max_seq_len). seq_policy: 'truncate' (keep the first tokens), 'drop' (leave the sample out,
    IterationResult.seq_dropped_refs) or 'split' (decoder-only: consecutive chunks of at most max_seq_len
    tokens, each a sample of its own, as Megatron's --seq-length; refs carry each chunk's offset). Applied
    where each global batch is sampled, before the memory oversize policy (PartitionOptions.oversize)."""

# ---- measurements of executed plans --------------------------------------------------------------

class OpErrors:
    """Errors of one op kind: relative error = (predicted - measured) / measured."""
    @property
    def op(self) -> str:
        """F, B, I, W, send or recv."""
    @property
    def count(self) -> int:
        """Measurements compared (transfers measured at 0 ms left out)."""
    @property
    def median_abs(self) -> float:
        """Median |relative error|."""
    @property
    def p90_abs(self) -> float:
        """90th percentile of |relative error|."""
    @property
    def bias(self) -> float:
        """Median relative error (positive: predicted too long)."""

class IterationCheck:
    """One measured iteration of one replica re-simulated with the cost model."""
    @property
    def iteration(self) -> int:
        """Iteration."""
    @property
    def replica(self) -> int:
        """Replica."""
    @property
    def ops(self) -> int:
        """Compute ops re-simulated."""
    @property
    def predicted_ms(self) -> float:
        """Makespan of the measured per-rank order with the model's op times."""
    @property
    def measured_ms(self) -> float:
        """Measured makespan (nan: unknown)."""
    @property
    def planned_ms(self) -> float:
        """The plan's makespan (nan: unknown)."""
    @property
    def schedule(self) -> str:
        """The plan's schedule kind ('': unknown)."""

class ValidationReport:
    """A cost model against measurements: per-op and per-iteration errors."""
    @property
    def cost_model(self) -> str:
        """The model's description."""
    @property
    def ops(self) -> List[OpErrors]:
        """Per op kind measured."""
    @property
    def iterations(self) -> List[IterationCheck]:
        """Per (iteration, replica)."""
    @property
    def iterations_compared(self) -> int:
        """Iterations with a measured makespan."""
    @property
    def iteration_median_abs(self) -> float:
        """Median |relative error| of their makespans."""
    @property
    def iteration_p90_abs(self) -> float:
        """90th percentile of it."""
    @property
    def iteration_bias(self) -> float:
        """Median relative error of the makespans."""
    @property
    def predicted_ms(self) -> List[float]:
        """The prediction of every measurement, in the set's order."""

def measurements_from(plan: Plan, times: Sequence[Optional[Union[np.ndarray, Sequence[Tuple[int, int]]]]],
                      tp: int = 1, iteration: Optional[int] = None) -> MeasurementSet:
    """Measurements of an executed plan from per-rank (start_ns, end_ns) per instruction (None or []: not recorded);
    `iteration`: the number they carry (None: the plan's)."""

def validate_measurements(cost_model: CostModel, measurements: MeasurementSet) -> ValidationReport:
    """The cost model's op times against every measurement, and each measured iteration re-simulated."""

def fit_schedule_factors(base: CostModel, calibration: Calibration, measurements: MeasurementSet) -> Calibration:
    """`calibration` (fitted over the uncalibrated `base`) with its schedule factors fitted: per schedule kind named by at least 3 iteration lines, the median of measured / re-simulated makespan."""

def validation_plot_json(report: ValidationReport, measurements: MeasurementSet) -> str:
    """Predicted and measured pairs as JSON for a plot (packpipe-validation-plot v1)."""

# ---- loader ------------------------------------------------------------------------------------

class LoadedTensors:
    """The tensors one LOAD_MB brings: int64 token ids, positions and labels of a micro-batch's rows."""
    @property
    def mb(self) -> int:
        """The micro-batch."""
    @property
    def stage(self) -> int:
        """The virtual stage whose LOAD_MB this is."""
    @property
    def rows(self) -> int:
        """Rows of every tensor."""
    @property
    def seq(self) -> int:
        """Columns of the encoder (or whole-sample) tensors: the padded length."""
    @property
    def dec_seq(self) -> int:
        """Columns of the decoder tensors: the padded decoder length (0 for decoder-only plans)."""
    @property
    def loss_tokens(self) -> int:
        """Labels (or decoder labels) other than ignore_index over the micro-batch, whatever the stage loads."""
    @property
    def loads(self) -> List[str]:
        """Names of the tensors the stage loads ('input_ids', 'position_ids', 'labels', ...)."""
    @property
    def tensors(self) -> Dict[str, npt.NDArray[np.int64]]:
        """Name -> read-only int64 array [rows, seq] ([rows, dec_seq] for decoder tensors), zero-copy."""
    @property
    def input_ids(self) -> Optional[npt.NDArray[np.int64]]:
        """Token ids of the encoder (or whole-sample) side, pad_id on padding; None when not loaded."""
    @property
    def position_ids(self) -> Optional[npt.NDArray[np.int64]]:
        """Position within each sample (encoder side), 0 on padding; None when not loaded."""
    @property
    def labels(self) -> Optional[npt.NDArray[np.int64]]:
        """Next-token labels (decoder-only), ignore_index where no loss; None when not loaded."""
    @property
    def decoder_input_ids(self) -> Optional[npt.NDArray[np.int64]]:
        """[decoder_start_id, target[0], ..., target[t - 2]] per sample, pad_id on padding; None when not loaded."""
    @property
    def decoder_labels(self) -> Optional[npt.NDArray[np.int64]]:
        """target[0 .. t - 1] per sample, ignore_index on padding; None when not loaded."""

class RankIteration:
    """One iteration of a RankLoader: the replica's plan and the rank's loads."""
    @property
    def iteration(self) -> int:
        """The iteration."""
    @property
    def plan(self) -> Plan:
        """The replica's plan."""
    @property
    def loads(self) -> List[LoadedTensors]:
        """One per LOAD_MB of the rank's stream, in stream order (rank=None: rank 0's, then rank 1's, ...)."""

class RankLoader:
    """The plans and LOAD_MB tensors of one pipeline rank, assembled ahead on a background thread."""
    def __init__(self, dataset: MultiTaskDataset, planner: Optional[EpochPlanner] = None, *,
                 plan_file: Optional[Union[str, os.PathLike]] = None, first_iteration: int = 0,
                 iterations: int = 0, replica: int = 0, rank: Optional[int] = 0, depth: int = 2,
                 ignore_index: int = -100, pad_id: int = 0, decoder_start_id: int = 0,
                 allow_incomplete: bool = False) -> None:
        """Exactly one of planner (taken over) and plan_file; rank=None: every rank; an incomplete plan
        file only with allow_incomplete=True."""
    @property
    def iterations(self) -> int:
        """Iterations this loader yields."""
    @property
    def position(self) -> int:
        """The iteration number the next __next__ delivers."""
    def __len__(self) -> int:
        """Iterations this loader yields."""
    def __iter__(self) -> Iterator[RankIteration]:
        """The loader itself."""
    def __next__(self) -> RankIteration:
        """The next iteration; an error is raised here, naming the iteration, after every earlier one."""

def microbatch_layout(plan: Plan, mb: int, decoder: bool = False) -> Dict[str, Any]:
    """cu_seqlens (int32), position_ids and segment_ids (int32 [rows, seq]) and max_seqlen of a micro-batch."""

def assemble_microbatch(dataset: MultiTaskDataset, plan: Plan, mb: int, stage: int, *, ignore_index: int = -100,
                        pad_id: int = 0, decoder_start_id: int = 0) -> LoadedTensors:
    """The tensors virtual stage `stage` loads for micro-batch `mb` of a plan made from this dataset."""

# ---- output rules for Python writers (bind_io.cpp) ----------------------------------------------
_Path = Union[str, os.PathLike]
# Outputs: a {name: path or None} dict (the name, e.g. "--out", appears in errors) or paths.
_Outputs = Union[Dict[str, Optional[_Path]], Sequence[_Path], _Path]

def write_file_atomic(path: _Path, data: Union[str, bytes, bytearray, memoryview], *,
                      inputs: Union[_Path, Sequence[_Path]] = (), outputs: _Outputs = (),
                      what: str = "output") -> None:
    """Writes data atomically (temporary beside it, synced, renamed); ValueError when `path` is one of
    `inputs` (by inode) or the same file as one of the job's other `outputs`; RuntimeError when it cannot write."""

def check_outputs(outputs: _Outputs, inputs: Union[_Path, Sequence[_Path]] = (), *, probe: bool = True) -> None:
    """Before any work: ValueError when an output is an input (by inode), two outputs are the same file, or
    (probe) an output cannot be written (a directory, a missing or read-only folder, a busy output)."""

def same_file(a: _Path, b: _Path) -> bool:
    """True if both paths exist and name the same file (same device and inode)."""

def dataset_files(dataset: MultiTaskDataset) -> List[str]:
    """The manifest and every dataset file (.idx, .bin, .bin.zst) of every task: a writer's inputs."""

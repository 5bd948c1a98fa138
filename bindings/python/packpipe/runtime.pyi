"""Type stubs of packpipe.runtime (the executor, from packpipe._core._runtime)."""
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from packpipe._core import Instruction, Plan

class PipelineError(RuntimeError):
    """A plan's execution failed: the message names the rank, iteration, instruction and cause."""

class Buffer:
    """The content of a buffer slot."""
    def __init__(self, nbytes: int, obj: Any = None, data: int = 0, kind: str = "opaque", device: int = -1) -> None:
        """A buffer of `nbytes` logical bytes holding `obj`, its memory at `data` (kind host, device or opaque)."""
    @staticmethod
    def host(nbytes: int) -> "Buffer":
        """A zero-filled host buffer of `nbytes` bytes."""
    @property
    def nbytes(self) -> int:
        """Logical size (the plan's)."""
    @property
    def materialized(self) -> int:
        """Bytes present at data (<= nbytes)."""
    @property
    def kind(self) -> str:
        """'host', 'device' or 'opaque'."""
    @property
    def data(self) -> int:
        """Address of the first byte (0: none)."""
    @property
    def device(self) -> int:
        """CUDA device (-1: none)."""
    @property
    def obj(self) -> Any:
        """The Python object the buffer holds (None: made in C++)."""
    def host_view(self) -> np.ndarray:
        """The materialised bytes of a host buffer as a writable uint8 array."""

class TensorShape:
    """A tensor shape of a plan's shape table."""
    @property
    def rows(self) -> int:
        """Rows."""
    @property
    def seq(self) -> int:
        """Sequence length (decoder side on decoder stages)."""
    @property
    def hidden(self) -> int:
        """Hidden size (1 for loaded token ids)."""
    @property
    def enc_seq(self) -> int:
        """Encoder positions after the decoder's (0: none)."""
    @property
    def dtype(self) -> str:
        """Element type name."""
    @property
    def nbytes(self) -> int:
        """rows x (seq + enc_seq) x hidden x dtype size."""
    @property
    def dims(self) -> Tuple[int, int, int]:
        """(rows, seq + enc_seq, hidden)."""

class OpContext:
    """Where a handler call is and what the plan says about it (a copy Python may keep)."""
    @property
    def rank(self) -> int:
        """Pipeline rank running the stream."""
    @property
    def index(self) -> int:
        """Instruction index in the rank's stream."""
    @property
    def iteration(self) -> int:
        """The plan's iteration."""
    @property
    def replica(self) -> int:
        """The plan's data-parallel replica."""
    @property
    def instruction(self) -> Instruction:
        """The instruction."""
    @property
    def op(self) -> str:
        """Opcode name."""
    @property
    def mb(self) -> Optional[int]:
        """Micro-batch or None."""
    @property
    def stage(self) -> Optional[int]:
        """Virtual stage or None."""
    @property
    def peer(self) -> Optional[int]:
        """Peer rank or None."""
    @property
    def shape(self) -> Optional[TensorShape]:
        """The instruction's shape (loads, receives) or None."""
    @property
    def out_shape(self) -> Optional[TensorShape]:
        """Compute ops: the shape of the buffer they produce when the plan sends it, else None."""
    @property
    def recompute(self) -> str:
        """none, selective or full."""
    @property
    def loss_weight(self) -> float:
        """The micro-batch's loss tokens / global loss tokens."""
    @property
    def loss_tokens(self) -> Optional[int]:
        """The micro-batch's loss tokens (None without a micro-batch)."""

class StageHandler:
    """Compute, loads and memory of one rank: subclass it and override the methods."""
    def __init__(self) -> None:
        """A handler; the executor calls the overridden methods."""

class Transport:
    """How one rank moves buffers: subclass it (send, recv; optionally abort, abort_reason)."""
    def __init__(self, rank: int, ranks: int, memory: str = "host") -> None:
        """This executor's pipeline rank of `ranks`, and the memory kind of its buffers."""
    @property
    def rank(self) -> int:
        """This executor's pipeline rank."""
    @property
    def ranks(self) -> int:
        """The pipeline's ranks."""
    @property
    def aborted_because(self) -> str:
        """Why the pipeline was aborted ('' if it was not)."""

class ExecutorOptions:
    """Timeouts, validation, plan agreement, recording."""
    timeout_s: float
    """Seconds every wait may take (0: forever)."""
    validate: bool
    """Refuse an invalid plan before running it."""
    check_agreement: bool
    """Exchange plan fingerprints with the pipeline neighbours at ITER_BEGIN."""
    record: bool
    """Record each instruction's start and end."""
    def __init__(self, *, timeout_s: float = 300.0, validate: bool = True, check_agreement: bool = True,
                 record: bool = True) -> None:
        """Options; timeout_s 0 waits forever."""

class RankRecord:
    """What one rank's run of one iteration measured (ns on the steady clock)."""
    @property
    def rank(self) -> int:
        """Pipeline rank."""
    @property
    def iteration(self) -> int:
        """The plan's iteration."""
    @property
    def times(self) -> np.ndarray:
        """int64 [instructions, 2]: each instruction's start and end."""
    @property
    def start_ns(self) -> int:
        """The stream's first start."""
    @property
    def end_ns(self) -> int:
        """The stream's last end."""
    @property
    def handler_ns(self) -> int:
        """Time inside handler calls."""
    @property
    def wait_ns(self) -> int:
        """Time inside request waits."""
    @property
    def transport_ns(self) -> int:
        """Time posting sends and receives."""
    @property
    def instructions(self) -> int:
        """Instructions run."""
    @property
    def overhead_ns(self) -> int:
        """Stream wall time minus handler, wait and transport time: the executor's own."""

class Executor:
    """Runs one rank's instruction stream of plans."""
    def __init__(self, handler: StageHandler, transport: Transport, options: ExecutorOptions = ...) -> None:
        """An executor of the transport's rank (both kept alive)."""
    def run(self, plan: Plan) -> RankRecord:
        """Runs this rank's stream of `plan`; raises PipelineError naming rank, iteration, instruction and cause."""
    @property
    def epoch_ns(self) -> int:
        """The records' epoch on the steady clock, ns (time.monotonic_ns() on Linux)."""

def run_local(plan: Plan, handlers: Sequence[StageHandler], options: ExecutorOptions = ...,
              copy: Optional[Callable[[Buffer, Buffer], None]] = None) -> List[RankRecord]:
    """Runs every rank of `plan` on its own thread with the in-process transport; each rank's record."""

def plan_fingerprint(plan: Plan) -> int:
    """64-bit fingerprint of a plan (what ranks compare at ITER_BEGIN)."""

def summarize(runs: List[Tuple[Plan, List[RankRecord]]], time_scale: float = 1.0) -> Dict[str, Any]:
    """Measured against planned: makespans, per-op ratios, executor overhead, wait fraction."""

def trace_json(runs: List[Tuple[Plan, List[RankRecord]]], time_scale: float = 1.0) -> str:
    """Chrome/Perfetto trace JSON: the measured timeline beside the planned one."""

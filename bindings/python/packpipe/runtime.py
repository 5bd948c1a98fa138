"""packpipe.runtime: the executor of plans, driven from Python.

The executor is packpipe's one interpreter of the instruction set (C++, ``runtime/``). Python code
plugs into it in two places, and never re-implements it:

* a :class:`StageHandler` subclass computes: ``load``, ``forward``, ``backward``,
  ``backward_weight``, ``reduce_grad``, ``optimizer_step``, ``allocate`` (receive buffers), and
  optionally ``begin_iteration``, ``end_iteration``, ``reduce_tied`` and ``received``;
* a :class:`Transport` subclass moves buffers: ``send(buffer, peer, channel)`` and
  ``recv(buffer, peer, channel)`` return requests with ``wait(timeout) -> bool`` (False: timed
  out) and ``test() -> bool``; ``abort(why)`` and ``abort_reason()`` end the other ranks' waits.

:class:`Executor` runs one rank's stream (``Executor(handler, transport, options).run(plan)``);
:func:`run_local` runs every rank of a plan on threads of this process over the in-process
transport. Buffers (:class:`Buffer`) carry the plan's logical size, which the executor checks
against the plan before every send and receive; a buffer made from Python holds its object (for
example a torch tensor) until the last copy of the buffer is gone.

Every wait has a deadline (``ExecutorOptions.timeout_s``). A failure on any rank raises
:class:`PipelineError` naming the rank, iteration, instruction and what was awaited, chained to the
Python exception behind it.
"""
from packpipe._core import _runtime as _rt

Buffer = _rt.Buffer
TensorShape = _rt.TensorShape
OpContext = _rt.OpContext
StageHandler = _rt.StageHandler
Transport = _rt.Transport
ExecutorOptions = _rt.ExecutorOptions
RankRecord = _rt.RankRecord
Executor = _rt.Executor
PipelineError = _rt.PipelineError
run_local = _rt.run_local
plan_fingerprint = _rt.plan_fingerprint
summarize = _rt.summarize
trace_json = _rt.trace_json

__all__ = ["Buffer", "TensorShape", "OpContext", "StageHandler", "Transport", "ExecutorOptions", "RankRecord",
           "Executor", "PipelineError", "run_local", "plan_fingerprint", "summarize", "trace_json"]

"""packpipe.runtime from Python: the C++ executor driving stage handlers and transports written in
Python. Payloads derived from (micro-batch, stage, direction) are checked where they arrive, so a
buffer delivered to the wrong place or a handler call out of order fails the test."""
import json
import queue
import sys
import threading
import time

import numpy as np
import pytest

import packpipe
from packpipe import runtime as rt

CM = packpipe.CostModel("gpt-350m", "A100-40GB")
T5 = packpipe.CostModel("t5-770m", "A100-40GB")


def plan_of(stages=4, chunks=1, schedule="1f1b", n=48, seed=0, cost=CM, dp=1):
    rng = np.random.default_rng(seed)
    lens = rng.integers(16, 300, size=n).astype(np.uint32)
    tg = rng.integers(4, 60, size=n).astype(np.uint32) if cost is T5 else None
    res = packpipe.plan_batch(cost, lens, tg, shape=packpipe.PipelineShape(stages=stages, chunks=chunks, dp=dp),
                              schedule=schedule)
    return res.plans


def payload(ctx, kind, nbytes):
    return np.full(nbytes, (ctx.mb * 31 + ctx.stage * 7 + kind) % 251, dtype=np.uint8)


class PayloadHandler(rt.StageHandler):
    """Writes a payload into every output and checks the one it reads."""

    def __init__(self):
        super().__init__()
        self.log = []
        self.iterations = 0

    def host(self, arr):
        return rt.Buffer(arr.nbytes, arr, arr.ctypes.data, "host")

    def begin_iteration(self, plan, rank):
        assert isinstance(plan, packpipe.Plan) and rank < plan.ranks
        self.iterations += 1

    def load(self, ctx):
        self.log.append(("L", ctx.mb, ctx.stage))
        return self.host(np.zeros(ctx.shape.nbytes, np.uint8))

    def forward(self, ctx, x, loaded):
        self.log.append(("F", ctx.mb, ctx.stage))
        if x is not None:
            want = (ctx.mb * 31 + (ctx.stage - 1) * 7 + 1) % 251
            got = x.host_view() if x.kind == "host" else x.obj
            assert (np.asarray(got) == want).all(), f"activation of mb {ctx.mb} into stage {ctx.stage} is wrong"
        if ctx.instruction.out is None:
            return None
        n = ctx.out_shape.nbytes if ctx.out_shape is not None else 8
        return self.host(payload(ctx, 1, n))

    def backward(self, ctx, grad):
        self.log.append((ctx.op, ctx.mb, ctx.stage))
        if grad is not None:
            want = (ctx.mb * 31 + (ctx.stage + 1) * 7 + 2) % 251
            assert (grad.host_view() == want).all(), f"gradient of mb {ctx.mb} into stage {ctx.stage} is wrong"
        if ctx.instruction.out is None:
            return None
        n = ctx.out_shape.nbytes if ctx.out_shape is not None else 8
        return self.host(payload(ctx, 2, n))

    def backward_weight(self, ctx):
        self.log.append(("W", ctx.mb, ctx.stage))

    def reduce_grad(self, ctx):
        self.log.append(("R", None, ctx.stage))

    def optimizer_step(self, ctx):
        self.log.append(("O", None, None))

    def reduce_tied(self, ctx):
        self.log.append(("T", None, ctx.stage))

    def allocate(self, ctx):
        return self.host(np.zeros(ctx.shape.nbytes, np.uint8))


@pytest.mark.parametrize("stages,chunks,schedule,cost", [
    (2, 1, "1f1b", CM), (4, 1, "1f1b", CM), (4, 1, "gpipe", CM), (2, 2, "interleaved-1f1b", CM),
    (4, 1, "zero-bubble", CM), (4, 1, "cyclic", CM), (4, 1, "1f1b", T5), (1, 1, "1f1b", CM)])
def test_python_handlers_run_every_schedule_with_exact_payloads(stages, chunks, schedule, cost):
    for plan in plan_of(stages, chunks, schedule, cost=cost):
        hs = [PayloadHandler() for _ in range(plan.ranks)]
        records = rt.run_local(plan, hs, rt.ExecutorOptions(timeout_s=30))
        assert [r.rank for r in records] == list(range(plan.ranks))
        for r, (h, rec) in enumerate(zip(hs, records)):
            assert h.iterations == 1
            assert rec.instructions == len(plan.streams[r]) and rec.times.shape == (rec.instructions, 2)
            assert (rec.times[:, 1] >= rec.times[:, 0]).all()
            computes = [(i.op, i.mb, i.stage) for i in plan.streams[r] if i.is_compute]
            ran = [(op, mb, st) for op, mb, st in h.log if op in ("F", "BWD", "BWD_I", "W")]
            assert len(ran) == len(computes)
        # Every micro-batch went forward and backward through every stage.
        fwd = sorted((mb, st) for h in hs for op, mb, st in h.log if op == "F")
        assert fwd == sorted((m, v) for m in range(len(plan.microbatches)) for v in range(plan.vstages))
        summary = rt.summarize([(plan, records)])
        assert summary["instructions"] == plan.instruction_count and summary["measured_ms"] > 0
        trace = json.loads(rt.trace_json([(plan, records)]))
        assert any(e.get("ph") == "X" for e in trace["traceEvents"])


def test_a_failing_handler_ends_every_rank_with_the_named_error_and_its_cause():
    plan = plan_of(4)[0]

    class Failing(PayloadHandler):
        def forward(self, ctx, x, loaded):
            if ctx.rank == 2 and ctx.mb == 1:
                raise ValueError("stage exploded")
            return super().forward(ctx, x, loaded)

    t0 = time.monotonic()
    with pytest.raises(rt.PipelineError) as e:
        rt.run_local(plan, [Failing() for _ in range(plan.ranks)], rt.ExecutorOptions(timeout_s=30))
    assert time.monotonic() - t0 < 10  # ended by the abort, not by the timeout
    msg = str(e.value)
    assert "rank 2, iteration 0, instruction" in msg and "FWD mb=1 stage=2" in msg
    assert "ValueError: stage exploded" in msg and "4 of 4 ranks failed" in msg
    assert isinstance(e.value.__cause__, ValueError)


def test_missing_methods_and_wrong_results_are_named():
    plan = plan_of(2)[0]

    class Missing(rt.StageHandler):
        pass

    with pytest.raises(rt.PipelineError, match=r"does not implement (load|allocate)\(\)"):
        rt.run_local(plan, [Missing(), Missing()], rt.ExecutorOptions(timeout_s=10))

    class WrongType(PayloadHandler):
        def allocate(self, ctx):
            return np.zeros(ctx.shape.nbytes, np.uint8)

    with pytest.raises(rt.PipelineError, match="allocate\\(\\) returned ndarray, expected a packpipe.runtime.Buffer"):
        rt.run_local(plan, [WrongType(), WrongType()], rt.ExecutorOptions(timeout_s=10))

    class WrongSize(PayloadHandler):
        def allocate(self, ctx):
            return self.host(np.zeros(ctx.shape.nbytes + 4, np.uint8))

    with pytest.raises(rt.PipelineError, match="receive buffer holds .* bytes, the plan's shape"):
        rt.run_local(plan, [WrongSize(), WrongSize()], rt.ExecutorOptions(timeout_s=10))

    with pytest.raises(ValueError, match="2 handlers for a plan of 4 ranks"):
        rt.run_local(plan_of(4)[0], [PayloadHandler(), PayloadHandler()])


class QueueTransport(rt.Transport):
    """A transport in Python: one queue per (sender, receiver, channel); receives copy on wait."""

    def __init__(self, rank, ranks, queues, abort_flag, drop=False):
        super().__init__(rank, ranks, "host")
        self.queues, self.abort_flag, self.drop = queues, abort_flag, drop

    def q(self, src, dst, channel):
        return self.queues.setdefault((src, dst, channel), queue.Queue())

    def send(self, buf, peer, channel):
        data = buf.host_view().copy()
        if not (self.drop and channel != "control"):
            self.q(self.rank, peer, channel).put(data)
        return Done()

    def recv(self, buf, peer, channel):
        return Pending(self.q(peer, self.rank, channel), buf, self.abort_flag)

    def abort(self, why):
        self.abort_flag.setdefault("why", why)

    def abort_reason(self):
        return self.abort_flag.get("why", "")


class Done:
    def wait(self, timeout):
        return True

    def test(self):
        return True


class Pending:
    def __init__(self, q, buf, flag):
        self.q, self.buf, self.flag = q, buf, flag

    def wait(self, timeout):
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.flag.get("why"):
                return False
            try:
                data = self.q.get(timeout=0.01)
                break
            except queue.Empty:
                if end is not None and time.monotonic() > end:
                    return False
        if data.nbytes != self.buf.nbytes:
            raise RuntimeError(f"size mismatch: sent {data.nbytes}, receive of {self.buf.nbytes}")
        self.buf.host_view()[:] = data
        return True

    def test(self):
        return not self.q.empty()


def run_threads(plan, transports, handlers, timeout_s):
    out, errors = [None] * plan.ranks, [None] * plan.ranks

    def one(r):
        try:
            out[r] = rt.Executor(handlers[r], transports[r], rt.ExecutorOptions(timeout_s=timeout_s)).run(plan)
        except Exception as e:  # noqa: BLE001 - collected for the assertions
            errors[r] = e

    threads = [threading.Thread(target=one, args=(r,)) for r in range(plan.ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s * 4 + 10)
    assert not any(t.is_alive() for t in threads), "an executor thread hung"
    return out, errors


@pytest.mark.parametrize("schedule,chunks", [("1f1b", 1), ("interleaved-1f1b", 2), ("zero-bubble", 1)])
def test_a_transport_written_in_python_carries_a_whole_plan(schedule, chunks):
    plan = plan_of(4 if chunks == 1 else 2, chunks, schedule)[0]
    queues, flag = {}, {}
    ts = [QueueTransport(r, plan.ranks, queues, flag) for r in range(plan.ranks)]
    out, errors = run_threads(plan, ts, [PayloadHandler() for _ in range(plan.ranks)], 30)
    assert errors == [None] * plan.ranks
    assert all(o.instructions == len(plan.streams[r]) for r, o in enumerate(out))


def test_a_lost_message_times_out_on_every_rank_naming_what_was_awaited():
    plan = plan_of(2)[0]
    queues, flag = {}, {}
    ts = [QueueTransport(0, 2, queues, flag, drop=True), QueueTransport(1, 2, queues, flag)]
    t0 = time.monotonic()
    out, errors = run_threads(plan, ts, [PayloadHandler(), PayloadHandler()], 1.0)
    assert time.monotonic() - t0 < 15
    assert all(isinstance(e, rt.PipelineError) for e in errors)
    # Rank 1 waits for the dropped activation. Both waits can expire together under load,
    # so either rank may be the one that times out, but each names the wait it was in.
    assert any("timed out after 1 s waiting for" in str(e) for e in errors)
    assert str(errors[1]).startswith("rank 1, iteration 0")
    assert "waiting for the activation of micro-batch 0 stage 0 from rank 0" in str(errors[1])
    assert "waiting for the gradient of micro-batch 0 stage 1 from rank 1" in str(errors[0])


def test_ranks_running_different_plans_fail_naming_both_fingerprints():
    a, b = plan_of(2, seed=1)[0], plan_of(2, seed=2)[0]
    queues, flag = {}, {}
    ts = [QueueTransport(r, 2, queues, flag) for r in range(2)]
    errors = [None, None]

    def one(r, plan):
        try:
            rt.Executor(PayloadHandler(), ts[r], rt.ExecutorOptions(timeout_s=5)).run(plan)
        except rt.PipelineError as e:
            errors[r] = str(e)

    threads = [threading.Thread(target=one, args=(0, a)), threading.Thread(target=one, args=(1, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(e is not None for e in errors)
    assert any("plan disagreement" in e and f"{rt.plan_fingerprint(a):#018x}" in e and
               f"{rt.plan_fingerprint(b):#018x}" in e for e in errors)


def test_buffers_keep_their_object_alive_and_release_it():
    arr = np.arange(16, dtype=np.uint8)
    before = sys.getrefcount(arr)
    b = rt.Buffer(arr.nbytes, arr, arr.ctypes.data, "host")
    assert sys.getrefcount(arr) == before + 1 and b.obj is arr and b.nbytes == 16 and b.kind == "host"
    view = b.host_view()
    view[0] = 99
    assert arr[0] == 99
    del b, view
    assert sys.getrefcount(arr) == before
    h = rt.Buffer.host(8)
    assert h.obj is None and (h.host_view() == 0).all()
    with pytest.raises(ValueError, match="kind: expected 'host', 'device' or 'opaque'"):
        rt.Buffer(4, None, 0, "gpu")
    with pytest.raises(ValueError, match="needs its data address"):
        rt.Buffer(4, arr, 0, "host")
    with pytest.raises(ValueError, match="not host memory"):
        rt.Buffer(4, arr).host_view()
    with pytest.raises(ValueError, match="timeout_s must be in"):
        rt.ExecutorOptions(timeout_s=-1)

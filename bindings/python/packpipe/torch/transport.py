"""torch.distributed as the runtime's transport, and the process groups a pipeline needs.

Sends and receives are ``isend``/``irecv`` (never blocking: a blocking gloo send deadlocks
interleaved schedules), one process group per channel (activations, gradients, control) so that
each channel's messages match in the order the plan validator checked, whatever the backend (NCCL
orders all point-to-point traffic of one communicator). Control messages (the executor's plan
fingerprints) are host bytes and always travel over a gloo group.

Every wait has a deadline. A rank that fails writes why under a key of the rendezvous store; a
watcher thread on every rank polls that key and a heartbeat, so that a peer's failure or death is
reported by name ("rank 2 (pid 1234) is gone") rather than as a bare connection error.
"""
from __future__ import annotations

import datetime
import os
import socket
import threading
import time
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from packpipe import runtime as rt

CHANNEL_TAGS = {"activation": 0, "gradient": 1, "control": 2}


def _global_rank(group, group_rank: int) -> int:
    if hasattr(dist, "get_global_rank"):
        return dist.get_global_rank(group, group_rank)
    return dist.distributed_c10d._get_global_rank(group, group_rank)  # torch 1.13


class ProcessGroups:
    """The process groups of a pp x dp job with packpipe's rank layout (world rank = replica x pp +
    pipeline rank): per channel the pipeline of this rank's replica, the data-parallel group of this
    rank's pipeline rank (REDUCE_GRAD), and the group of the first and last pipeline ranks of this
    replica (REDUCE_TIED). :meth:`create` is collective: every rank calls it with the same values."""

    def __init__(self, pp: int, dp: int, rank: int, pipeline: Dict[str, object], data, tied, backend: str):
        self.pp, self.dp, self.world_rank = pp, dp, rank
        self.replica, self.pipeline_rank = divmod(rank, pp)
        self.pipeline = pipeline        # channel name -> group
        self.data = data                # group or None when dp == 1
        self.tied = tied                # group or None when pp == 1
        self.backend = backend

    @classmethod
    def create(cls, pp: int, dp: int) -> "ProcessGroups":
        """Creates every group of a pp x dp job (collective over the default group)."""
        if not dist.is_initialized():
            raise RuntimeError("packpipe.torch: torch.distributed is not initialised (init_process_group first, or run "
                               "under python3 -m packpipe.torch.run / torchrun)")
        world = dist.get_world_size()
        if pp < 1 or dp < 1 or pp * dp != world:
            raise ValueError(f"pp {pp} x dp {dp} must equal the world size {world}")
        backend = dist.get_backend()
        me = dist.get_rank()
        mine: Dict[str, object] = {}
        data = tied = None
        for k in range(dp):
            ranks = list(range(k * pp, (k + 1) * pp))
            for channel in ("activation", "gradient", "control"):
                g = dist.new_group(ranks, backend="gloo" if channel == "control" else None)
                if me in ranks:
                    mine[channel] = g
        for r in range(pp):
            ranks = [k * pp + r for k in range(dp)]
            g = dist.new_group(ranks)
            if me in ranks:
                data = g
        for k in range(dp):
            ranks = sorted({k * pp, k * pp + pp - 1})
            g = dist.new_group(ranks)
            if me in ranks and pp > 1:
                tied = g
        return cls(pp, dp, me, mine, data if dp > 1 else None, tied, backend)

    def world_of(self, pipeline_rank: int) -> int:
        """World rank of a pipeline rank of this rank's replica."""
        return self.replica * self.pp + pipeline_rank


class Monitor:
    """Liveness and abort signalling through the rendezvous store: each rank publishes its host and
    pid and a heartbeat; abort() writes the reason for every rank to see; a watcher thread polls."""

    def __init__(self, store, world_rank: int, world_size: int, interval_s: float = 0.5, namespace: str = "packpipe"):
        self.store = dist.PrefixStore(f"{namespace}/", store)
        self.rank, self.world = world_rank, world_size
        self.interval = interval_s
        self._reason = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # PACKPIPE_HOSTNAME names this rank's host in place of the machine's name: ranks under different
        # names count as different hosts (no common clock), which lets node groups on one machine act as
        # the nodes of a multi-node job.
        self.host = os.environ.get("PACKPIPE_HOSTNAME") or socket.gethostname()
        self.store.set(f"pid/{world_rank}", f"{self.host}:{os.getpid()}")
        self._beat()
        # Every rank's host and pid, read once (the store may die with its host later).
        self.peers: Dict[int, tuple] = {}
        self.store.wait([f"pid/{r}" for r in range(world_size)])
        for r in range(world_size):
            host, pid = self.store.get(f"pid/{r}").decode().rsplit(":", 1)
            self.peers[r] = (host, int(pid))
        self._thread = threading.Thread(target=self._watch, name="packpipe-monitor", daemon=True)
        self._thread.start()

    def _beat(self):
        self.store.set(f"hb/{self.rank}", repr(time.time()))

    def _aborted(self) -> str:
        """The abort reason another rank published ('' if none): the first claimant's, else any that
        is written. The flag counts ranks whose reason is written (a counter, which torch 1.13's
        stores read without blocking: add 0); a claimant that has not written its reason yet (slowed
        by load, or dying) is waited for a moment, then passed over for another one's."""
        if self.store.add("abort_flag", 0) <= 0:
            return ""
        claims = self.store.add("abort_claim", 0)
        first = self._get("abort/1", timeout_s=1.0)
        if first is not None:
            return first
        for k in range(2, claims + 1):
            why = self._get(f"abort/{k}", timeout_s=0.05)
            if why is not None:
                return why
        return "aborted (no reason recorded)"

    def _get(self, key: str, timeout_s: float = 0.2) -> Optional[str]:
        try:
            self.store.wait([key], datetime.timedelta(seconds=timeout_s))
            return self.store.get(key).decode(errors="replace")
        except Exception:
            return None

    def _watch(self):
        while not self._stop.wait(self.interval):
            try:
                self._beat()
                why = self._aborted()
                if why:
                    self._set(why)
            except Exception as e:  # the store is gone: its host (the launcher or rank 0) died
                self._set(f"the rendezvous store is unreachable ({type(e).__name__}: {e}); its host died")
                return

    def _set(self, why: str):
        with self._lock:
            if not self._reason:
                self._reason = why

    def abort(self, why: str) -> None:
        """Tells every rank the pipeline is aborted (the first reason wins)."""
        self._set(why)
        try:
            # Each rank writes its own reason under its claim's number, then counts itself in the flag:
            # a reader never waits on a claimant that died between its claim and its reason.
            k = self.store.add("abort_claim", 1)
            self.store.set(f"abort/{k}", why)
            self.store.add("abort_flag", 1)
        except Exception:
            pass

    def linger(self, timeout_s: float = 5.0) -> None:
        """On a failed iteration, after this rank's error is composed: counts this rank as finished,
        then waits (at most `timeout_s`) until every other rank has finished too or is gone, so that
        this rank's exit (the rendezvous store may die with it) never takes the abort reason away
        from a rank that has not read it yet."""
        try:
            self.store.add(f"done/{self.rank}", 1)
        except Exception:
            return  # the store is gone already: nothing to keep for anyone
        end = time.monotonic() + timeout_s
        pending = [r for r in self.peers if r != self.rank]
        while pending and time.monotonic() < end:
            still = []
            for r in pending:
                host, pid = self.peers[r]
                try:
                    finished = self.store.add(f"done/{r}", 0) > 0
                except Exception:
                    return
                if not finished and not (host == self.host and not _alive(pid)):
                    still.append(r)
            pending = still
            if pending:
                time.sleep(0.05)

    def reason(self) -> str:
        with self._lock:
            return self._reason

    def close(self):
        self._stop.set()

    def diagnose(self, settle_s: float = 0.0) -> str:
        """Which ranks are gone (dead process on this host, or a stale heartbeat elsewhere), and the
        abort reason another rank published; '' when nothing is known. A dead peer's sockets close a
        moment before its process is seen gone: with `settle_s`, look again for that long while
        nothing is found."""
        end = time.monotonic() + settle_s
        while True:
            known = self._diagnose_once()
            if known or time.monotonic() >= end:
                return known
            time.sleep(0.05)

    def _diagnose_once(self) -> str:
        notes: List[str] = []
        store_ok = True
        try:
            why = self._aborted()
            if why:
                notes.append("aborted by " + why)
        except Exception as e:
            store_ok = False
            notes.append(f"the rendezvous store is unreachable ({type(e).__name__}: its host ended)")
        now = time.time()
        for r, (host, pid) in sorted(self.peers.items()):
            if r == self.rank:
                continue
            if host == self.host:
                if not _alive(pid):
                    notes.append(f"world rank {r} (pid {pid}) is gone")
                continue
            beat = self._get(f"hb/{r}") if store_ok else None
            if beat is not None and now - float(beat) > 4 * self.interval + 1:
                notes.append(f"world rank {r} (pid {pid} on {host}) sent no heartbeat for {now - float(beat):.1f} s")
        return "; ".join(notes)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    except OSError:
        return True


class _Request:
    def __init__(self, transport: "TorchTransport", work, tensor, peer: int, channel: str, what: str, on_done=None):
        self.t, self.work, self.tensor = transport, work, tensor
        self.peer, self.channel, self.what = peer, channel, what
        self.on_done = on_done
        self.done = False

    def wait(self, timeout: Optional[float]) -> bool:
        """True once complete; False when the deadline passed or the pipeline was aborted."""
        if self.done:
            return True
        if self.t.monitor is not None and self.t.monitor.reason():
            return False
        # timedelta(0) is torch's "no timeout" (the process group's own then applies).
        span = datetime.timedelta(0) if timeout is None else datetime.timedelta(seconds=max(timeout, 0.001))
        try:
            ok = self.work.wait(span)
        except RuntimeError as e:
            if "imed out" in str(e):
                return False
            raise RuntimeError(self.t.explain(self.peer, self.what, e)) from e
        if ok is False:  # the backend aborted the work
            return False
        self.done = True
        if self.on_done is not None:
            self.on_done()
        return True

    def test(self) -> bool:
        return self.done or bool(self.work.is_completed())


class TorchTransport(rt.Transport):
    """The runtime's transport over torch.distributed point-to-point (gloo on CPU, NCCL on GPU)."""

    def __init__(self, groups: ProcessGroups, monitor: Optional[Monitor], device: torch.device):
        super().__init__(groups.pipeline_rank, groups.pp, "opaque")
        self.groups = groups
        self.monitor = monitor
        self.device = device

    def _tensor(self, buf: rt.Buffer, channel: str):
        obj = buf.obj
        if isinstance(obj, torch.Tensor):
            return obj, None
        if buf.kind != "host":
            raise TypeError(f"TorchTransport: a {channel} buffer holds {type(obj).__name__}, expected a torch.Tensor")
        host = torch.from_numpy(buf.host_view())  # control bytes: host memory the executor owns
        return host, None

    def send(self, buf: rt.Buffer, peer: int, channel: str):
        t, _ = self._tensor(buf, channel)
        work = dist.isend(t, dst=self.groups.world_of(peer), group=self.groups.pipeline[channel],
                          tag=CHANNEL_TAGS[channel])
        return _Request(self, work, t, peer, channel, f"send of the {channel} to pipeline rank {peer}")

    def recv(self, buf: rt.Buffer, peer: int, channel: str):
        t, _ = self._tensor(buf, channel)
        work = dist.irecv(t, src=self.groups.world_of(peer), group=self.groups.pipeline[channel],
                          tag=CHANNEL_TAGS[channel])
        return _Request(self, work, t, peer, channel, f"receive of the {channel} from pipeline rank {peer}")

    def abort(self, why: str) -> None:
        if self.monitor is not None:
            self.monitor.abort(f"world rank {self.groups.world_rank}: {why}")

    def abort_reason(self) -> str:
        return self.monitor.reason() if self.monitor is not None else ""

    def explain(self, peer: int, what: str, e: Exception, settle_s: float = 2.0) -> str:
        """A backend error, with what the monitor knows of the other ranks."""
        known = self.monitor.diagnose(settle_s) if self.monitor is not None else ""
        return (f"{what} (world rank {self.groups.world_of(peer)}) failed: {e}" +
                (f" [{known}]" if known else ""))


def default_store():
    """The rendezvous store of the default process group."""
    return dist.distributed_c10d._get_default_store()

"""Start the ranks of a packpipe.torch job on this machine.

    python3 -m packpipe.torch.run --nproc-per-node 4 examples/train_gpt.py --pp 2 --dp 2

Each rank is a process of ``script`` with the environment torchrun gives (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT on a free port), its output prefixed with
its rank. When a rank fails, the launcher names it and how it ended, gives the others a grace
period to end on their own (they do: packpipe's waits have timeouts and report the dead peer), then
stops them. SIGINT, SIGTERM and SIGHUP to the launcher, and its --timeout (which counts from before
the first rank starts), stop every rank's process group (SIGTERM, then SIGKILL 2 s later); no rank
outlives the launcher. At most MAX_NPROC ranks are started, and MAX_NPROC_PER_CORE per CPU core.
It starts the ranks of one machine (torchrun --standalone); for several machines use torchrun with a
c10d rendezvous (docs/guide.md, section 9). It works the same on every torch version; torchrun also works
(``python3 -m torch.distributed.run --standalone --nproc_per_node N --redirects 1 --tee 1`` on
Debian's torch 1.13 with Python 3.11, whose launcher otherwise fails in ``to_map``).
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import List, Optional

from packpipe import _check


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pump(stream, prefix: str, out):
    for line in iter(stream.readline, b""):
        out.write(prefix + line.decode(errors="replace"))
        out.flush()
    stream.close()


def _ending(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# At most this many ranks, and at most this many per CPU core: each rank is an interpreter with torch
# (hundreds of MB); beyond that a machine swaps or runs out of processes long before the job starts.
MAX_NPROC = 1024
MAX_NPROC_PER_CORE = 16
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_KILL_WAIT_S = 2.0  # how long stopped ranks get between SIGTERM and SIGKILL


def max_nproc() -> int:
    """The most ranks launch() starts on this machine: MAX_NPROC, and MAX_NPROC_PER_CORE per core."""
    return min(MAX_NPROC, MAX_NPROC_PER_CORE * (os.cpu_count() or 1))


def _stop_all(procs: List[subprocess.Popen], sig) -> None:
    """Sends `sig` to the process group of every rank still running (each rank leads its own)."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _terminate(procs: List[subprocess.Popen], wait_s: float = _KILL_WAIT_S) -> None:
    """SIGTERM to every rank's process group, then SIGKILL to those still running after `wait_s`."""
    _stop_all(procs, signal.SIGTERM)
    end = time.monotonic() + wait_s
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    _stop_all(procs, signal.SIGKILL)


def launch(script: List[str], nproc: int, *, port: Optional[int] = None, grace_s: float = 30.0,
           timeout_s: float = 0.0, python: str = sys.executable, env: Optional[dict] = None) -> int:
    """Runs `nproc` ranks of `script` (argv) and returns the job's exit code (0: every rank
    succeeded; otherwise the first failing rank's code, 124 when `timeout_s` passed (spawning
    included), 128 + the signal when SIGINT, SIGTERM or SIGHUP stopped the launcher). Whatever ends
    the launcher, every rank's process group is stopped (SIGTERM, then SIGKILL) before it returns.
    `nproc` in [1, max_nproc()], `port` 0 / None (a free one) or in [1, 65535], `grace_s` and
    `timeout_s` (0: none) finite in [0, 1e9]: ValueError otherwise."""
    where = "packpipe.torch.run.launch"
    if not isinstance(script, (list, tuple)) or not script or not all(isinstance(x, str) for x in script):
        raise TypeError(f"{where}: script must be a non-empty list of str (the script and its arguments), found "
                        f"{script!r}"[:200])
    nproc = _check.integer(where, "nproc", nproc, 1, max_nproc())
    port = _check.integer(where, "port", port, 0, 65535) if port is not None else 0
    grace_s = _check.number(where, "grace_s", grace_s, 0, _check.MAX_TIMEOUT_S)
    timeout_s = _check.number(where, "timeout_s", timeout_s, 0, _check.MAX_TIMEOUT_S)
    port = port or free_port()
    procs: List[subprocess.Popen] = []
    pumps = []
    stop = {"signal": None}

    def on_signal(sig, _frame):
        stop["signal"] = sig  # acted on by the loops below, which stop every rank

    # Installed before the first rank starts: a signal while spawning stops what was started.
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in _STOP_SIGNALS:
            previous[sig] = signal.signal(sig, on_signal)
    start = time.monotonic()

    def timed_out() -> bool:
        return timeout_s > 0 and time.monotonic() - start > timeout_s

    base = dict(os.environ if env is None else env)
    code: Optional[int] = None
    failed: Optional[int] = None  # the first rank that failed
    try:
        for r in range(nproc):
            if stop["signal"] is not None or timed_out():
                break
            e = dict(base, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                     GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
            try:
                p = subprocess.Popen([python] + script, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
            except OSError as err:
                sys.stderr.write(f"packpipe.torch.run: could not start rank {r} of {nproc}: {err}; stopping the "
                                 f"{len(procs)} started\n")
                code = 1
                break
            procs.append(p)
            t = threading.Thread(target=_pump, args=(p.stdout, f"[rank {r}] ", sys.stdout), daemon=True)
            t.start()
            pumps.append(t)
        failed_at = 0.0
        while code is None:
            if stop["signal"] is not None:
                sig = signal.Signals(stop["signal"])
                sys.stderr.write(f"packpipe.torch.run: {sig.name} received; stopping every rank\n")
                code = 128 + sig.value
                break
            if timed_out():
                sys.stderr.write(f"packpipe.torch.run: the job ran longer than {timeout_s:g} s; stopping it\n")
                code = 124
                break
            if [p.poll() for p in procs].count(None) == 0:  # poll every rank (all() would stop at the first)
                break
            time.sleep(0.05)
            if failed is None:
                for r, p in enumerate(procs):
                    if p.returncode is not None and p.returncode != 0:
                        failed, failed_at = r, time.monotonic()
                        sys.stderr.write(f"packpipe.torch.run: rank {r} (pid {p.pid}) {_ending(p.returncode)}; "
                                         f"waiting up to {grace_s:g} s for the other ranks to end\n")
                        break
            elif time.monotonic() - failed_at > grace_s:
                sys.stderr.write(f"packpipe.torch.run: stopping the ranks still running {grace_s:g} s after rank "
                                 f"{failed} failed\n")
                _terminate(procs)
    finally:
        # However the launcher leaves (a signal, the timeout, an error of its own), no rank outlives it.
        _terminate(procs)
        for p in procs:
            p.wait()
        for t in pumps:
            t.join(timeout=2)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code is None and failed is not None:
        rc = procs[failed].returncode
        code = rc if rc > 0 else 1
    if code is None:
        code = 0
        for r, p in enumerate(procs):
            if p.returncode != 0:
                sys.stderr.write(f"packpipe.torch.run: rank {r} (pid {p.pid}) {_ending(p.returncode)}\n")
                code = p.returncode if p.returncode > 0 else 1
                break
    return code


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m packpipe.torch.run", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc", type=_check.arg_int(1, max_nproc()),
                    required=True, help=f"ranks to start (this machine only; at most {MAX_NPROC} and "
                                        f"{MAX_NPROC_PER_CORE} per CPU core: {max_nproc()} here)")
    ap.add_argument("--master-port", "--master_port", dest="port", type=_check.arg_int(0, 65535, "0: a free one"),
                    default=0, help="rendezvous port (default: a free one)")
    ap.add_argument("--grace", type=_check.arg_float(0, _check.MAX_TIMEOUT_S), default=30.0,
                    help="seconds the other ranks get after one fails")
    ap.add_argument("--timeout", type=_check.arg_float(0, _check.MAX_TIMEOUT_S, "0: never"), default=0.0,
                    help="stop the job after this many seconds, starting the ranks included (0: never)")
    ap.add_argument("--standalone", action="store_true", help="accepted for torchrun compatibility (always true)")
    # torchrun's options for several machines: parsed (so that their values are not taken for the
    # script) and refused unless they describe this one machine
    multi = ap.add_argument_group("several machines (torchrun's options; this launcher starts one machine's ranks)")
    multi.add_argument("--nnodes", help="accepted as 1 (or 1:1); more machines: use torchrun")
    multi.add_argument("--node-rank", "--node_rank", dest="node_rank", help="accepted as 0")
    for name in ("--rdzv-endpoint", "--rdzv-backend", "--rdzv-id", "--master-addr"):
        multi.add_argument(name, name.replace("-", "_").replace("__", "--"), dest=name[2:].replace("-", "_"),
                           help="refused: use torchrun")
    ap.add_argument("script", help="the training script")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = ap.parse_args(argv)
    several = [f"--nnodes {a.nnodes}"] if a.nnodes not in (None, "1", "1:1") else []
    several += [f"--node-rank {a.node_rank}"] if a.node_rank not in (None, "0") else []
    several += [f"--{n.replace('_', '-')} {getattr(a, n)}" for n in ("rdzv_endpoint", "rdzv_backend", "rdzv_id",
                                                                      "master_addr") if getattr(a, n) is not None]
    if several:
        ap.error(f"{', '.join(several)}: this launcher starts the ranks of one machine (torchrun --standalone); "
                 f"for several machines run torchrun with a c10d rendezvous on each (docs/guide.md, section 9)")
    return launch([a.script] + a.args, a.nproc, port=a.port or None, grace_s=a.grace, timeout_s=a.timeout)


if __name__ == "__main__":
    sys.exit(main())

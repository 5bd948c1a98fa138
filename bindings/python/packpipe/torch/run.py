"""Start the ranks of a packpipe.torch job on this machine.

    python3 -m packpipe.torch.run --nproc-per-node 4 examples/train_gpt.py --pp 2 --dp 2

Each rank is a process of ``script`` with the environment torchrun gives (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT on a free port), its output prefixed with
its rank. When a rank fails, the launcher names it and how it ended, gives the others a grace
period to end on their own (they do: packpipe's waits have timeouts and report the dead peer), then
stops them. It works the same on every torch version; torchrun also works
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


def launch(script: List[str], nproc: int, *, port: Optional[int] = None, grace_s: float = 30.0,
           timeout_s: float = 0.0, python: str = sys.executable, env: Optional[dict] = None) -> int:
    """Runs `nproc` ranks of `script` (argv) and returns the job's exit code (0: every rank
    succeeded; otherwise the first failing rank's code, or 124 when `timeout_s` passed)."""
    port = port or free_port()
    procs: List[subprocess.Popen] = []
    pumps = []
    base = dict(os.environ if env is None else env)
    for r in range(nproc):
        e = dict(base, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                 GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
        p = subprocess.Popen([python] + script, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
        procs.append(p)
        t = threading.Thread(target=_pump, args=(p.stdout, f"[rank {r}] ", sys.stdout), daemon=True)
        t.start()
        pumps.append(t)

    def stop_all(sig):
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    signal.signal(signal.SIGTERM, lambda *_: stop_all(signal.SIGTERM))
    start = time.monotonic()
    failed: Optional[int] = None
    failed_at = 0.0
    code = 0
    try:
        while [p.poll() for p in procs].count(None) > 0:  # poll every rank (any() would stop at the first)
            time.sleep(0.05)
            if failed is None:
                for r, p in enumerate(procs):
                    if p.returncode is not None and p.returncode != 0:
                        failed, failed_at, code = r, time.monotonic(), p.returncode if p.returncode > 0 else 1
                        sys.stderr.write(f"packpipe.torch.run: rank {r} (pid {p.pid}) {_ending(p.returncode)}; "
                                         f"waiting up to {grace_s:g} s for the other ranks to end\n")
                        break
            elif time.monotonic() - failed_at > grace_s:
                sys.stderr.write(f"packpipe.torch.run: stopping the ranks still running {grace_s:g} s after rank "
                                 f"{failed} failed\n")
                stop_all(signal.SIGTERM)
                time.sleep(2)
                stop_all(signal.SIGKILL)
            if timeout_s > 0 and time.monotonic() - start > timeout_s:
                sys.stderr.write(f"packpipe.torch.run: the job ran longer than {timeout_s:g} s; stopping it\n")
                stop_all(signal.SIGTERM)
                time.sleep(2)
                stop_all(signal.SIGKILL)
                code = 124
                break
    except KeyboardInterrupt:
        stop_all(signal.SIGINT)
        code = 130
    for p in procs:
        p.wait()
    for t in pumps:
        t.join(timeout=2)
    if code == 0:
        for r, p in enumerate(procs):
            if p.returncode != 0:
                sys.stderr.write(f"packpipe.torch.run: rank {r} (pid {p.pid}) {_ending(p.returncode)}\n")
                code = p.returncode if p.returncode > 0 else 1
                break
    return code


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m packpipe.torch.run", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc", type=int, required=True,
                    help="ranks to start (this machine only)")
    ap.add_argument("--master-port", "--master_port", dest="port", type=int, default=0,
                    help="rendezvous port (default: a free one)")
    ap.add_argument("--grace", type=float, default=30.0, help="seconds the other ranks get after one fails")
    ap.add_argument("--timeout", type=float, default=0.0, help="stop the job after this many seconds (0: never)")
    ap.add_argument("--standalone", action="store_true", help="accepted for torchrun compatibility (always true)")
    ap.add_argument("script", help="the training script")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = ap.parse_args(argv)
    if a.nproc < 1:
        ap.error(f"--nproc-per-node must be at least 1, found {a.nproc}")
    return launch([a.script] + a.args, a.nproc, port=a.port or None, grace_s=a.grace, timeout_s=a.timeout)


if __name__ == "__main__":
    sys.exit(main())

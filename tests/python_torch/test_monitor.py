"""The pipeline's abort signalling through the rendezvous store (packpipe.torch.transport.Monitor):
every rank reads the first claimant's reason, and a claimant that dies between its claim and its
reason (or is slowed by load) never leaves the others with "no reason recorded"."""
import os
import threading
import time

import torch.distributed as dist

from packpipe.torch.transport import Monitor


def monitor(store, rank=0):
    return Monitor(store, rank, 1, interval_s=3600)  # no watcher poll during the test


def test_the_first_claimants_reason_is_read():
    store = dist.HashStore()
    m = monitor(store)
    try:
        assert m._aborted() == ""
        m.abort("rank 1, iteration 0: the stage failed")
        m.abort("rank 2: connection closed by peer")
        assert m._aborted() == "rank 1, iteration 0: the stage failed"
        assert m.reason() == "rank 1, iteration 0: the stage failed"
    finally:
        m.close()


def test_a_claimant_that_died_before_its_reason_is_passed_over():
    store = dist.HashStore()
    m = monitor(store)
    try:
        dist.PrefixStore("packpipe/", store).add("abort_claim", 1)  # claimed, then died: no reason, no flag
        assert m._aborted() == ""  # nobody has finished an abort yet
        m.abort("rank 2: the culprit's stage failed")
        assert m._aborted() == "rank 2: the culprit's stage failed"
        assert m.diagnose().startswith("aborted by rank 2: the culprit's stage failed")
    finally:
        m.close()


def test_linger_waits_for_the_other_ranks_then_returns():
    """A failed rank stays until every other rank has its error (or is gone), at most its timeout:
    its exit may take the rendezvous store, and the abort reason, with it."""
    store = dist.HashStore()
    m = monitor(store)
    try:
        m.peers = {0: m.peers[0], 1: (m.host, os.getpid())}  # a live peer on this host, not finished
        t0 = time.monotonic()
        threading.Timer(0.5, lambda: dist.PrefixStore("packpipe/", store).add("done/1", 1)).start()
        m.linger(timeout_s=5.0)
        waited = time.monotonic() - t0
        assert 0.4 < waited < 4.0, waited  # until the other rank finished, not the whole timeout
        dist.PrefixStore("packpipe/", store).add("done/1", -1)  # unfinished again
        t0 = time.monotonic()
        m.linger(timeout_s=0.3)
        assert time.monotonic() - t0 < 2.0  # bounded when a rank never finishes
    finally:
        m.close()

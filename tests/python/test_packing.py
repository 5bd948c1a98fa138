"""packpipe.pack: packing from numpy arrays, row tensors, argument checks."""
import numpy as np
import pytest

import packpipe


def check_rows(res, lengths, capacity, targets=None, target_capacity=0):
    n = len(lengths)
    assert res.row_offsets[0] == 0 and res.row_offsets[-1] == n and len(res.row_offsets) == res.rows + 1
    assert np.array_equal(np.sort(res.samples), np.arange(n, dtype=np.uint32))  # each sample exactly once
    for r in range(res.rows):
        ids = res.samples[res.row_offsets[r]:res.row_offsets[r + 1]]
        assert len(ids) > 0
        assert lengths[ids].sum() == res.row_tokens[r] <= capacity
        if targets is not None:
            assert targets[ids].sum() == res.row_target_tokens[r] <= target_capacity
    total = int(lengths.sum()) + (int(targets.sum()) if targets is not None else 0)
    assert res.efficiency == pytest.approx(total / (res.rows * (capacity + target_capacity)))


@pytest.mark.parametrize("algorithm", ["ffd", "bfd", "histogram"])
def test_pack_properties(algorithm):
    rng = np.random.default_rng(7)
    for _ in range(30):
        cap = int(rng.integers(16, 4096))
        lengths = np.clip(rng.lognormal(np.log(cap / 10), 1.0, size=int(rng.integers(0, 2000))), 1, cap).astype(np.uint32)
        res = packpipe.pack(lengths, cap, algorithm=algorithm)
        assert res.algorithm == algorithm and res.capacity == cap and len(res) == res.rows
        if len(lengths):
            check_rows(res, lengths, cap)
            assert res.rows >= -(-int(lengths.sum()) // cap)
        again = packpipe.pack(lengths, cap, algorithm=algorithm)
        assert np.array_equal(again.samples, res.samples)


def test_two_dimensional_and_row():
    rng = np.random.default_rng(11)
    inp = rng.integers(1, 512, size=500, dtype=np.uint32)
    tgt = rng.integers(0, 128, size=500, dtype=np.uint32)
    for algorithm in ("ffd", "bfd"):
        res = packpipe.pack(inp, 1024, algorithm=algorithm, target_lengths=tgt, target_capacity=256)
        check_rows(res, inp, 1024, tgt, 256)
        assert res.target_capacity == 256
        assert np.array_equal(res.row(0), res.samples[:res.row_offsets[1]])
        assert np.array_equal(res.row(-1), res.samples[res.row_offsets[-2]:])
    with pytest.raises(IndexError, match="out of range"):
        res.row(res.rows)


def test_arrays_are_zero_copy_views():
    lengths = np.array([5, 3, 8, 2, 7], dtype=np.uint32)
    res = packpipe.pack(lengths, 10)
    s = res.samples
    assert not s.flags.writeable and s.base is not None
    del res  # the view keeps the packing alive
    assert sorted(s.tolist()) == [0, 1, 2, 3, 4]


def test_row_tensors():
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 200, size=300, dtype=np.uint32)
    res = packpipe.pack(lengths, 256)
    t = res.row_tensors()
    assert t["position_ids"].shape == (res.rows, 256) and t["position_ids"].dtype == np.int32
    assert t["segment_ids"].shape == (res.rows, 256)
    assert t["max_seqlen"] == lengths.max()
    for r in range(res.rows):
        ids = res.row(r)
        at = 0
        for seg, i in enumerate(ids, start=1):
            n = int(lengths[i])
            assert np.array_equal(t["position_ids"][r, at:at + n], np.arange(n))
            assert (t["segment_ids"][r, at:at + n] == seg).all()
            at += n
        assert (t["segment_ids"][r, at:] == 0).all()
    # every sample and every padded tail is one segment of cu_seqlens
    assert t["cu_seqlens"][-1] == res.rows * 256 and (np.diff(t["cu_seqlens"]) > 0).all()
    wide = res.row_tensors(padded_len=300)
    assert wide["position_ids"].shape == (res.rows, 300)
    with pytest.raises(ValueError, match="more than the padded length"):
        res.row_tensors(padded_len=8)
    # the message gives the row's whole token count (it gave the prefix that first passed the length: 4 of 9)
    with pytest.raises(ValueError, match="row 0 holds 9 tokens, more than the padded length 1"):
        packpipe.pack(np.array([3, 4, 2], np.uint32), 10).row_tensors(1)


def test_pack_rejects_bad_arguments():
    good = np.array([3, 9, 4], dtype=np.uint32)
    with pytest.raises(ValueError, match="sample 1 has 9 tokens, more than the capacity 8"):
        packpipe.pack(good, 8)
    with pytest.raises(ValueError, match="capacity must be positive"):
        packpipe.pack(good, 0)
    with pytest.raises(ValueError, match="lengths must have dtype uint32, found int64"):
        packpipe.pack(good.astype(np.int64), 16)
    with pytest.raises(ValueError, match="lengths must be 1-D"):
        packpipe.pack(good.reshape(3, 1), 16)
    with pytest.raises(ValueError, match="lengths must be C-contiguous"):
        packpipe.pack(np.arange(6, dtype=np.uint32)[::2], 16)
    with pytest.raises(ValueError, match="target_lengths must have dtype uint32"):
        packpipe.pack(good, 16, target_lengths=good.astype(np.float32), target_capacity=4)
    with pytest.raises(ValueError, match="target_lengths has 2 entries, lengths has 3"):
        packpipe.pack(good, 16, target_lengths=good[:2].copy(), target_capacity=4)
    with pytest.raises(ValueError, match="target capacity is 0"):
        packpipe.pack(good, 16, target_lengths=good)
    with pytest.raises(ValueError, match="sample 1 has 9 target tokens"):
        packpipe.pack(good, 16, target_lengths=good, target_capacity=8)
    with pytest.raises(ValueError, match="unknown packing algorithm 'wfd'"):
        packpipe.pack(good, 16, algorithm="wfd")
    with pytest.raises(ValueError, match="one-dimensional"):
        packpipe.pack(good, 16, algorithm="histogram", target_lengths=good, target_capacity=16)


def test_pack_unsigned_arguments_refuse_negatives():
    good = np.array([3, 9, 4], dtype=np.uint32)
    with pytest.raises(ValueError, match="capacity must not be negative, found -1"):
        packpipe.pack(good, -1)
    with pytest.raises(ValueError, match="capacity must be at most 4294967295"):
        packpipe.pack(good, 2**32)
    with pytest.raises(ValueError, match="capacity must be an integer"):
        packpipe.pack(good, 16.0)
    with pytest.raises(ValueError, match="target_capacity must not be negative"):
        packpipe.pack(good, 16, target_lengths=good, target_capacity=-4)
    with pytest.raises(ValueError, match="max_samples_per_row must not be negative"):
        packpipe.pack(good, 16, max_samples_per_row=-1)
    res = packpipe.pack(good, np.uint32(16))
    with pytest.raises(ValueError, match="padded_len must not be negative"):
        res.row_tensors(-1)
    with pytest.raises(ValueError, match="padded_len must be at most"):
        res.row_tensors(2**40)

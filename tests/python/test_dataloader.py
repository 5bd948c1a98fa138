"""The packpipe dataloader from Python, against real Megatron-written files."""
import json
import pathlib
import subprocess

import numpy as np
import pytest

import packpipe

EOD = 50256


def test_reads_megatron_gpt_dataset_without_copy(megatron, records):
    ds = packpipe.IndexedDataset(str(megatron / "wordnet_gpt2_text_document"))
    assert len(ds) == 64
    assert ds.dtype == np.uint16
    assert ds.format == "MMIDIDX"
    assert ds.sizes.dtype == np.int32 and len(ds.sizes) == 64
    assert ds.doc_idx.tolist() == list(range(65))
    for i in range(64):
        r = records[i]
        assert ds[i].tolist() == r["input_ids"] + r["target_ids"] + [EOD]
    a = ds[3]
    assert not a.flags.owndata and not a.flags.writeable  # a view into the memory map
    assert a.base is not None
    assert ds[-1].tolist() == ds[63].tolist()
    assert [x.tolist() for x in ds[2:4]] == [ds[2].tolist(), ds[3].tolist()]
    assert ds.get(5, offset=1, length=2).tolist() == ds[5].tolist()[1:3]
    assert ds.num_tokens == 1005


def test_view_outlives_dataset_object(megatron):
    ds = packpipe.IndexedDataset(str(megatron / "wordnet_mt_inputs_document"))
    a = ds[7]
    expected = a.tolist()
    del ds
    assert a.tolist() == expected


def test_modes_and_int32(megatron, records):
    ds = packpipe.IndexedDataset(str(megatron / "wordnet_modes_uint16"))
    assert ds.modes is not None and ds.modes.tolist() == [0, 1] * 32
    ds32 = packpipe.IndexedDataset(str(megatron / "wordnet_multiseq_int32"))
    assert ds32.dtype == np.int32 and ds32.modes is None
    assert ds32[0].tolist() == records[0]["input_ids"]
    assert ds32[1].tolist() == records[0]["target_ids"] + [EOD]


def test_legacy_tntidx(megatron, records):
    ds = packpipe.IndexedDataset(str(megatron / "wordnet_legacy_tntidx_int32"))
    assert ds.format == "TNTIDX"
    assert len(ds) == 32
    assert ds[0].tolist() == records[0]["input_ids"]


def test_builder_reproduces_megatron_bytes(tmp_path, megatron, records):
    prefix = str(tmp_path / "gpt")
    b = packpipe.IndexedDatasetBuilder(prefix, np.uint16)
    for r in records[:64]:
        b.add_item(np.array(r["input_ids"] + r["target_ids"] + [EOD], dtype=np.uint16))
        b.end_document()
    b.finalize()
    for ext in (".bin", ".idx"):
        assert (tmp_path / ("gpt" + ext)).read_bytes() == (megatron / ("wordnet_gpt2_text_document" + ext)).read_bytes()


def test_builder_add_document_with_modes(tmp_path, megatron, records):
    prefix = str(tmp_path / "modes")
    b = packpipe.IndexedDatasetBuilder(prefix, "uint16", multimodal=True)
    for r in records[:32]:
        toks = np.array(r["input_ids"] + r["target_ids"], dtype=np.uint16)
        b.add_document(toks, [len(r["input_ids"]), len(r["target_ids"])], modes=np.array([0, 1], dtype=np.int8))
    b.finalize()
    for ext in (".bin", ".idx"):
        assert (tmp_path / ("modes" + ext)).read_bytes() == (megatron / ("wordnet_modes_uint16" + ext)).read_bytes()


def test_builder_rejects_wrong_dtype_without_casting(tmp_path):
    b = packpipe.IndexedDatasetBuilder(str(tmp_path / "x"), np.uint16)
    with pytest.raises(ValueError, match="tokens must have dtype uint16, found int64"):
        b.add_item(np.array([1, 2, 3], dtype=np.int64))
    with pytest.raises(ValueError, match="1-D"):
        b.add_item(np.zeros((2, 2), dtype=np.uint16))


@pytest.mark.parametrize("lengths, modes, message", [
    (np.array([2.0, 3.0]), None, r"lengths must have an integer dtype \(tokens per sequence\), found float64"),
    ([2.5, 2.5], None, r"lengths must have an integer dtype \(tokens per sequence\), found float64"),
    (np.array([2, 3], dtype=">i8"), None, "lengths must have an integer dtype in native byte order, found >i8"),
    ([2, -3], None, r"lengths\[1\] = -3 is out of range \[0, 2147483647\]"),
    (np.array([[2, 3]]), None, "lengths must be one-dimensional, found 2 dimensions"),
    ([2, 3], np.array([0.0, 1.0]), r"modes must have an integer dtype \(int8 modes\), found float64"),
    ([2, 3], [True, False], r"modes must have an integer dtype \(int8 modes\), found bool"),
    ([2, 3], [0, 300], r"modes\[1\] = 300 is out of range \[-128, 127\]"),
    ([2, 3], [0], r"modes has 1 entries but lengths has 2"),
])
def test_builder_add_document_checks_lengths_and_modes_without_casting(tmp_path, lengths, modes, message):
    b = packpipe.IndexedDatasetBuilder(str(tmp_path / "x"), np.uint16, multimodal=True)
    with pytest.raises(ValueError, match=message):
        b.add_document(np.arange(5, dtype=np.uint16), lengths, modes=modes)
    # Any integer dtype (or a list) whose values fit is read exactly.
    b.add_document(np.arange(5, dtype=np.uint16), np.array([2, 3], dtype=np.uint8), modes=np.array([0, 1]))
    b.add_document(np.arange(5, dtype=np.uint16), [2, 3], modes=[1, 0])
    b.finalize()
    ds = packpipe.IndexedDataset(str(tmp_path / "x"))
    assert [x.tolist() for x in ds[0:4]] == [[0, 1], [2, 3, 4], [0, 1], [2, 3, 4]]
    assert ds.modes.tolist() == [0, 1, 1, 0]


def test_shard_batch_checks_the_batch_dict_without_casting(tmp_path, megatron):
    mt = packpipe.MultiTaskDataset(_manifest(tmp_path, megatron))
    b = packpipe.Sampler(mt, seed=1, global_batch_samples=8).next_batch()
    same = packpipe.shard_batch(dict(b, tasks=b["tasks"].tolist(), indices=b["indices"].astype(np.int64)), mt, 0, 1)
    assert same["tasks"].tolist() == b["tasks"].tolist() and same["indices"].tolist() == b["indices"].tolist()
    for bad, message in [
        (dict(b, tasks=b["tasks"].astype(np.float64)),
         r"batch\['tasks'\] must have an integer dtype \(task numbers, uint32\), found float64"),
        (dict(b, indices=b["indices"].astype(np.float32)),
         r"batch\['indices'\] must have an integer dtype \(sample indices, uint64\), found float32"),
        (dict(b, indices=[-1] * 8), r"batch\['indices'\]\[0\] = -1 is out of range \[0, 18446744073709551615\]"),
        (dict(b, tasks=[2**32] * 8), r"batch\['tasks'\]\[0\] = 4294967296 is out of range \[0, 4294967295\]"),
        (dict(b, tasks=b["tasks"][:3]), r"batch 'tasks' \(3\) and 'indices' \(8\) differ in length"),
        (dict(b, tokens=-1), r"batch\['tokens'\] must not be negative, found -1"),
        ({"tasks": b["tasks"]}, "batch has no 'indices'"),
    ]:
        with pytest.raises(ValueError, match=message):
            packpipe.shard_batch(bad, mt, 0, 1)


def test_errors_map_to_python_exceptions(tmp_path, megatron):
    with pytest.raises(RuntimeError, match="missing"):
        packpipe.IndexedDataset(str(tmp_path / "missing"))
    ds = packpipe.IndexedDataset(str(megatron / "wordnet_gpt2_text_document"))
    with pytest.raises(IndexError, match="64"):
        ds[64]
    (tmp_path / "bad.idx").write_bytes(b"NOTANIDX" + bytes(40))
    (tmp_path / "bad.bin").write_bytes(b"")
    with pytest.raises(RuntimeError, match="magic"):
        packpipe.IndexedDataset(str(tmp_path / "bad"))


def test_compressed_dataset_reads_the_same(tmp_path, megatron):
    import shutil
    for ext in (".idx", ".bin"):
        shutil.copy(megatron / ("wordnet_mt_targets_document" + ext), tmp_path / ("t" + ext))
    plain = packpipe.IndexedDataset(str(tmp_path / "t"))
    expected = [plain[i].tolist() for i in range(len(plain))]
    del plain
    packpipe.compress_dataset(str(tmp_path / "t"), frame_size=256)
    (tmp_path / "t.bin").unlink()
    z = packpipe.IndexedDataset(str(tmp_path / "t"))
    assert z.compressed
    assert [z[i].tolist() for i in range(len(z))] == expected
    assert z.verify() == []


def _manifest(tmp_path, megatron):
    m = {
        "version": 1,
        "tasks": [
            {"name": "gpt", "dataset": str(megatron / "wordnet_gpt2_text_document")},
            {"name": "mt", "inputs": str(megatron / "wordnet_mt_inputs_document"),
             "targets": str(megatron / "wordnet_mt_targets_document")},
        ],
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(m))
    return str(path)


def test_multitask_sampler_delivers_every_sample_once(tmp_path, megatron):
    mt = packpipe.MultiTaskDataset(_manifest(tmp_path, megatron))
    assert mt.task_names == ["gpt", "mt"]
    assert mt.task_size(0) == 64 and mt.task_size(1) == 144
    inp, tgt = mt.lengths(1)
    assert inp.dtype == np.uint32 and len(inp) == 144 and tgt.sum() == 1156
    s = packpipe.Sampler(mt, seed=7, global_batch_tokens=512)
    seen = []
    for b in s:
        assert b["tokens"] <= 512 or len(b["indices"]) == 1
        seen += list(zip(b["tasks"].tolist(), b["indices"].tolist()))
    assert sorted(seen) == [(0, i) for i in range(64)] + [(1, i) for i in range(144)]


def test_sampler_checkpoint_resumes_exactly(tmp_path, megatron):
    mt = packpipe.MultiTaskDataset(_manifest(tmp_path, megatron))
    a = packpipe.Sampler(mt, seed=3, global_batch_samples=10)
    for _ in range(4):
        a.next_batch()
    state = a.state()
    rest = [b["indices"].tolist() for b in a]
    b = packpipe.Sampler(mt, seed=3, global_batch_samples=10)
    b.restore(state)
    assert [x["indices"].tolist() for x in b] == rest
    other = packpipe.Sampler(mt, seed=4, global_batch_samples=10)
    with pytest.raises(ValueError):
        other.restore(state)


def test_prefetcher_matches_sampler_and_returns_views(tmp_path, megatron, records):
    mt = packpipe.MultiTaskDataset(_manifest(tmp_path, megatron))
    ref = [b["indices"].tolist() for b in packpipe.Sampler(mt, seed=9, global_batch_tokens=300)]
    got = []
    for b in packpipe.Prefetcher(mt, packpipe.Sampler(mt, seed=9, global_batch_tokens=300), depth=3):
        got.append(b["indices"].tolist())
        for (task, idx), (inp, tgt) in zip(zip(b["tasks"].tolist(), b["indices"].tolist()), b["samples"]):
            if task == 1:
                assert inp.tolist() == records[idx]["input_ids"] + [EOD]
                assert tgt.tolist() == records[idx]["target_ids"] + [EOD]
            else:
                assert len(tgt) == 0
    assert got == ref


def test_shard_batch_is_a_partition(tmp_path, megatron):
    mt = packpipe.MultiTaskDataset(_manifest(tmp_path, megatron))
    b = packpipe.Sampler(mt, seed=1, global_batch_samples=50).next_batch()
    parts = [packpipe.shard_batch(b, mt, r, 4) for r in range(4)]
    union = sorted(x for p in parts for x in zip(p["tasks"].tolist(), p["indices"].tolist()))
    assert union == sorted(zip(b["tasks"].tolist(), b["indices"].tolist()))


def test_cli_info_json(megatron):
    import os
    cli = os.environ.get("PACKPIPE_CLI")
    if not cli:
        pytest.fail("PACKPIPE_CLI is not set (run through ctest)")
    out = subprocess.run([cli, "dataset", "info", str(megatron / "wordnet_gpt2_text_document"), "--json"],
                         check=True, capture_output=True, text=True).stdout
    j = json.loads(out)
    assert (j["format"], j["version"], j["dtype"], j["sequences"], j["documents"], j["tokens"]) == \
        ("MMIDIDX", 1, "uint16", 64, 64, 1005)


def test_sample_is_not_a_dangling_view_under_debug_malloc(tmp_path, megatron, records):
    # MultiTaskDataset.sample used to return an accessor into a freed temporary list; with
    # PYTHONMALLOC=debug the freed memory is poisoned, so a dangling read crashes or differs.
    manifest = _manifest(tmp_path, megatron)
    code = f"""
import gc, json, packpipe
mt = packpipe.MultiTaskDataset({str(manifest)!r})
recs = [json.loads(l) for l in open({str(megatron / 'records.jsonl')!r})]
for rep in range(3):
    for i in range(0, 144, 7):
        s = mt.sample(1, i)
        gc.collect()
        junk = [bytearray(64) for _ in range(200)]
        inp, tgt = s
        assert inp.tolist() == recs[i]["input_ids"] + [50256], i
        assert tgt.tolist() == recs[i]["target_ids"] + [50256], i
print("ok")
"""
    import os
    import sys
    env = dict(os.environ, PYTHONMALLOC="debug")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


def test_prefetcher_advances_its_sampler_to_what_it_delivered(tmp_path, megatron):
    mt = packpipe.MultiTaskDataset(_manifest(tmp_path, megatron))
    s = packpipe.Sampler(mt, seed=9, global_batch_samples=10)
    pf = packpipe.Prefetcher(mt, s, depth=4)
    seen = []
    for _ in range(3):
        b = next(pf)
        seen += b["indices"].tolist()
        # the checkpoint is that of the delivered batches, not of those prefetched
        assert json.loads(s.state())["batch_index"] == b["index"] + 1
        assert s.state() == pf.state()
    with pytest.raises(ValueError, match="already feeds a Prefetcher"):
        packpipe.Prefetcher(mt, s, depth=2)
    saved = s.state()
    del pf
    resumed = packpipe.Sampler(mt, seed=9, global_batch_samples=10)
    resumed.restore(saved)
    for b in packpipe.Prefetcher(mt, resumed, depth=2):
        seen += b["indices"].tolist()
    whole = [i for b in packpipe.Sampler(mt, seed=9, global_batch_samples=10) for i in b["indices"].tolist()]
    assert seen == whole


def test_tampered_sampler_state_is_refused(tmp_path, megatron):
    mt = packpipe.MultiTaskDataset(_manifest(tmp_path, megatron))
    a = packpipe.Sampler(mt, seed=3, global_batch_tokens=400)
    for _ in range(3):
        a.next_batch()
    st = json.loads(a.state())
    for field, value in [("position", st["position"] + 1), ("position", st["position"] - 1),
                         ("epoch", 2**64 - 1), ("batch_index", 2**64 - 1)]:
        bad = dict(st, **{field: value})
        with pytest.raises(ValueError):
            packpipe.Sampler(mt, seed=3, global_batch_tokens=400).restore(json.dumps(bad))
    dup = a.state()[:-1] + ', "position": 0}'
    with pytest.raises(ValueError, match="duplicate key"):
        packpipe.Sampler(mt, seed=3, global_batch_tokens=400).restore(dup)



def test_restore_at_random_positions_gives_the_rest_of_the_epoch(tmp_path, megatron):
    """A state saved after any batch restores, through its check and without a replay, to exactly the
    batches an uninterrupted sampler delivers next; the same state without its check (an older
    packpipe's) restores by replay; an edited check is refused."""
    import random
    mt = packpipe.MultiTaskDataset(_manifest(tmp_path, megatron))
    whole = [b["indices"].tolist() for b in packpipe.Sampler(mt, seed=5, global_batch_tokens=300, epoch=1)]
    rng = random.Random(7)
    for cut in sorted(rng.sample(range(len(whole) + 1), 6)):
        s = packpipe.Sampler(mt, seed=5, global_batch_tokens=300, epoch=1)
        for _ in range(cut):
            s.next_batch()
        state = json.loads(s.state())
        assert len(state["check"]) == 16
        for st in (state, {k: v for k, v in state.items() if k != "check"}):
            resumed = packpipe.Sampler(mt, seed=5, global_batch_tokens=300)
            resumed.restore(json.dumps(st))
            assert [b["indices"].tolist() for b in resumed] == whole[cut:]
    bad = dict(state, check="%016x" % (int(state["check"], 16) ^ 1))
    with pytest.raises(ValueError, match="check .* does not match"):
        packpipe.Sampler(mt, seed=5, global_batch_tokens=300).restore(json.dumps(bad))

DEMO = pathlib.Path(__file__).resolve().parents[2] / "data" / "demo"


def test_sample_returns_input_and_target_arrays_of_every_task_of_the_demo_manifest():
    mt = packpipe.MultiTaskDataset(str(DEMO / "manifest.json"))
    assert mt.task_names[-1] == "man_text" and not mt.encoder_decoder(5)  # the text-only task
    for task in range(mt.num_tasks):
        inputs, targets = mt.lengths(task)
        n = mt.task_size(task)
        for index in (0, n // 2, n - 1, np.int64(n - 1)):
            inp, tgt = mt.sample(task, index)
            assert isinstance(inp, np.ndarray) and isinstance(tgt, np.ndarray)
            assert inp.dtype == tgt.dtype == np.uint16 and inp.ndim == tgt.ndim == 1
            assert len(inp) == inputs[index] and len(tgt) == targets[index]
    text = packpipe.IndexedDataset(str(DEMO / "demo_man_text"))
    inp, tgt = mt.sample(5, 7)
    assert inp.tolist() == text[7].tolist() and len(inp) > 0
    assert len(tgt) == 0 and tgt.dtype == np.uint16  # no target part: an empty array, not None
    define_in = packpipe.IndexedDataset(str(DEMO / "demo_define_inputs_document"))
    define_tg = packpipe.IndexedDataset(str(DEMO / "demo_define_targets_document"))
    inp, tgt = mt.sample(0, 3)
    assert inp.tolist() == define_in[3].tolist() and tgt.tolist() == define_tg[3].tolist()


def test_sample_out_of_range_or_bad_arguments_raise_python_errors():
    mt = packpipe.MultiTaskDataset(str(DEMO / "manifest.json"))
    n = mt.task_size(0)
    with pytest.raises(IndexError, match=r"sample \(task 6, index 0\): task out of range \(the dataset has 6 tasks\)"):
        mt.sample(6, 0)
    with pytest.raises(IndexError, match=rf"sample \(task {2**32}, index 0\): task out of range"):
        mt.sample(2**32, 0)  # never wrapped to task 0
    with pytest.raises(IndexError, match=rf"sample \(task 0, index {n}\): index out of range \(task 'define' has {n} "
                                         r"samples\)"):
        mt.sample(0, n)
    with pytest.raises(IndexError, match=r"index out of range \(task 'man_text' has 1424 samples\)"):
        mt.sample(5, 2**64 - 1)
    for args, message in [((-1, 0), "task must not be negative, found -1"),
                          ((0, -1), "index must not be negative, found -1"),
                          ((0.0, 0), "task must be an integer, found 0.0 of type float"),
                          ((0, 1.5), "index must be an integer, found 1.5 of type float"),
                          ((0, "1"), "index must be an integer, found '1' of type str"),
                          ((0, 2**64), "index must be at most 18446744073709551615")]:
        with pytest.raises(ValueError, match=message):
            mt.sample(*args)


def test_a_builder_whose_call_failed_refuses_to_finish(tmp_path, megatron):
    """A call that fails part-way leaves the builder unusable: finalize() wrote a dataset with part of what the call
    was to add (a corrupt index read part-way: a .idx that does not match its .bin), or over the dataset an
    add_index refused as its own input (an empty dataset in its place). A refusal before anything is written (a
    document index out of order, now checked first) leaves it usable."""
    import shutil
    import struct
    src = megatron / "wordnet_gpt2_text_document"
    raw = (src.parent / (src.name + ".idx")).read_bytes()
    S = struct.unpack_from("<Q", raw, 18)[0]

    def corrupt(name, offset, value):
        b = bytearray(raw)
        struct.pack_into("<q", b, offset, value)
        (tmp_path / (name + ".idx")).write_bytes(bytes(b))
        shutil.copy(str(src) + ".bin", tmp_path / (name + ".bin"))
        return str(tmp_path / name)

    docs = corrupt("docs", 34 + 12 * S + 8 * 5, -1)  # doc_idx[5]
    chain = corrupt("chain", 34 + 4 * S + 8 * 7, 3)  # pointers[7], found while copying
    b = packpipe.IndexedDatasetBuilder(str(tmp_path / "half"), np.uint16)
    b.add_item(np.array([7, 8, 9], dtype=np.uint16))
    b.end_document()
    with pytest.raises(RuntimeError, match=r"doc_idx\[5\]"):
        b.add_index(docs)
    with pytest.raises(RuntimeError, match="pointer"):
        b.add_index(chain)
    for call in (lambda: b.finalize(), lambda: b.end_document(), lambda: b.add_item(np.array([1], np.uint16))):
        with pytest.raises(ValueError, match="refused: an earlier call failed part-way \\(add_index: "):
            call()
    del b
    assert not list(tmp_path.glob("half*")), list(tmp_path.glob("half*"))
    b = packpipe.IndexedDatasetBuilder(str(tmp_path / "whole"), np.uint16)
    b.add_item(np.array([7, 8, 9], dtype=np.uint16))
    with pytest.raises(RuntimeError, match=r"doc_idx\[5\]"):
        b.add_index(docs)
    b.finalize()
    whole = packpipe.IndexedDataset(str(tmp_path / "whole"))
    assert len(whole) == 1 and list(whole[0]) == [7, 8, 9] and whole.verify() == []
    # the builder's own output as its input
    own = tmp_path / "own"
    for ext in (".bin", ".idx"):
        shutil.copy(str(src) + ext, str(own) + ext)
    before = {ext: pathlib.Path(str(own) + ext).read_bytes() for ext in (".bin", ".idx")}
    b = packpipe.IndexedDatasetBuilder(str(own), np.uint16)
    with pytest.raises(ValueError, match="destroy the input"):
        b.add_index(str(own))
    with pytest.raises(ValueError, match="finalize refused"):
        b.finalize()
    del b
    assert {ext: pathlib.Path(str(own) + ext).read_bytes() for ext in (".bin", ".idx")} == before

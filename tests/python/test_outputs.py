"""The CLI's output rules for Python writers (packpipe.write_file_atomic, check_outputs): an output
that is one of the job's inputs (by inode: the same path, "./", a symbolic or a hard link) or
another of its outputs is refused with its name, a write is atomic, and an output that cannot be
written is refused before any work."""
import fcntl
import os
import pathlib
import shutil

import pytest

import packpipe

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "data" / "demo"


@pytest.fixture
def files(tmp_path):
    data = tmp_path / "in.txt"
    data.write_text("precious")
    (tmp_path / "sym.txt").symlink_to(data)
    os.link(data, tmp_path / "hard.txt")
    return tmp_path, data


def test_an_output_that_is_an_input_is_refused_through_any_name(files, monkeypatch):
    tmp, data = files
    monkeypatch.chdir(tmp)
    for out in [data, str(data), tmp / "." / "in.txt", "in.txt", "./in.txt", tmp / "sym.txt", tmp / "hard.txt"]:
        with pytest.raises(ValueError, match=r"--save '.*' is the input .* would destroy the input"):
            packpipe.write_file_atomic(out, "overwritten", inputs=[str(data)], what="--save")
        with pytest.raises(ValueError, match="would destroy the input"):
            packpipe.check_outputs({"--save": out}, [data])
    # inputs given as one path, as a sequence with None holes, or as os.PathLike
    with pytest.raises(ValueError, match="destroy the input"):
        packpipe.write_file_atomic(tmp / "sym.txt", b"x", inputs=data)
    with pytest.raises(ValueError, match="destroy the input"):
        packpipe.write_file_atomic(tmp / "hard.txt", b"x", inputs=[None, "", data])
    assert data.read_text() == "precious"
    assert sorted(p.name for p in tmp.iterdir()) == ["hard.txt", "in.txt", "sym.txt"]  # no temporary left


def test_two_outputs_of_one_job_must_differ(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="--out 'same.json' and --model-out './same.json' are the same file"):
        packpipe.check_outputs({"--out": "same.json", "--model-out": "./same.json"})
    (tmp_path / "a.json").write_text("first")
    os.link(tmp_path / "a.json", tmp_path / "b.json")
    with pytest.raises(ValueError, match="are the same file"):
        packpipe.write_file_atomic("b.json", "second", outputs={"--out": "a.json"}, what="--model-out")
    with pytest.raises(ValueError, match="are the same file"):
        packpipe.write_file_atomic("a.json", "second", outputs=["sub/../a.json"])
    assert (tmp_path / "a.json").read_text() == "first"
    packpipe.check_outputs({"--out": "a.json", "--model-out": None, "--trace": ""})  # unset outputs are skipped
    packpipe.check_outputs(["x.json", "y.json"])


def test_writes_are_atomic_and_take_str_or_bytes(tmp_path):
    out = tmp_path / "o.bin"
    packpipe.write_file_atomic(out, "héllo")
    assert out.read_bytes() == "héllo".encode()
    for data in (b"\x00\x01", bytearray(b"\x02"), memoryview(b"\x03\x04")):
        packpipe.write_file_atomic(str(out), data)
        assert out.read_bytes() == bytes(data)
    with pytest.raises(TypeError, match="data: expected str or bytes, found int"):
        packpipe.write_file_atomic(out, 5)
    with pytest.raises(TypeError, match="path: expected a path"):
        packpipe.write_file_atomic(5, "x")
    with pytest.raises(TypeError, match=r"inputs\[0\]: expected a path"):
        packpipe.write_file_atomic(out, "x", inputs=[3])
    with pytest.raises(ValueError, match="the output path is empty"):
        packpipe.write_file_atomic("", "x")
    assert out.read_bytes() == b"\x03\x04"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.bin"]


def test_an_output_that_cannot_be_written_is_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="--out: cannot write .* is a directory"):
        packpipe.check_outputs({"--out": tmp_path})
    with pytest.raises(ValueError, match="--out: cannot write .*No such file or directory"):
        packpipe.check_outputs({"--out": tmp_path / "missing" / "o.json"})
    with pytest.raises(RuntimeError, match="is a directory"):
        packpipe.write_file_atomic(tmp_path, "x")
    packpipe.check_outputs({"--out": tmp_path / "new.json"})  # the probe leaves nothing behind
    assert list(tmp_path.iterdir()) == []
    packpipe.check_outputs({"--out": tmp_path}, probe=False)  # identity checks only
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        try:
            with pytest.raises(ValueError, match="--out: cannot write"):
                packpipe.check_outputs({"--out": ro / "o.json"})
        finally:
            ro.chmod(0o755)
    packpipe.check_outputs({"--out": "/dev/null"})  # a stream is written directly


def test_a_second_writer_of_the_same_output_is_refused(tmp_path):
    out = tmp_path / "o.json"
    with open(str(out) + ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a running writer holds it
        with pytest.raises(RuntimeError, match="another process is writing this output"):
            packpipe.write_file_atomic(out, "x")
        with pytest.raises(ValueError, match="another process is writing this output"):
            packpipe.check_outputs({"--out": out})
    assert not out.exists()


def test_dataset_files_are_the_manifest_and_every_file_of_every_task(tmp_path):
    shutil.copytree(DEMO, tmp_path / "demo")
    manifest = tmp_path / "demo" / "manifest.json"
    files = packpipe.dataset_files(packpipe.MultiTaskDataset(str(manifest)))
    assert files[0] == str(manifest)
    on_disk = {str(p) for p in (tmp_path / "demo").glob("*_document.*")} | {str(p) for p in
                                                                           (tmp_path / "demo").glob("demo_man_text.*")}
    assert on_disk <= set(files)
    for f in sorted(on_disk):
        with pytest.raises(ValueError, match="destroy the input"):
            packpipe.write_file_atomic(f, "x", inputs=files)
    prefix = packpipe.dataset_files(packpipe.MultiTaskDataset(str(tmp_path / "demo" / "demo_man_text")))
    assert str(tmp_path / "demo" / "demo_man_text.idx") in prefix


def test_a_plan_file_being_read_in_this_process_is_not_written_over(tmp_path):
    """A live PlanFileReader (or a PlanLoader reading the file) holds its plan file: a PlanFileWriter
    onto it, by any name (a symbolic link too), is refused at once naming the path, and the file keeps
    its plans; once the reader is gone, the path is an output like any other."""
    import gc
    cm = packpipe.CostModel("gpt-1.3b", "A100-40GB")
    ds = packpipe.MultiTaskDataset(str(DEMO / "manifest.json"))
    path = tmp_path / "plans.ppln"
    with packpipe.PlanFileWriter(str(path)) as w:
        for it in packpipe.plan_epoch(cm, ds, iterations=4, shape=packpipe.PipelineShape(stages=2),
                                      global_batch_tokens=4096):
            for p in it.result.plans:
                w.append(p)
    (tmp_path / "link.ppln").symlink_to(path)
    reader = packpipe.PlanFileReader(str(path))
    for name in (path, tmp_path / "." / "plans.ppln", tmp_path / "link.ppln"):
        with pytest.raises(RuntimeError, match=r"is open for reading by a PlanFileReader"):
            packpipe.PlanFileWriter(str(name))
    assert len(reader) == len(packpipe.PlanFileReader(str(path))) == 4
    del reader
    gc.collect()
    with packpipe.PlanFileWriter(str(path)) as w:
        w.append(next(iter(packpipe.plan_epoch(cm, ds, iterations=1, shape=packpipe.PipelineShape(stages=2),
                                                   global_batch_tokens=4096))).result.plans[0])
    assert len(packpipe.PlanFileReader(str(path))) == 1

"""packpipe.CostModel: the analytic model's queries, stage helpers, comm and report from Python."""
import os
import pytest

import packpipe


def test_query_properties():
    cm = packpipe.CostModel("gpt-6.7b", "A100-40GB", attention="eager")  # Korthikanti's stored scores
    assert cm.attention == "eager"
    assert "analytic" in cm.describe()
    assert cm.model["hidden"] == 4096 and cm.device["peak_tflops"] == 312
    small = cm.query(kind="encoder", mbs=1, seq=1024)
    big = cm.query(kind="encoder", mbs=4, seq=1024)
    assert big.total_ms > small.total_ms and big.stored_bytes > small.stored_bytes
    rc = {m: cm.query(mbs=2, seq=2048, recompute=m) for m in ("none", "selective", "full")}
    assert rc["none"].total_ms < rc["selective"].total_ms < rc["full"].total_ms
    assert rc["none"].stored_bytes > rc["selective"].stored_bytes > rc["full"].stored_bytes
    # full recompute keeps the layer input, 2 s b h, plus the activation calibration (per token and
    # hidden unit, per attention score, per layer; the device's analytic constants).
    cal = cm.device["analytic"]
    extra = (cal["activation_token_bytes"] * 2 * 2048 * 4096 + cal["activation_score_bytes"] * 32 * 2048 ** 2 * 2
             + cal["activation_layer_bytes"])
    assert rc["full"].stored_bytes == pytest.approx(2 * 2 * 2048 * 4096 + extra)
    d = small.to_dict()
    for key in ("forward_ms", "backward_ms", "recompute_ms", "total_ms", "stored_bytes", "peak_bytes",
                "boundary_bytes", "time_source", "memory_source"):
        assert key in d
    assert d["time_source"] == "analytic"
    four = cm.query(mbs=1, seq=1024, layers=4)
    # the GPU presets run the flash kernel: no stored scores, so selective recompute saves nothing
    flash = packpipe.CostModel("gpt-6.7b", "A100-40GB")
    assert flash.attention == "flash" and flash.device["attention"] == "flash"
    fr = {m: flash.query(mbs=2, seq=2048, recompute=m) for m in ("none", "selective", "full")}
    assert fr["none"].stored_bytes == fr["selective"].stored_bytes > fr["full"].stored_bytes
    assert fr["none"].stored_bytes < rc["none"].stored_bytes and fr["none"].total_ms < rc["none"].total_ms
    # a slice attends to the kept tokens before it: its cost grows with them
    s = [flash.query(segments=[1024], prefix=[p]).total_ms for p in (0, 4096, 16384)]
    assert s[0] < s[1] < s[2]
    with pytest.raises(ValueError, match="attention must be None or one of eager, flash"):
        packpipe.CostModel("gpt-6.7b", "A100-40GB", attention=1)
    with pytest.raises(ValueError, match="eager, flash"):
        packpipe.CostModel("gpt-6.7b", "A100-40GB", attention="sdpa")
    with pytest.raises(ValueError, match="prefix"):
        flash.query(seq=128, prefix=[4])
    assert four.forward_ms == pytest.approx(4 * small.forward_ms)


def test_encoder_decoder_and_stage():
    cm = packpipe.CostModel(model="t5-11b")
    dec = cm.query(kind="decoder", mbs=2, seq=512, dec_seq=128)
    assert dec.boundary_bytes == pytest.approx(2 * 2 * (512 + 128) * 1024)
    st = cm.stage_cost(encoder_layers=2, decoder_layers=2, has_embedding=True, has_postprocess=True, mbs=2, seq=512,
                       dec_seq=128)
    assert st.total_ms > dec.total_ms and st.boundary_bytes == 0
    sm = cm.stage_static_memory(encoder_layers=4, tp=2, dp=4, zero=1)
    assert sm.optimizer_bytes == pytest.approx(sm.params_bytes * 6 / 4)


def test_static_memory_comm_and_report():
    s = packpipe.static_memory(1e9, dp=8, zero=3)
    assert s.total_bytes == pytest.approx(16e9 / 8)
    cm = packpipe.CostModel()
    assert cm.all_reduce_ms(1e8, 4) == pytest.approx(cm.all_gather_ms(1e8, 4) + cm.reduce_scatter_ms(1e8, 4))
    assert cm.p2p_ms(1e8, inter_node=True) > cm.p2p_ms(1e8)
    p = packpipe.bigscience_params("gpt-1.3b", 2048)
    assert p == 1317654528
    assert packpipe.bigscience_tflops_per_gpu(p, 2048, 512, 58.98, 4) == pytest.approx(46.9, abs=0.05)
    assert packpipe.bigscience_tflops_per_gpu(p, 2048, 512, 58.98, 4, factor=3) == pytest.approx(35.1, abs=0.05)
    r = packpipe.throughput_report(1e15, 512, 512 * 2048, 10.0, 4, "A100-40GB")
    assert r["tflops_per_gpu"] == pytest.approx(25.0) and r["mfu"] == pytest.approx(25.0 / 312)
    assert "gpt-6.7b" in packpipe.model_presets() and "H200" in packpipe.device_presets()


def test_bad_input_names_the_argument():
    cm = packpipe.CostModel()
    with pytest.raises(ValueError, match="mbs"):
        cm.query(mbs=0, seq=128)
    with pytest.raises(ValueError, match="decoder-only"):
        cm.query(kind="decoder", seq=128, dec_seq=16)
    with pytest.raises(ValueError, match="tp \\(3\\) must divide"):
        cm.query(seq=128, tp=3)
    with pytest.raises(ValueError, match="unknown recompute mode"):
        cm.query(seq=128, recompute="most")
    with pytest.raises(ValueError, match="unknown model 'gpt-99b'"):
        packpipe.CostModel("gpt-99b")
    with pytest.raises(ValueError, match=r"ZeRO stage \(zero / --zero\)"):
        packpipe.static_memory(1e9, 2, 5)


def test_device_file_carries_the_analytic_constants(tmp_path):
    """A device packpipe has no preset for (a CPU), its analytic constants in the file: the Python
    CostModel and the CLI's --device honor them; a bad value names the file and the field."""
    import json
    import subprocess
    cpu = {"name": "cpu-test", "peak_tflops": 0.05, "memory_gb": 16, "hbm_gbps": 20, "intra_node_gbps": 5,
           "inter_node_gbps": 1, "gpus_per_node": 1,
           "analytic": {"layer_overhead_ms": 0.02, "backward_factor": 2.0, "max_efficiency": 0.5}}
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(cpu))
    cm = packpipe.CostModel("gpt-350m", str(path))
    assert cm.device["analytic"]["backward_factor"] == 2.0 and cm.device["analytic"]["layer_overhead_ms"] == 0.02
    assert cm.device["analytic"]["half_efficiency_tokens"] == 160  # a default kept
    q = cm.query(kind="encoder", mbs=4, seq=256)
    assert q.backward_ms == pytest.approx(2.0 * q.forward_ms, rel=0.01)
    preset = packpipe.CostModel("gpt-350m", "A100-40GB").device["analytic"]
    assert preset["backward_factor"] == 1.6
    cli = os.environ.get("PACKPIPE_CLI")
    if cli:
        out = subprocess.run([cli, "costmodel", "query", "--model", "gpt-350m", "--device", str(path), "--mbs", "4",
                              "--seq", "256", "--json"], capture_output=True, text=True, check=True).stdout
        r = json.loads(out)
        assert r["backward_ms"] == pytest.approx(q.backward_ms) and r["forward_ms"] == pytest.approx(q.forward_ms)
    cpu["analytic"]["max_efficiency"] = 2
    path.write_text(json.dumps(cpu))
    with pytest.raises(ValueError, match=r"cpu.json: 'analytic.max_efficiency' must be in \(0, 1\], found 2"):
        packpipe.CostModel("gpt-350m", str(path))


def test_profiled_memory_from_packpipe_profile_reaches_the_plans(tmp_path):
    """What `packpipe profile` records on CUDA (stored bytes a forward keeps, the transient peak above
    them) goes through the C++ writer and is what the profiled model, and so the partitioner, uses."""
    import json
    import numpy as np
    model = {"name": "tiny", "num_layers": 4, "hidden": 256, "heads": 4, "ffn_hidden": 1024, "vocab": 1000}
    (tmp_path / "tiny.json").write_text(json.dumps(model))
    points = []
    for kind in ("embedding", "encoder", "postprocess"):
        for rc in (("none", "selective", "full") if kind == "encoder" else ("none",)):
            for mbs in (1, 2, 4, 8):
                for seq in (64, 128, 256):
                    tokens = mbs * seq
                    stored = {"none": 3000.0, "selective": 2000.0, "full": 600.0}[rc] * tokens if kind == "encoder" else None
                    peak = 500.0 * tokens if kind == "encoder" else None
                    points.append((kind, 1, rc, 0, mbs, seq, 0, 0.01 * tokens ** 0.5 + 0.1, 0.02 * tokens ** 0.5 + 0.2,
                                   stored, peak))
    path = tmp_path / "tiny.profile.json"
    packpipe.write_profile(str(path), points, model="tiny", device="cuda-test")
    back = packpipe.read_profile([str(path)])
    assert back["points"] == points  # memory columns carried, None where not measured
    cm = packpipe.CostModel(str(tmp_path / "tiny.json"), "A100-40GB", [str(path)])
    for rc, per_token in (("none", 3000.0), ("selective", 2000.0), ("full", 600.0)):
        q = cm.query(kind="encoder", mbs=4, seq=128, recompute=rc, layers=2)
        assert q.memory_source == "profiled"
        assert q.stored_bytes == pytest.approx(2 * per_token * 512)  # per layer, times the layers
        assert q.peak_bytes == pytest.approx(500.0 * 512)            # one layer's transient
    # The partitioner plans on them: twice the stored bytes in the profile, smaller micro-batches.
    lens = np.full(64, 200, dtype=np.uint32)
    shape = packpipe.PipelineShape(stages=2, memory_mb=60)
    opts = packpipe.PartitionOptions(recompute="none")
    p = packpipe.partition(cm, lens, shape=shape, options=opts)
    for mb in p.microbatches:
        q = cm.query(kind="encoder", mbs=mb.rows, seq=mb.padded_len, layers=2)
        assert q.memory_source != "analytic" and mb.stored_mb >= q.stored_bytes / 1e6
    heavy = [pt[:9] + ((2 * pt[9],) if pt[9] else (None,)) + pt[10:] for pt in points]
    packpipe.write_profile(str(path), heavy, model="tiny", device="cuda-test")
    cm2 = packpipe.CostModel(str(tmp_path / "tiny.json"), "A100-40GB", [str(path)])
    p2 = packpipe.partition(cm2, lens, shape=shape, options=opts)
    assert max(m.rows for m in p2.microbatches) < max(m.rows for m in p.microbatches)
    per_row = [m.stored_mb / m.rows for m in p.microbatches]
    per_row2 = [m.stored_mb / m.rows for m in p2.microbatches]
    # per row, 2 layers x 3000 more bytes per token x 200 tokens (the embedding's bytes are the same)
    assert min(per_row2) - max(per_row) == pytest.approx(2 * 3000 * 200 / 1e6)


def test_query_packed_row_segments():
    cm = packpipe.CostModel("gpt-6.7b", "A100-40GB")
    dense = cm.query(mbs=1, seq=4096)                  # one padded row: (sum l)^2 attention
    packed = cm.query(segments=[1024, 1024, 2048])     # the same tokens packed with varlen attention
    assert packed.forward_ms < dense.forward_ms and packed.backward_ms < dense.backward_ms
    longest = cm.query(mbs=1, seq=2048)
    assert packed.total_ms > longest.total_ms          # more tokens than its longest sample alone
    # a row of one segment is that sample's dense row
    assert cm.query(segments=[1500]).total_ms == pytest.approx(cm.query(seq=1500).total_ms, rel=1e-9)
    # more segments of the same tokens: less attention, never more time
    assert cm.query(segments=[512] * 8).total_ms <= packed.total_ms
    t5 = packpipe.CostModel(model="t5-11b")
    row = t5.query(kind="decoder", segments=[300, 200], dec_segments=[40, 60])
    assert row.total_ms < t5.query(kind="decoder", seq=500, dec_seq=100).total_ms
    for kwargs, words in [(dict(segments=[100], seq=100), "leave out mbs, seq"),
                          (dict(segments=[]), "at least one segment"),
                          (dict(segments=[100, 0]), "segment 1 has length 0"),
                          (dict(segments=[100], dec_segments=[5]), "decoder-only")]:
        with pytest.raises(ValueError, match=words):
            cm.query(**kwargs)
    with pytest.raises(ValueError, match="one decoder length per segment"):
        t5.query(kind="decoder", segments=[300, 200], dec_segments=[40])

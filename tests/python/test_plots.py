"""packpipe.plots: the validation picture from plot data, and its errors."""
import json
import os
import subprocess
import sys

import pytest

from packpipe import plots

PNG = b"\x89PNG\r\n\x1a\n"


def plot_data(scale=1.3):
    pred = [0.5, 1.0, 2.0, 4.0]
    return {"format": "packpipe-validation-plot", "version": 1, "cost_model": "analytic (test)",
            "ops": [{"op": "F", "tokens": [64, 128, 256, 512], "predicted_ms": pred,
                     "measured_ms": [scale * p for p in pred]},
                    {"op": "B", "tokens": [64, 128], "predicted_ms": [1.0, 2.0], "measured_ms": [2.6, 5.2]}],
            "iterations": [{"iteration": i, "replica": 0, "predicted_ms": 10.0 + i, "measured_ms": 13.0 + i}
                           for i in range(5)]}


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return str(p)


def test_the_cli_draws_one_or_two_models_into_a_png(tmp_path):
    a = write(tmp_path, "a.json", plot_data(1.3))
    b = write(tmp_path, "b.json", plot_data(1.0))
    out = tmp_path / "v.png"
    r = subprocess.run([sys.executable, "-m", "packpipe.plots", "validation", a, b, "--label", "analytic",
                        "--label", "calibrated", "-o", str(out)], capture_output=True, text=True, env=os.environ)
    assert r.returncode == 0, r.stderr
    data = out.read_bytes()
    assert data.startswith(PNG) and len(data) > 10000
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".plot-")]


def test_bad_plot_data_is_refused_naming_the_file_and_the_output_is_not_touched(tmp_path):
    out = tmp_path / "v.png"
    out.write_bytes(b"keep")
    bad = dict(plot_data(), format="packpipe-measurements")
    p = write(tmp_path, "bad.json", bad)
    with pytest.raises(ValueError, match=r"bad\.json: expected format \"packpipe-validation-plot\""):
        plots.read_validation_plot(p)
    uneven = plot_data()
    uneven["ops"][0]["measured_ms"].pop()
    p2 = write(tmp_path, "uneven.json", uneven)
    with pytest.raises(ValueError, match=r"uneven\.json: ops\[0\] \(F\).*differ in length"):
        plots.read_validation_plot(p2)
    (tmp_path / "notjson.json").write_text("{")
    r = subprocess.run([sys.executable, "-m", "packpipe.plots", "validation", str(tmp_path / "notjson.json"),
                        "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and "notjson.json: not JSON" in r.stderr
    assert out.read_bytes() == b"keep"


@pytest.mark.parametrize("change,field", [
    (lambda d: d.update(ops=5), "ops and iterations: expected arrays"),
    (lambda d: d.update(ops=[1]), r"ops\[0\]: expected an object"),
    (lambda d: d["ops"][0].pop("op"), r"ops\[0\]: expected an object with a string 'op'"),
    (lambda d: d["ops"][0].update(predicted_ms=["x", None, 1, 2]), r"ops\[0\] \(F\): predicted_ms: expected an array"),
    (lambda d: d["ops"][0].update(predicted_ms=5), r"ops\[0\] \(F\): predicted_ms"),
    (lambda d: d.update(iterations=3), "ops and iterations: expected arrays"),
    (lambda d: d["iterations"][0].update(predicted_ms=None), r"iterations\[0\]"),
    (lambda d: d["iterations"][0].update(measured_ms="x"), r"iterations\[0\]"),
    (lambda d: d.update(cost_model=5), "cost_model: expected a string"),
])
def test_malformed_plot_data_is_an_error_naming_the_field_never_a_traceback(tmp_path, change, field):
    data = plot_data()
    change(data)
    p = write(tmp_path, "bad.json", data)
    with pytest.raises(ValueError, match=field):
        plots.read_validation_plot(p)
    r = subprocess.run([sys.executable, "-m", "packpipe.plots", "validation", p, "-o", str(tmp_path / "o.png")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "bad.json" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_file_that_is_not_utf8_is_named(tmp_path):
    p = tmp_path / "utf16.json"
    p.write_bytes(json.dumps(plot_data()).encode("utf-16"))
    with pytest.raises(ValueError, match=r"utf16\.json: not UTF-8 text"):
        plots.read_validation_plot(str(p))


def test_the_picture_is_never_written_over_its_data(tmp_path):
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"format": "packpipe-validation-plot", "version": 1, "ops": [], "iterations": []}))
    before = data.read_text()
    os.symlink(data, tmp_path / "link.png")
    for out in (data, tmp_path / "." / "data.json", tmp_path / "link.png"):
        r = subprocess.run([sys.executable, "-m", "packpipe.plots", "validation", str(data), "-o", str(out)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "is the input" in r.stderr and "destroy the input" in r.stderr, r.stderr
    assert data.read_text() == before
    r = subprocess.run([sys.executable, "-m", "packpipe.plots", "validation", str(data), "-o", str(tmp_path / "d")
                        + "/missing/o.png"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "cannot write" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json", "link.png"]

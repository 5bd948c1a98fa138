"""Pictures of packpipe's reports (matplotlib, imported only when drawing).

``python3 -m packpipe.plots validation DATA.json [MORE.json ...] -o OUT.png`` draws the predicted
against the measured op and iteration times of ``packpipe costmodel validate --plot-data`` (format
"packpipe-validation-plot" v1; ``packpipe.validation_plot_json`` in Python). Several data files
(for example the uncalibrated and the calibrated model against one trace) are drawn side by side
in one picture, one colour each. ``packpipe costmodel validate --plot OUT.png`` calls it.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import textwrap
from typing import Dict, List, Sequence

_FORMAT = "packpipe-validation-plot"


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def read_validation_plot(path: str) -> Dict:
    """The plot data of `path`; raises ValueError naming the file, the field and what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text: {e}") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON: {e}") from e
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path}: expected format \"{_FORMAT}\", found {found!r}")
    if data.get("version") != 1:
        raise ValueError(f"{path}: expected version 1, found {data.get('version')!r}")
    if not isinstance(data.get("cost_model", ""), str):
        raise ValueError(f"{path}: cost_model: expected a string, found {data['cost_model']!r}")
    ops, its = data.get("ops", []), data.get("iterations", [])
    if not isinstance(ops, list) or not isinstance(its, list):
        raise ValueError(f"{path}: ops and iterations: expected arrays, found {type(ops).__name__} and "
                         f"{type(its).__name__}")
    for i, op in enumerate(ops):
        if not isinstance(op, dict) or not isinstance(op.get("op"), str):
            raise ValueError(f"{path}: ops[{i}]: expected an object with a string 'op', found {op!r}"[:300])
        for k in ("tokens", "predicted_ms", "measured_ms"):
            v = op.get(k, [])
            if not isinstance(v, list) or not all(_is_number(x) for x in v):
                raise ValueError(f"{path}: ops[{i}] ({op['op']}): {k}: expected an array of finite numbers"[:300])
        n = {k: len(op.get(k, [])) for k in ("tokens", "predicted_ms", "measured_ms")}
        if len(set(n.values())) != 1:
            raise ValueError(f"{path}: ops[{i}] ({op['op']}): tokens, predicted_ms and measured_ms differ in "
                             f"length: {n}")
    for i, it in enumerate(its):
        if not isinstance(it, dict) or not _is_number(it.get("predicted_ms")) or not (
                it.get("measured_ms") is None or _is_number(it.get("measured_ms"))):
            raise ValueError(f"{path}: iterations[{i}]: expected an object with a finite predicted_ms and a finite "
                             f"or null measured_ms, found {it!r}"[:300])
    return data


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


def _rel_errors(pred: Sequence[float], meas: Sequence[float]) -> List[float]:
    return [abs(p - m) / m for p, m in zip(pred, meas) if m > 0]


def draw_validation(datasets: Sequence[Dict], out: str, title: str = "", inputs: Sequence[str] = ()) -> None:
    """Draws one or more validation plot datasets into the PNG `out`, written atomically and refused
    when it is one of `inputs` (the files the data came from)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    fig, (ax_ops, ax_it) = plt.subplots(1, 2, figsize=(13, 5.5))
    lo, hi = math.inf, 0.0
    markers = {"F": "o", "B": "s", "I": "^", "W": "v", "send": "x", "recv": "+"}
    several = len(datasets) > 1
    for k, data in enumerate(datasets):
        color = colors[k % len(colors)]
        label = data.get("label") or (f"model {k + 1}" if several else "")
        prefix = f"{label}: " if label else ""
        for op in data.get("ops", []):
            pts = [(p, m) for p, m in zip(op["predicted_ms"], op["measured_ms"]) if p > 0 and m > 0]
            if not pts:
                continue
            err = _median(_rel_errors([p for p, _ in pts], [m for _, m in pts]))
            ax_ops.scatter([m for _, m in pts], [p for p, _ in pts], s=10, alpha=0.5, color=color,
                           marker=markers.get(op["op"], "o"),
                           label=f"{prefix}{op['op']} (median error {100 * err:.1f}%)")
            lo = min(lo, min(min(p, m) for p, m in pts))
            hi = max(hi, max(max(p, m) for p, m in pts))
        its = [it for it in data.get("iterations", []) if it.get("measured_ms") is not None
               and not (isinstance(it["measured_ms"], float) and math.isnan(it["measured_ms"]))]
        if its:
            xs = list(range(len(its)))
            err = _median(_rel_errors([it["predicted_ms"] for it in its], [it["measured_ms"] for it in its]))
            if k == 0:
                ax_it.plot(xs, [it["measured_ms"] for it in its], color="black", linewidth=2, label="measured")
            ax_it.plot(xs, [it["predicted_ms"] for it in its], color=color, linestyle="--",
                       label=f"{prefix}predicted (median error {100 * err:.1f}%)")
    if hi > 0:
        ax_ops.plot([lo, hi], [lo, hi], color="gray", linewidth=1, label="predicted = measured")
        ax_ops.fill_between([lo, hi], [0.9 * lo, 0.9 * hi], [1.1 * lo, 1.1 * hi], color="gray", alpha=0.15,
                            label="within 10%")
        ax_ops.set_xscale("log")
        ax_ops.set_yscale("log")
        for axis in (ax_ops.xaxis, ax_ops.yaxis):
            axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax_ops.set_xlabel("measured op time (ms)")
    ax_ops.set_ylabel("predicted op time (ms)")
    ax_ops.set_title("per op")
    ax_ops.legend(fontsize=7, loc="upper left", framealpha=0.8)
    ax_it.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax_it.set_xlabel("measured iteration (in trace order)")
    ax_it.set_ylabel("iteration time (ms)")
    ax_it.set_title("per iteration (pipeline makespan)")
    if ax_it.lines:
        ax_it.legend(fontsize=7)
    else:
        ax_it.text(0.5, 0.5, "no iteration times in the trace", ha="center", va="center", transform=ax_it.transAxes)
    models = [f"{d.get('label') or f'model {k + 1}'}: {d.get('cost_model', '')}" if several else d.get("cost_model", "")
              for k, d in enumerate(datasets)]
    heading = "\n".join(textwrap.fill(t, 150) for t in ([title] if title else []) + [m for m in models if m])
    if heading:
        fig.suptitle(heading, fontsize=9)
    fig.tight_layout()
    png = io.BytesIO()
    try:
        fig.savefig(png, dpi=110, format="png")
    finally:
        plt.close(fig)
    import packpipe
    packpipe.write_file_atomic(out, png.getvalue(), inputs=inputs, what="the picture")


def main(argv: Sequence[str] = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m packpipe.plots", description="Draw packpipe reports as PNG.")
    sub = p.add_subparsers(dest="what", required=True)
    v = sub.add_parser("validation", help="predicted against measured op and iteration times")
    v.add_argument("data", nargs="+", help="packpipe-validation-plot JSON files (costmodel validate --plot-data)")
    v.add_argument("-o", "--output", required=True, help="the PNG to write")
    v.add_argument("--label", action="append", default=[], help="legend label per data file, in order")
    v.add_argument("--title", default="", help="picture title")
    v.add_argument("--remove-data", action="store_true", help=argparse.SUPPRESS)  # the CLI's temporary file
    args = p.parse_args(argv)
    try:
        import packpipe
        # Before anything is read or drawn: not a data file, not a directory, writable.
        packpipe.check_outputs({"--output": args.output}, args.data)
        datasets = [read_validation_plot(f) for f in args.data]
        for d, label in zip(datasets, args.label):
            d["label"] = label
        draw_validation(datasets, args.output, args.title, inputs=args.data)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # packpipe.write_file_atomic: the picture could not be written
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {args.output}: cannot write the picture: {e.strerror or e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"error: drawing needs matplotlib (Debian: apt-get install python3-matplotlib): {e}", file=sys.stderr)
        return 2
    finally:
        if args.remove_data:
            for f in args.data:
                try:
                    os.unlink(f)
                except OSError:
                    pass
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

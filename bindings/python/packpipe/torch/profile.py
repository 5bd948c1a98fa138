"""packpipe profile: measure a model's layers on this device, in minutes, for packpipe's cost model.

    packpipe profile --model gpt --hidden 2048 --heads 16 --out gpt.profile.json --model-out gpt.json
    python3 -m packpipe.torch.profile --layer mypkg.layers:make_block --hidden 1024 --out p.json

For each layer kind (the token embedding, a transformer layer, the LM head with its loss; the
decoder layer of encoder-decoder models) and each recompute mode, it times forward and backward
on a sparse grid of (micro-batch size, sequence length) — the grid packpipe's profiled cost model
interpolates from (a FLOPs prior with residuals, docs/design/003) — with warm-up, the median of
repeats, and CUDA events on a GPU. On CUDA it also records the activations a forward keeps for its
backward and the transient peak (``torch.cuda.max_memory_allocated`` around each op). It writes
packpipe's profile file, which ``--profile`` loads as is, and reports the leave-one-out error of
the profiled model on what it measured.

A custom layer is ``--layer module:factory``: ``factory(hidden=, heads=, ffn=)`` returns a module
called as ``module(x)``, ``module(x, mask)`` (a second parameter whose name holds "mask": a causal
boolean [1, 1, seq, seq] mask, True where attending is allowed) or ``module(x, batch)`` (any other
second parameter: a batch whose ``attention_mask(causal=...)`` is that mask and whose layout is
"packed-mask", as ``packpipe.torch.attention.attention`` takes it), with x of shape [mbs, seq,
hidden]; the embedding and head are then the reference ones at the same width (give the model's
``--vocab``).
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

import packpipe
from packpipe import _check
from packpipe.torch import models

RECOMPUTE = ("none", "selective", "full")


class _Layer:
    """One layer kind to profile: a module and how to build its inputs for (mbs, seq, dec_seq)."""

    def __init__(self, kind: str, module: torch.nn.Module, run: Callable, inputs: Callable, selective: Callable):
        self.kind, self.module, self.run, self.inputs, self.selective = kind, module, run, inputs, selective


def _causal(n, device):
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()[None, None]


def _full(q, k, device):
    return torch.ones(1, 1, q, k, dtype=torch.bool, device=device)


def _set_core_checkpoint(module, on):
    for m in module.modules():
        if isinstance(m, models.Attention):
            m.checkpoint_core = on


def reference_layers(arch: str, hidden: int, heads: int, ffn: int, vocab: int, max_positions: int, device,
                     dtype, custom: Optional[torch.nn.Module] = None) -> List[_Layer]:
    """The layer kinds of the reference GPT ('gpt') or T5 ('t5') at this width (or a custom layer in
    place of the transformer layer)."""
    def rnd(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)

    emb = models.Embedding(vocab, hidden, max_positions).to(device, dtype)
    head = models.Head(vocab, hidden).to(device, dtype)

    def emb_inputs(mbs, seq, dec):
        ids = torch.randint(0, vocab, (mbs, seq), device=device)
        pos = torch.arange(seq, device=device).expand(mbs, seq)
        return (ids, pos), None

    def head_inputs(mbs, seq, dec):
        n = dec if arch == "t5" else seq
        x = rnd(mbs, n, hidden).requires_grad_(True)
        labels = torch.randint(0, vocab, (mbs, n), device=device)
        return (x, labels), x

    layers = [
        _Layer("embedding", emb, lambda m, a: m(*a), emb_inputs, lambda on: None),
        _Layer("postprocess", head, lambda m, a: models.token_loss(m(a[0]), a[1]), head_inputs, lambda on: None),
    ]
    if custom is not None:
        params = list(inspect.signature(custom.forward).parameters)
        takes_second = len(params) >= 2
        wants_mask = takes_second and "mask" in params[1].lower()

        def run_custom(m, a):
            return m(a[0], a[1]) if takes_second else m(a[0])

        def custom_inputs(mbs, seq, dec):
            x = rnd(mbs, seq, hidden).requires_grad_(True)
            mask = _causal(seq, device)
            return (x, mask if wants_mask else models.MaskedBatch(mask)), x
        layers.insert(1, _Layer("encoder", custom.to(device, dtype), run_custom, custom_inputs,
                                lambda on: _set_core_checkpoint(custom, on)))
        return layers
    enc = models.EncoderBlock(hidden, heads, ffn).to(device, dtype)

    def enc_inputs(mbs, seq, dec):
        x = rnd(mbs, seq, hidden).requires_grad_(True)
        causal = arch == "gpt"
        mask = _causal(seq, device) if causal else _full(seq, seq, device)
        return (x, models.MaskedBatch(mask), causal), x
    layers.insert(1, _Layer("encoder", enc, lambda m, a: m(*a), enc_inputs, lambda on: _set_core_checkpoint(enc, on)))
    if arch == "t5":
        dec_layer = models.DecoderBlock(hidden, heads, ffn).to(device, dtype)

        def dec_inputs(mbs, seq, dec):
            x = rnd(mbs, dec, hidden).requires_grad_(True)
            memory = rnd(mbs, seq, hidden).requires_grad_(True)
            return (x, memory, models.MaskedBatch(None, _causal(dec, device), _full(dec, seq, device))), x
        layers.insert(2, _Layer("decoder", dec_layer, lambda m, a: m(*a), dec_inputs,
                                lambda on: _set_core_checkpoint(dec_layer, on)))
    return layers


class _Timer:
    """Wall time of a region: CUDA events on a GPU (no host sync inside), perf_counter on a CPU."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def start(self):
        if self.cuda:
            self.a = torch.cuda.Event(enable_timing=True)
            self.b = torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self.b.record()
            self.b.synchronize()
            return self.a.elapsed_time(self.b)
        return (time.perf_counter() - self.t0) * 1e3


def measure(layer: _Layer, mbs: int, seq: int, dec: int, rc: str, device, repeats: int, warmup: int
            ) -> Tuple[float, float, float, float]:
    """(forward ms, backward ms, stored bytes, peak bytes) of one layer at one shape: medians over
    `repeats` after `warmup`; the backward includes the recompute forward under 'selective' and
    'full'; memory is NaN off CUDA."""
    cuda = torch.device(device).type == "cuda"
    timer = _Timer(device)
    fwd, bwd, stored, peak = [], [], [], []
    for k in range(warmup + repeats):
        args, grad_input = layer.inputs(mbs, seq, dec)
        if cuda:
            torch.cuda.synchronize(device)
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        layer.selective(rc == "selective")
        timer.start()
        if rc == "full":
            with torch.no_grad():
                out = layer.run(layer.module, args)
        else:
            out = layer.run(layer.module, args)
        tf = timer.stop()
        if cuda:
            after_fwd = torch.cuda.memory_allocated(device)
            peak_fwd = torch.cuda.max_memory_allocated(device)
        g = None if out.dim() == 0 else torch.randn_like(out)
        timer.start()
        if rc == "full":  # the recompute forward is part of the backward
            out = layer.run(layer.module, args)
        if out.requires_grad:
            torch.autograd.backward(out, g)
        tb = timer.stop()
        layer.selective(False)
        if cuda:
            peak_all = torch.cuda.max_memory_allocated(device)
            out_bytes = out.numel() * out.element_size()
            kept = max(after_fwd - base - out_bytes, 0)
            if k >= warmup:
                stored.append(float(kept))
                peak.append(float(max(peak_fwd, peak_all) - base - kept))
        if k >= warmup:
            fwd.append(tf)
            bwd.append(tb)
        layer.module.zero_grad(set_to_none=True)
        del out, args, grad_input, g
    nan = float("nan")
    return (statistics.median(fwd), statistics.median(bwd), statistics.median(stored) if stored else nan,
            statistics.median(peak) if peak else nan)


def geometric(lo: int, hi: int) -> List[int]:
    """lo, 2 lo, 4 lo, ... up to hi (hi included)."""
    out, v = [], lo
    while v < hi:
        out.append(v)
        v *= 2
    out.append(hi)
    return sorted(set(out))


def _progress(done: int, total: int, start: float, what: str, stream=sys.stderr):
    elapsed = time.monotonic() - start
    eta = elapsed / done * (total - done) if done else 0
    line = f"[{done}/{total}] {elapsed:6.1f} s, about {eta:5.0f} s left  {what}"
    if stream.isatty():
        stream.write("\r" + line[:120].ljust(120))
        if done == total:
            stream.write("\n")
    else:
        stream.write(line + "\n")
    stream.flush()


def profile(layers: Sequence[_Layer], mbs: Sequence[int], seqs: Sequence[int], dec_seqs: Sequence[int],
            recompute: Sequence[str], device, repeats: int = 5, warmup: int = 2, progress=True) -> List[tuple]:
    """Profile points (the profile file's point columns) of every layer kind, shape and recompute
    mode (recompute modes for transformer layers only; the embedding and head keep no activations
    to recompute)."""
    progress = _check.boolean("profile", "progress", progress)
    jobs = []
    for layer in layers:
        modes = recompute if layer.kind in ("encoder", "decoder") else ("none",)
        decs = dec_seqs if layer.kind == "decoder" or (layer.kind == "postprocess" and dec_seqs[0] > 0) else [0]
        seq_axis = seqs if not (layer.kind == "postprocess" and dec_seqs[0] > 0) else [0]
        for rc in modes:
            for b in mbs:
                for s in seq_axis:
                    for d in decs:
                        jobs.append((layer, rc, b, s, d))
    points, start = [], time.monotonic()
    for k, (layer, rc, b, s, d) in enumerate(jobs):
        f, w, st, pk = measure(layer, b, s if s else d, d, rc, device, repeats, warmup)
        points.append((layer.kind, 1, rc, 0, b, s, d, f, w, None if math.isnan(st) else st,
                       None if math.isnan(pk) else pk))
        if progress:
            _progress(k + 1, len(jobs), start, f"{layer.kind} rc={rc} mbs={b} seq={s}{f' dec={d}' if d else ''}: "
                                               f"fwd {f:.3f} ms bwd {w:.3f} ms")
    return points


# Limits of the command line (the cost model's query limits: costmodel::kMaxQueryMbs, kMaxQuerySeq).
_MAX_MBS = 2 ** 24
_MAX_SEQ = 2 ** 24
_MAX_WIDTH = 2 ** 20
_MAX_REPEATS = 10 ** 6


def _model_spec(a, name: str, ffn: int, dtype) -> str:
    """The model file --model-out writes (the cost model of what was profiled)."""
    cfg = (models.GPTConfig(vocab_size=a.vocab, hidden=a.hidden, layers=a.layers, heads=a.heads, ffn=ffn, dtype=dtype)
           if a.model == "gpt" else
           models.T5Config(vocab_size=a.vocab, hidden=a.hidden, encoder_layers=a.layers, decoder_layers=a.layers,
                           heads=a.heads, ffn=ffn, dtype=dtype))
    spec = json.loads(cfg.cost_model_json())
    spec["name"] = name
    return json.dumps(spec)


def _import_layer(ap: argparse.ArgumentParser, spec: str):
    """(factory, source files) of --layer module:factory; an argparse error when it cannot be imported."""
    mod, _, fn = spec.partition(":")
    if not mod or not fn:
        ap.error(f"--layer is module:factory, found '{spec}'")
    try:
        module = importlib.import_module(mod)
        factory = getattr(module, fn)
    except (ImportError, AttributeError, SyntaxError) as e:
        ap.error(f"--layer {spec}: {type(e).__name__}: {e}")
    if not callable(factory):
        ap.error(f"--layer {spec}: {fn} is a {type(factory).__name__}, expected a callable factory")
    # The module's source (and its package's) is an input: no output may overwrite it.
    files = []
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        name = getattr(m, "__name__", "")
        if f and (name == mod or mod.startswith(name + ".") or name.startswith(mod + ".")):
            files.append(f)
    return factory, files


def check_outputs(a, inputs: List[str], name: str, device_name: str, spec: Optional[str]) -> None:
    """Every output checked before any measurement: not an input (the --layer module's files), not
    each other, writable, and of a name its reader recognises: a dry run of each writer into a
    temporary folder under the output's own file name. Raises ValueError naming the option."""
    outputs = {"--out": a.out, "--model-out": a.model_out}
    packpipe.check_outputs(outputs, inputs)
    with tempfile.TemporaryDirectory(prefix="packpipe-profile-") as tmp:
        trial = os.path.join(tmp, os.path.basename(a.out))
        try:
            packpipe.write_profile(trial, [("encoder", 1, "none", 0, 1, 1, 0, 1.0, 1.0, None, None)], model=name,
                                   device=device_name)
            packpipe.read_profile([trial])
        except (ValueError, RuntimeError) as e:
            raise ValueError(f"--out {a.out}: packpipe could not read a profile written under this name: "
                             f"{str(e).replace(trial, os.path.basename(a.out))}") from None
        if spec is not None:
            trial = os.path.join(tmp, os.path.basename(a.model_out))
            packpipe.write_file_atomic(trial, spec)
            try:
                packpipe.CostModel(trial, "A100-40GB")
            except (ValueError, RuntimeError) as e:
                raise ValueError(f"--model-out {a.model_out}: packpipe could not read a model file written under this "
                                 f"name: {str(e).replace(trial, os.path.basename(a.model_out))}") from None


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="packpipe profile", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--model", choices=["gpt", "t5"], default="gpt", help="reference architecture")
    ap.add_argument("--layer", help="a custom transformer layer: module:factory (called with hidden=, heads=, ffn=)")
    ap.add_argument("--hidden", type=_check.arg_int(1, _MAX_WIDTH), default=64)
    ap.add_argument("--heads", type=_check.arg_int(1, _MAX_WIDTH), default=4)
    ap.add_argument("--ffn", type=_check.arg_int(0, _MAX_WIDTH, "0: 4 x hidden"), default=0,
                    help="MLP width (0: 4 x hidden)")
    ap.add_argument("--vocab", type=_check.arg_int(1, 2 ** 31 - 1), default=256)
    ap.add_argument("--layers", type=_check.arg_int(1, 2 ** 16), default=4,
                    help="layers of the model file written (--model-out)")
    ap.add_argument("--mbs", type=_check.arg_ints(1, _MAX_MBS), default=[1, 2, 4, 8],
                    help="micro-batch sizes (comma-separated)")
    ap.add_argument("--seq", type=_check.arg_ints(1, _MAX_SEQ), default=None,
                    help="sequence lengths (default: 32 doubling to --max-seq)")
    ap.add_argument("--max-seq", type=_check.arg_int(1, _MAX_SEQ), default=512)
    ap.add_argument("--dec-seq", type=_check.arg_ints(1, _MAX_SEQ), default=None,
                    help="decoder lengths (t5; default: 32 doubling to --max-seq / 2)")
    ap.add_argument("--recompute", default="none,selective,full", help="recompute modes to profile")
    ap.add_argument("--repeats", type=_check.arg_int(1, _MAX_REPEATS), default=5)
    ap.add_argument("--warmup", type=_check.arg_int(0, _MAX_REPEATS), default=2)
    ap.add_argument("--device", type=_check.arg_device, default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16", "fp16", "fp64"], default="bf16" if torch.cuda.is_available() else "fp32")
    ap.add_argument("--threads", type=_check.arg_int(0, _check.MAX_THREADS, "0: torch's default"), default=0,
                    help="CPU threads (0: torch's default)")
    ap.add_argument("--name", help="the model name the profile is for (the cost model's model file must say the "
                                   "same; default: reference-gpt, reference-t5, or custom-layer)")
    ap.add_argument("--out", required=True, help="the profile file to write (packpipe-profile JSON, a .json name)")
    ap.add_argument("--model-out", help="also write the model file the profiled cost model needs (--model FILE, "
                                        "a .json name)")
    ap.add_argument("--no-check", action="store_true", help="skip loading the profile back and leave-one-out")
    ap.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    a = ap.parse_args(argv)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}[a.dtype]
    ffn = a.ffn or 4 * a.hidden
    if a.hidden % a.heads:
        ap.error(f"--hidden {a.hidden} must be a multiple of --heads {a.heads}")
    device = a.device
    if a.name is not None and not a.name.strip():
        ap.error("--name is empty")
    seqs = a.seq or geometric(32, a.max_seq)
    decs = (a.dec_seq or geometric(32, max(a.max_seq // 2, 32))) if a.model == "t5" else [0]
    modes = [m for m in a.recompute.split(",") if m]
    for m in modes:
        if m not in RECOMPUTE:
            ap.error(f"--recompute: '{m}' is not one of {', '.join(RECOMPUTE)}")
    if not modes:
        ap.error(f"--recompute: no mode given (one or more of {', '.join(RECOMPUTE)})")
    factory, inputs = _import_layer(ap, a.layer) if a.layer else (None, [])
    name = a.name or ("custom-layer" if a.layer else "reference-" + a.model)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    spec = _model_spec(a, name, ffn, dtype) if a.model_out else None
    try:
        check_outputs(a, inputs, name, device_name, spec)  # before minutes of measuring
    except ValueError as e:
        ap.error(str(e))
    if a.threads:
        torch.set_num_threads(a.threads)
    custom = None
    if factory is not None:
        try:
            custom = factory(hidden=a.hidden, heads=a.heads, ffn=ffn)
        except Exception as e:  # noqa: BLE001 - the user's code: named, not dumped
            ap.error(f"--layer {a.layer}: the factory failed: {type(e).__name__}: {e}")
        if not isinstance(custom, torch.nn.Module):
            ap.error(f"--layer {a.layer}: the factory returned {type(custom).__name__}, expected a torch.nn.Module")
    torch.manual_seed(0)
    layers = reference_layers(a.model, a.hidden, a.heads, ffn, a.vocab, max(max(seqs), max(decs)) + 1, device,
                              dtype, custom)
    t0 = time.monotonic()
    points = profile(layers, a.mbs, seqs, decs, modes, device, a.repeats, a.warmup, progress=not a.json)
    seconds = time.monotonic() - t0
    notes = [f"packpipe profile: torch {torch.__version__}, {a.dtype}, {a.repeats} repeats after {a.warmup} warm-up, "
             f"medians; {'CUDA events' if device.type == 'cuda' else 'perf_counter'}; "
             f"{seconds:.1f} s", f"layer: {a.layer or 'reference ' + a.model}"]
    outputs = {"--out": a.out, "--model-out": a.model_out}
    packpipe.check_outputs(outputs, inputs, probe=False)  # again: the files may have changed while measuring
    from packpipe.torch.attention import kernel
    packpipe.write_profile(a.out, points, model=name, device=device_name, notes=notes, attention=kernel(device, dtype))
    summary = {"profile": a.out, "points": len(points), "seconds": seconds, "device": device_name, "dtype": a.dtype}
    if a.model_out:
        packpipe.write_file_atomic(a.model_out, spec, inputs=inputs, outputs={"--out": a.out}, what="--model-out")
        summary["model"] = a.model_out
    if not a.no_check and a.model_out:
        try:
            loo = packpipe.profile_leave_one_out([a.out], a.model_out)
            summary["leave_one_out"] = {"time_mape": loo["time_mape"], "linear_time_mape": loo["linear_time_mape"],
                                        "memory_mape": loo["memory_mape"] if loo["memory_predictions"] else None,
                                        "points": loo["points"]}
        except ValueError as e:  # a grid too small to leave points out: the profile itself is written
            summary["leave_one_out"] = {"skipped": str(e)}
    if a.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"packpipe profile: {len(points)} points in {seconds:.1f} s on {device_name} ({a.dtype}) -> {a.out}")
        if "skipped" in summary.get("leave_one_out", {}):
            print(f"  leave-one-out skipped: {summary['leave_one_out']['skipped']}")
        elif "leave_one_out" in summary:
            l = summary["leave_one_out"]
            mem = (f"stored memory {l['memory_mape']:.2f}%" if l["memory_mape"] is not None
                   else "memory not measured (CUDA only)")
            print(f"  leave-one-out over {l['points']} removals: time {l['time_mape']:.2f}% (linear interpolation "
                  f"{l['linear_time_mape']:.2f}%), {mem}")
    return 0


def _cli(argv: Optional[List[str]] = None) -> int:
    """main() with packpipe's and the system's errors as one line each (exit 1), not a traceback."""
    try:
        return main(argv)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"packpipe profile: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(_cli())

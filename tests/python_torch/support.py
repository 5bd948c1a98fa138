"""Shared by the packpipe.torch tests: an independent assembly of samples from the dataset, the
single-process reference (each sample alone through the whole model), parameter matching between
stage modules and the whole model, and a harness that runs functions on spawned gloo ranks."""
import datetime
import math
import multiprocessing as mp
import os
import pathlib
import queue as queue_mod
import socket
import tempfile
import time
import traceback

import numpy as np
import torch

import packpipe
from packpipe.torch import models as torch_models

IGNORE = -100
ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "data" / "demo"
CPU_DEVICE = dict(torch_models.CPU_DEVICE, name="cpu-test")


def short_manifest(directory, tasks=("define", "synonyms", "translate"), files=None):
    """A manifest of the demo's short paired tasks (input and target), in `directory`; `files` maps a
    task to the demo task whose files it reads instead of its own."""
    import json
    src = dict(zip(tasks, tasks), **(files or {}))
    m = {"version": 1, "tasks": [{"name": t, "inputs": str(DEMO / f"demo_{src[t]}_inputs_document"),
                                  "targets": str(DEMO / f"demo_{src[t]}_targets_document")} for t in tasks]}
    path = pathlib.Path(directory) / "short.json"
    path.write_text(json.dumps(m))
    return str(path)


def long_manifest(directory):
    """Manual-page text (50 to 2,000 tokens) beside short definitions: long samples to slice."""
    import json
    m = {"version": 1, "tasks": [
        {"name": "man_text", "dataset": str(DEMO / "demo_man_text")},
        {"name": "define", "inputs": str(DEMO / "demo_define_inputs_document"),
         "targets": str(DEMO / "demo_define_targets_document")}]}
    path = pathlib.Path(directory) / "long.json"
    path.write_text(json.dumps(m))
    return str(path)


def cost_model(cfg, directory):
    """packpipe's cost model of a reference model config on a CPU-like device."""
    return torch_models.cost_model(cfg, str(directory), CPU_DEVICE)


def sample_tensors(dataset, task, index, length, target_length, encdec, loss, start_id=0, pad_id=0):
    """One sample as trained, assembled here from the dataset's tokens (not by packpipe)."""
    inp, tgt = dataset.sample(int(task), int(index))
    inp, tgt = np.asarray(inp, np.int64), np.asarray(tgt, np.int64)
    if not encdec:
        seq = np.concatenate([inp, tgt])[:length]
        labels = np.full(len(seq), IGNORE, np.int64)
        labels[:-1] = seq[1:]
        if loss == "targets":
            labels[:max(len(inp) - 1, 0)] = IGNORE
        return {"input_ids": seq, "labels": labels}
    enc = inp[:length] if len(inp) else np.array([pad_id], np.int64)
    if len(tgt) == 0:
        dec_in, dec_lab = np.array([start_id]), np.array([IGNORE])
    else:
        t = tgt[:target_length]
        dec_in, dec_lab = np.concatenate([[start_id], t[:-1]]), t
    return {"input_ids": enc, "decoder_input_ids": dec_in.astype(np.int64), "decoder_labels": dec_lab.astype(np.int64)}


def batch_samples(plans):
    """(task, index, length, target_length) of every sample every replica's plan trains; a sliced
    sample (its id in several micro-batches of one plan) once, at its whole length."""
    out, whole = [], {}
    for plan in plans:
        count = {}
        for mb in plan.microbatches:
            for s in mb["samples"]:
                count[int(s)] = count.get(int(s), 0) + 1
        for mb in plan.microbatches:
            tl = mb["target_lengths"] if len(mb["target_lengths"]) else [0] * len(mb["samples"])
            for s, ref, n, t in zip(mb["samples"], mb["refs"], mb["lengths"], tl):
                if count[int(s)] > 1:
                    whole.setdefault((plan.replica, int(s)), [int(ref[0]), int(ref[1]), 0, int(t)])[2] += int(n)
                else:
                    out.append((int(ref[0]), int(ref[1]), int(n), int(t)))
    return out + [tuple(v) for v in whole.values()]


def reference_loss(model, dataset, samples, encdec, loss, global_loss_tokens):
    """Sum over samples of the summed token loss, each sample alone, / global loss tokens."""
    from packpipe.torch.models import token_loss
    total = 0
    for task, index, n, t in samples:
        s = sample_tensors(dataset, task, index, n, t, encdec, loss)
        ids = torch.from_numpy(s["input_ids"])[None]
        pos = torch.arange(ids.shape[1])[None]
        if not encdec:
            mask = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()[None, None]
            logits = model(ids, pos, mask)
            total = total + token_loss(logits, torch.from_numpy(s["labels"])[None])
        else:
            d = torch.from_numpy(s["decoder_input_ids"])[None]
            dpos = torch.arange(d.shape[1])[None]
            enc_mask = torch.ones(1, 1, ids.shape[1], ids.shape[1], dtype=torch.bool)
            self_mask = torch.ones(d.shape[1], d.shape[1], dtype=torch.bool).tril()[None, None]
            cross = torch.ones(1, 1, d.shape[1], ids.shape[1], dtype=torch.bool)
            logits = model(ids, pos, enc_mask, d, dpos, self_mask, cross)
            total = total + token_loss(logits, torch.from_numpy(s["decoder_labels"])[None])
    return total / global_loss_tokens


def param_pairs(stage, full):
    """(stage parameter, the whole model's parameter) for every parameter of a stage module."""
    pairs = []

    def add(a, b):
        if a is not None:
            pairs.extend(zip(a.parameters(), b.parameters()))

    spec = stage.spec
    if hasattr(full, "layers"):  # GPT
        add(stage.embed, full.embed)
        for i, layer in enumerate(stage.layers):
            pairs.extend(zip(layer.parameters(), full.layers[spec["encoder_layers"][0] + i].parameters()))
        add(stage.head, full.head)
    else:  # T5
        add(stage.enc_embed, full.enc_embed)
        for i, layer in enumerate(stage.encoder):
            pairs.extend(zip(layer.parameters(), full.encoder[spec["encoder_layers"][0] + i].parameters()))
        add(stage.enc_norm, full.enc_norm)
        add(stage.dec_embed, full.dec_embed)
        for i, layer in enumerate(stage.decoder):
            pairs.extend(zip(layer.parameters(), full.decoder[spec["decoder_layers"][0] + i].parameters()))
        add(stage.head, full.head)
    seen, out = set(), []
    for a, b in pairs:
        if id(a) not in seen:
            seen.add(id(a))
            out.append((a, b))
    return out


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps the gradients it was stepped with (by parameter id) in `sink`."""

    def __init__(self, params, lr, sink):
        super().__init__(params, lr=lr)
        self.sink = sink

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                self.sink[id(p)] = None if p.grad is None else p.grad.detach().clone()
        return super().step(closure)


def grad_error(pairs, sink):
    """Relative error of the gradients recorded in `sink` (by stage parameter) against the whole
    model's .grad, over the (stage parameter, whole-model parameter) pairs."""
    num = den = 0.0
    for a, b in pairs:
        x = sink.get(id(a))
        x = torch.zeros_like(b) if x is None else x
        y = torch.zeros_like(b) if b.grad is None else b.grad
        num += float(((x.double() - y.double()) ** 2).sum())
        den += float((y.double() ** 2).sum())
    return math.sqrt(num) / max(math.sqrt(den), 1e-300)


def relative_error(pairs, attr):
    """sqrt(sum |a - b|^2) / sqrt(sum |b|^2) over the pairs' `attr` ('grad' or 'data')."""
    num = den = 0.0
    for a, b in pairs:
        x, y = getattr(a, attr), getattr(b, attr)
        if x is None and y is None:
            continue
        x = torch.zeros_like(b) if x is None else x
        y = torch.zeros_like(b) if y is None else y
        num += float(((x.double() - y.double()) ** 2).sum())
        den += float((y.double() ** 2).sum())
    return math.sqrt(num) / max(math.sqrt(den), 1e-300)


# ---- spawned gloo ranks --------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, config, q):
    torch.set_num_threads(1)
    import torch.distributed as dist
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        out = fn(rank, world, config)
        q.put((rank, "ok", out))
    except BaseException:  # noqa: BLE001 - reported to the parent
        q.put((rank, "error", traceback.format_exc()))
    finally:
        q.close()
        q.join_thread()  # the result is flushed before the process ends
        os._exit(0)


def spawn(fn, world, config, timeout_s=300, expect_dead=()):
    """Runs fn(rank, world, config) on `world` spawned gloo processes (loopback, a free port);
    returns {rank: (status, result or traceback)} for the ranks that reported. Every process is
    gone when it returns (killed after the timeout)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, config, q), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results, end = {}, time.monotonic() + timeout_s
    want = world - len(expect_dead)
    while len(results) < want and time.monotonic() < end:
        try:
            rank, status, out = q.get(timeout=0.5)
            results[rank] = (status, out)
        except queue_mod.Empty:
            if all(not p.is_alive() for p in procs) and q.empty():
                break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()
    return results

"""The loss contract of packpipe.torch, and a check that a loss function keeps it.

packpipe weighs every loss token of a global batch alike: the runners divide the micro-batches'
losses by the global batch's loss tokens (over every replica), so a loss function must return the
micro-batch's **summed** token loss. :func:`summed_token_loss` is that loss for a language model's
logits; :func:`check_summed_loss` is what the runners run once on the first micro-batch a loss
function sees, so that a mean-reducing loss (or one that ignores the micro-batch's labels) fails
with a clear error instead of training with wrong weights.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn.functional as F

from packpipe import _check

IGNORE_INDEX = -100


def _labels_of(batch) -> torch.Tensor:
    """The labels the loss is over: decoder_labels on an encoder-decoder micro-batch, else labels."""
    if getattr(batch, "encoder_decoder", False):
        return batch.decoder_labels
    return batch.labels


def summed_token_loss(logits: torch.Tensor, batch, labels: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Summed cross-entropy of `logits` [rows, seq, vocab] over the micro-batch's labels (labels not
    its ``ignore_index``, IGNORE_INDEX unless the loader was given another): ``batch.labels`` (``batch.decoder_labels`` for an encoder-decoder micro-batch), or
    `labels` when given. Labels loaded with ``PlanLoader(labels="unshifted")`` (Hugging Face's
    convention) are shifted here: logits at t predict the label at t + 1. fp16 / bf16 logits are
    reduced in fp32. This is the loss packpipe's runners expect from a loss function."""
    if labels is None:
        labels = _labels_of(batch)
    if labels is None:
        raise ValueError("summed_token_loss: the micro-batch has no labels on this stage (they are loaded on the stage "
                         "that holds the head)")
    if not getattr(batch, "labels_shifted", True) and not getattr(batch, "encoder_decoder", False):
        logits, labels = logits[:, :-1], labels[:, 1:]
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"summed_token_loss: logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)} "
                         "(expected [rows, seq, vocab] and [rows, seq])")
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    if flat.dtype in (torch.float16, torch.bfloat16):
        flat = flat.float()
    return F.cross_entropy(flat, labels.reshape(-1), ignore_index=ignore_index_of(batch), reduction="sum")


def ignore_index_of(batch) -> int:
    """The label of positions without loss in `batch`: its ``ignore_index`` (PlanLoader(ignore_index=)),
    else IGNORE_INDEX."""
    return int(getattr(batch, "ignore_index", IGNORE_INDEX))


# How far the loss of the two halves may be from the whole's, relative (low-precision losses sum
# with an error of about 1e-2; a mean-reducing loss is off by about 100%).
_ADDITIVE_TOLERANCE = 0.05


def check_summed_loss(loss_fn: Callable, output: torch.Tensor, batch, where: str) -> bool:
    """Checks that `loss_fn(output, batch)` is the micro-batch's summed token loss: over two halves
    of its loss tokens (the other half's labels set to IGNORE_INDEX, ``loss_tokens`` adjusted) it
    must add up to the loss over all of them, as a sum does and a mean does not. Returns False when
    the micro-batch cannot tell (fewer than two loss tokens, or no labels on this stage); raises
    ValueError naming `where` when the loss is not additive."""
    name = "decoder_labels" if getattr(batch, "encoder_decoder", False) else "labels"
    labels = batch.loaded.get(name)
    if labels is None:
        return False
    ignore = ignore_index_of(batch)
    positions = (labels != ignore).reshape(-1).nonzero().reshape(-1)
    if positions.numel() < 2:
        return False
    halves = (positions[0::2], positions[1::2])
    with torch.no_grad():
        out = output.detach()
        whole = _value(loss_fn(out, batch), where)
        parts = []
        for keep in halves:
            masked = torch.full_like(labels, ignore).reshape(-1)
            masked[keep] = labels.reshape(-1)[keep]
            parts.append(_value(loss_fn(out, batch._with_labels(name, masked.view_as(labels), int(keep.numel()))),
                                where))
    total = parts[0] + parts[1]
    scale = abs(whole) + abs(parts[0]) + abs(parts[1])
    if abs(total - whole) <= _ADDITIVE_TOLERANCE * scale + 1e-12:
        return True
    n = positions.numel()
    if abs(whole) > 0 and abs(total / whole - 2) < 0.25:
        why = ("it behaves as a mean over the tokens (or ignores the micro-batch's labels): the halves' losses add up to "
               "about twice the whole's")
    else:
        why = "the halves' losses do not add up to the whole's"
    raise ValueError(
        f"{where}: loss_fn must return the micro-batch's summed token loss (reduction='sum'), but on micro-batch "
        f"{batch.index} ({n} loss tokens) it gave {whole:.6g} for all its loss tokens and {parts[0]:.6g} + "
        f"{parts[1]:.6g} = {total:.6g} for two halves of them: {why}. packpipe divides by the global batch's loss "
        f"tokens itself; use packpipe.torch.summed_token_loss, or compute over batch.{name} with reduction='sum' "
        "(a loss computed inside the model from its own labels cannot be checked: pass check_loss=False)")


def _scalar(loss, where: str) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise TypeError(f"{where}: the loss function must return a scalar tensor (the summed token loss), found "
                        f"{type(loss).__name__}{'' if not isinstance(loss, torch.Tensor) else ' ' + str(tuple(loss.shape))}")
    return loss


def _value(loss, where: str) -> float:
    return float(_scalar(loss, where))


def evaluate_loss(loss_fn: Callable, output: torch.Tensor, batch, where: str, check: bool) -> Tuple[torch.Tensor, bool]:
    """``loss_fn(output, batch)``, refused (TypeError) unless a scalar tensor; with `check`, first
    :func:`check_summed_loss`. Returns the loss and whether the next micro-batch must still be checked
    (this one could not tell)."""
    if _check.boolean(where, "check", check) and check_summed_loss(loss_fn, output, batch, where):
        check = False
    return _scalar(loss_fn(output, batch), where), check


_HF_NAMES = ("input_ids", "inputs_embeds", "attention_mask", "position_ids", "hidden_states")


def call_stage(module: Callable, hidden: Any, batch, where: str) -> Any:
    """``module(hidden, batch)``, the one call contract of packpipe's runners; a module written another
    way (an HF-style ``forward(input_ids=..., position_ids=...)``, say) that fails the call with a
    TypeError gets a TypeError naming the contract and what its forward takes (chained to the original)."""
    try:
        return module(hidden, batch)
    except TypeError as e:
        inner = module.module if type(module).__name__ == "DistributedDataParallel" else module
        fwd = getattr(inner, "forward", inner)
        try:
            params = [p for p in inspect.signature(fwd).parameters.values()]
        except (TypeError, ValueError):
            raise e from None
        names = [p.name for p in params]
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
        hf = [n for n in names if n in _HF_NAMES]
        if not hf and (varargs or len(positional) >= 2):
            raise  # it takes (hidden, batch): the TypeError is its own
        raise TypeError(
            f"{where}: packpipe calls every module as module(hidden, batch) (hidden: the previous stage's output, "
            f"None on the first; batch: a packpipe.torch.MicroBatch), but {type(inner).__name__}.forward takes "
            f"({', '.join(names)}) and failed: {e}. "
            + ("Wrap an HF-style model: packpipe.torch.HFCausalLM(model) calls it with input_ids, position_ids "
               "and the layout's fields and returns the logits; " if hf else "")
            + "docs/guide.md section 1 has the contract") from e

"""A model written the Hugging Face way, trained on packpipe's micro-batches without glue.

packpipe calls every module as ``module(hidden, batch)``; an HF causal LM takes ``input_ids=``,
``position_ids=``, ``attention_mask=`` and, for packed rows under flash-attention-2, the varlen
keywords. :class:`HFCausalLM` wraps one so that it keeps packpipe's contract: the whole model as one
stage (data parallelism and gradient accumulation; a pipeline needs the model cut into stages),
logits out, and the loss left to packpipe (:func:`packpipe.torch.summed_token_loss`), which sums
token losses over the micro-batch and lets the runner divide by the global batch's loss tokens: the
weighting HF's ``num_items_in_batch`` gives, over every micro-batch and replica.

Layouts: ``padded`` rows get HF's 2-D ``attention_mask`` (1 on tokens, 0 on padding); ``packed`` rows
(one row, samples back to back) get ``position_ids`` restarting per sample and, when the forward
takes them, ``cu_seq_lens_q/k``, ``max_length_q/k`` and ``seq_idx``: HF separates packed samples only
under flash-attention-2 (``DataCollatorWithFlattening``'s contract), so plan packed micro-batches only
for such a model (else ``PartitionOptions(layouts=("padded",))``). ``packed-mask`` rows (a block
mask) are refused: HF takes no block mask.
"""
from __future__ import annotations

import inspect

import torch
from torch import nn


class HFCausalLM(nn.Module):
    """``HFCausalLM(model)``: `model` (an HF-style causal LM: ``model(input_ids=..., ...)`` returning
    logits or an output with ``.logits``) called as packpipe calls a module, ``(hidden, batch)``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"HFCausalLM: model must be an nn.Module, found {type(model).__name__}")
        self.model = model
        params = inspect.signature(model.forward).parameters
        self._any_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
        self._takes = set(params)
        if "input_ids" not in self._takes and not self._any_kw:
            raise TypeError(f"HFCausalLM: {type(model).__name__}.forward takes ({', '.join(params)}), not input_ids=: "
                            "not an HF-style model (a module of packpipe's own contract, forward(hidden, batch), needs "
                            "no wrapper)")

    def _accepts(self, name: str) -> bool:
        return self._any_kw or name in self._takes

    def forward(self, hidden, batch) -> torch.Tensor:
        if hidden is not None:
            raise ValueError(f"HFCausalLM: micro-batch {batch.index}: the wrapped model runs as one whole stage "
                             "(hidden is None); a pipeline needs the model cut into stages of the contract "
                             "module(hidden, batch) (docs/guide.md section 4)")
        kw = {"input_ids": batch.input_ids}
        if self._accepts("position_ids"):
            kw["position_ids"] = batch.position_ids
        if batch.layout == "padded":
            kw["attention_mask"] = (batch.segment_ids > 0).to(torch.long)
        elif batch.layout == "packed":
            for name, value in (("cu_seq_lens_q", batch.cu_seq_lens_q), ("cu_seq_lens_k", batch.cu_seq_lens_k),
                                ("max_length_q", batch.max_length_q), ("max_length_k", batch.max_length_k),
                                ("seq_idx", batch.seq_idx)):
                if self._accepts(name):
                    kw[name] = value
        else:
            raise ValueError(f"HFCausalLM: micro-batch {batch.index} is {batch.layout}: HF models take no block "
                             "mask; plan with PartitionOptions(layouts=('packed',)) for a flash-attention-2 model, "
                             "else layouts=('padded',)")
        out = self.model(**kw)
        logits = getattr(out, "logits", None)
        if logits is None:
            logits = out[0] if isinstance(out, (tuple, list)) else out
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"HFCausalLM: {type(self.model).__name__} returned {type(out).__name__}, not logits "
                            "(a tensor, or an output with .logits)")
        return logits

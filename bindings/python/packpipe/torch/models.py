"""Reference models for tests, examples and profiling: a small GPT and a small T5-style
encoder-decoder in plain torch, cut into pipeline stages by a plan's stage table.

They exist so that packpipe can be tested and demonstrated end to end; a trainer brings its own
modules. A stage module follows the protocol :class:`packpipe.torch.PipelineRunner` calls:
``module(hidden, batch)`` with ``hidden`` the boundary activation received from the previous stage
(None on the first stage) and ``batch`` a :class:`packpipe.torch.MicroBatch`; it returns the
activation for the next stage, or the logits on the stage holding the head, which the runner hands
to the loss function.

Conventions of these models:

* attention runs in the micro-batch's layout (:mod:`packpipe.torch.attention`): packed rows
  attend per sample (varlen), padded rows densely, so every layout gives the result of one sample
  per row (up to rounding) and costs what the cost model charges;
* positions are learned absolute embeddings indexed by the per-sample position ids;
* ``vocab_size`` may be smaller than the tokenizer's vocabulary: token ids fold modulo it (tiny
  models for tests and CPU demos);
* weights are initialised from ``seed`` alone, so every rank builds the same full model and keeps
  its stages (:meth:`GPT.stage`), and a single-process reference equals the pipeline's model.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
from typing import Any, Dict, Optional, Sequence

import torch
from torch import nn
import torch.nn.functional as F

from packpipe import _check
from packpipe.torch import attention as attn
from packpipe.torch.loss import ignore_index_of

IGNORE_INDEX = -100


def _check_config(where: str, cfg, positive) -> None:
    """The shape fields of a model config: `positive` at least 1, ffn and seed at least 0, heads dividing
    hidden, dtype a torch floating dtype."""
    for name in positive:
        _check.integer(where, name, getattr(cfg, name), 1, 2**31 - 1)
    _check.integer(where, "ffn", cfg.ffn, 0, 2**31 - 1)
    _check.integer(where, "seed", cfg.seed, 0, 2**63 - 1)
    if cfg.hidden % cfg.heads != 0:
        raise ValueError(f"{where}: heads must divide hidden, found hidden {cfg.hidden} and heads {cfg.heads}")
    if not isinstance(cfg.dtype, torch.dtype) or not cfg.dtype.is_floating_point:
        raise TypeError(f"{where}: dtype must be a torch floating dtype, found {cfg.dtype!r}")


@dataclasses.dataclass
class GPTConfig:
    """Shape of the reference GPT."""
    vocab_size: int = 256
    hidden: int = 64
    layers: int = 4
    heads: int = 4
    ffn: int = 0                 # 0: 4 x hidden
    max_positions: int = 4096
    tied_embedding: bool = False
    seed: int = 0
    dtype: torch.dtype = torch.float32

    def __post_init__(self):
        """Checks every field where it enters (TypeError / ValueError naming it), never at the first forward."""
        _check_config("GPTConfig", self, ("vocab_size", "hidden", "layers", "heads", "max_positions"))
        _check.boolean("GPTConfig", "tied_embedding", self.tied_embedding)

    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    def cost_model_json(self) -> str:
        """The model as packpipe's cost model reads it (CostModel(model=<file.json>))."""
        return json.dumps({"name": "reference-gpt", "arch": "decoder_only", "num_layers": self.layers,
                           "hidden": self.hidden, "heads": self.heads, "ffn_hidden": self.ffn_size(),
                           "vocab": self.vocab_size, "bytes_per_param": _dtype_bytes(self.dtype)})


@dataclasses.dataclass
class T5Config:
    """Shape of the reference encoder-decoder model."""
    vocab_size: int = 256
    hidden: int = 64
    encoder_layers: int = 2
    decoder_layers: int = 2
    heads: int = 4
    ffn: int = 0
    max_positions: int = 4096
    seed: int = 0
    dtype: torch.dtype = torch.float32

    def __post_init__(self):
        """Checks every field where it enters (TypeError / ValueError naming it), never at the first forward."""
        _check_config("T5Config", self, ("vocab_size", "hidden", "encoder_layers", "decoder_layers", "heads",
                                         "max_positions"))

    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    def cost_model_json(self) -> str:
        """The model as packpipe's cost model reads it (CostModel(model=<file.json>))."""
        return json.dumps({"name": "reference-t5", "arch": "encoder_decoder", "encoder_layers": self.encoder_layers,
                           "decoder_layers": self.decoder_layers, "hidden": self.hidden, "heads": self.heads,
                           "ffn_hidden": self.ffn_size(), "vocab": self.vocab_size,
                           "bytes_per_param": _dtype_bytes(self.dtype)})


# A CPU as packpipe's analytic cost model sees it (rough constants for a few cores running fp32;
# packpipe.torch.Calibrator fits the model to the machine it actually runs on).
CPU_DEVICE: Dict[str, Any] = {"name": "cpu", "peak_tflops": 0.05, "memory_gb": 16, "hbm_gbps": 20,
                              "intra_node_gbps": 5, "intra_node_latency_us": 30, "inter_node_gbps": 1,
                              "inter_node_latency_us": 100, "gpus_per_node": 8}


def cost_model(cfg, directory: str, device: Optional[Dict[str, Any]] = None, inputs: Sequence[str] = ()):
    """packpipe's cost model of reference config `cfg` (GPTConfig or T5Config) on `device` (default
    CPU_DEVICE): its model and device files, model.json and device.json, are written (atomically)
    into `directory`, which must exist; `inputs` are files they must not replace. (For a model of
    your own: packpipe.torch.cost_model(module, device).)"""
    import packpipe
    from packpipe.torch.describe import cost_model_files
    model_file, device_file = cost_model_files(cfg.cost_model_json(), CPU_DEVICE if device is None else device,
                                               directory, inputs)
    return packpipe.CostModel(model_file, device_file)


def _dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# ---- building blocks ------------------------------------------------------------------------------

class Attention(nn.Module):
    """Multi-head attention over a micro-batch in its layout (packpipe.torch.attention: varlen
    segments for packed rows, dense rows for padded ones)."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        assert hidden % heads == 0, "hidden must be a multiple of heads"
        self.heads = heads
        self.q = nn.Linear(hidden, hidden)
        self.kv = nn.Linear(hidden, 2 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.checkpoint_core = False  # selective recompute: recompute the attention core in backward

    def forward(self, x: torch.Tensor, batch, causal: bool, decoder: bool = False,
                memory: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Self-attention of rows x [rows, n, hidden] (the decoder side with decoder=True), or with
        `memory` [rows, m, hidden] cross-attention of the decoder rows to the encoder rows."""
        causal = _check.boolean("Attention.forward", "causal", causal)
        decoder = _check.boolean("Attention.forward", "decoder", decoder)
        rows, n, h = x.shape
        src = x if memory is None else memory
        q = self.q(x).view(rows, n, self.heads, -1).transpose(1, 2)
        k, v = self.kv(src).view(rows, src.shape[1], 2, self.heads, -1).permute(2, 0, 3, 1, 4)

        def core(q, k, v):
            if memory is not None:
                return attn.cross_attention(q, k, v, batch)
            return attn.attention(q, k, v, batch, causal=causal, decoder=decoder)

        if self.checkpoint_core and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint
            y = checkpoint(core, q, k, v, use_reentrant=False)
        else:
            y = core(q, k, v)
        return self.out(y.transpose(1, 2).reshape(rows, n, h))


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class EncoderBlock(nn.Module):
    """Pre-norm block: self-attention (causal or not, by the mask given) and MLP."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden, ffn)

    def forward(self, x, batch, causal: bool = True):
        causal = _check.boolean("EncoderBlock.forward", "causal", causal)
        x = x + self.attn(self.norm1(x), batch, causal)
        return x + self.mlp(self.norm2(x))


class DecoderBlock(nn.Module):
    """Pre-norm block: causal self-attention, cross-attention to the encoder output, MLP."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.norm2 = nn.LayerNorm(hidden)
        self.cross = Attention(hidden, heads)
        self.norm3 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden, ffn)

    def forward(self, x, memory, batch):
        x = x + self.attn(self.norm1(x), batch, True, decoder=True)
        x = x + self.cross(self.norm2(x), batch, False, memory=memory)
        return x + self.mlp(self.norm3(x))


class Embedding(nn.Module):
    """Token and learned absolute position embeddings; ids fold modulo the vocabulary."""

    def __init__(self, vocab: int, hidden: int, max_positions: int):
        super().__init__()
        self.vocab = vocab
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_positions, hidden)

    def forward(self, ids, positions):
        if int(positions.max()) >= self.positions.num_embeddings:
            raise ValueError(f"position {int(positions.max())} beyond the model's {self.positions.num_embeddings}")
        return self.tokens(torch.remainder(ids, self.vocab)) + self.positions(positions)


class Head(nn.Module):
    """Final norm and LM head (its weight is the tied one when the embedding is tied)."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.proj = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x):
        return self.proj(self.norm(x))


def token_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Summed cross-entropy over the labels that are not `ignore_index` (ids fold modulo the vocabulary)."""
    vocab = logits.shape[-1]
    labels = torch.where(labels == ignore_index, labels, torch.remainder(labels, vocab))
    return F.cross_entropy(logits.reshape(-1, vocab).float() if logits.dtype in (torch.float16, torch.bfloat16)
                           else logits.reshape(-1, vocab), labels.reshape(-1), ignore_index=ignore_index,
                           reduction="sum")


def gpt_loss(logits: torch.Tensor, batch) -> torch.Tensor:
    """The loss function for the reference GPT: summed token loss over batch.labels."""
    return token_loss(logits, batch.labels, ignore_index_of(batch))


def t5_loss(logits: torch.Tensor, batch) -> torch.Tensor:
    """The loss function for the reference T5: summed token loss over batch.decoder_labels."""
    return token_loss(logits, batch.decoder_labels, ignore_index_of(batch))


class MaskedBatch:
    """Dense attention under explicit boolean masks (True: may attend): what the blocks take in place
    of a MicroBatch for the whole models' forward and for profiling (layout packed-mask with the masks
    given: `mask` [rows, 1, n, n] of the encoder (or GPT) side, `decoder_mask` of the decoder's
    self-attention, `cross_mask` [rows, 1, dec, n] of its cross-attention)."""
    layout = "packed-mask"

    def __init__(self, mask, decoder_mask=None, cross_mask=None):
        self._masks = {False: mask, True: decoder_mask}
        self._cross = cross_mask

    def attention_mask(self, causal: bool = True, decoder: bool = False):
        _check.boolean("MaskedBatch.attention_mask", "causal", causal)
        return self._masks[_check.boolean("MaskedBatch.attention_mask", "decoder", decoder)]

    def cross_attention_mask(self):
        return self._cross


def _spec_range(spec: Dict[str, Any], side: str):
    begin, end = spec[side]
    return range(begin, end)


# ---- GPT ------------------------------------------------------------------------------------------

class GPT(nn.Module):
    """The whole reference GPT (the single-process reference and the source of stage modules)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(cfg.seed)
        self.embed = Embedding(cfg.vocab_size, cfg.hidden, cfg.max_positions)
        self.layers = nn.ModuleList(EncoderBlock(cfg.hidden, cfg.heads, cfg.ffn_size()) for _ in range(cfg.layers))
        self.head = Head(cfg.vocab_size, cfg.hidden)
        if cfg.tied_embedding:
            self.head.proj.weight = self.embed.tokens.weight
        torch.random.set_rng_state(gen_state)
        self.to(cfg.dtype)

    def forward(self, input_ids, position_ids, mask):
        """Logits of rows [rows, seq] with an explicit attention mask [rows, 1, seq, seq] (dense
        attention: the single-process reference)."""
        x = self.embed(input_ids, position_ids)
        batch = MaskedBatch(mask)
        for layer in self.layers:
            x = layer(x, batch)
        return self.head(x)

    def stage(self, spec: Dict[str, Any], tie: Optional["GPTStage"] = None) -> "GPTStage":
        """The module of one virtual stage of a plan (an entry of Plan.stages): copies of its parts.
        With a tied embedding, ``tie`` (a stage built for the same pipeline rank, whose tied_weight
        this one's embedding or head then shares) makes the first and the last stage of one rank hold
        one Parameter, as a plan that puts both on one rank expects (it has no REDUCE_TIED)."""
        return GPTStage(self, spec, tie)


class GPTStage(nn.Module):
    """One pipeline stage of the reference GPT."""

    def __init__(self, full: GPT, spec: Dict[str, Any], tie: Optional["GPTStage"] = None):
        super().__init__()
        cfg = full.cfg
        if tie is not None and not isinstance(tie, GPTStage):
            raise TypeError(f"GPT.stage: tie must be a GPTStage (the stage whose tied weight to share), found "
                            f"{type(tie).__name__}")
        shared = tie.tied_weight if tie is not None and cfg.tied_embedding else None
        layers = _spec_range(spec, "layers" if "layers" in spec else "encoder_layers")
        if layers and (layers.stop > cfg.layers):
            raise ValueError(f"the plan's stage holds layers {layers.start}..{layers.stop - 1}; the model has "
                             f"{cfg.layers} (plan with the model's layer count)")
        if spec["decoder_layers"][1] > spec["decoder_layers"][0]:
            raise ValueError("the plan is for an encoder-decoder model; the reference GPT is decoder-only")
        self.spec = dict(spec)
        self.embed = copy.deepcopy(full.embed) if spec["embedding"] else None
        self.layers = nn.ModuleList(copy.deepcopy(full.layers[i]) for i in layers)
        self.head = copy.deepcopy(full.head) if spec["head"] else None
        if shared is not None and self.embed is not None:
            self.embed.tokens.weight = shared
        if cfg.tied_embedding and self.head is not None and self.embed is not None:
            self.head.proj.weight = self.embed.tokens.weight  # one stage holds both: tied for real
        elif cfg.tied_embedding and self.head is not None:
            self.head.proj.weight = shared if shared is not None else \
                nn.Parameter(full.embed.tokens.weight.detach().clone())
        # The tied weight's copy on this stage (REDUCE_TIED sums its gradient between the two stages).
        self.tied_weight = (self.embed.tokens.weight if self.embed is not None else
                            self.head.proj.weight if self.head is not None else None) if cfg.tied_embedding else None

    def set_selective_recompute(self, on: bool) -> None:
        """Recompute the attention cores in backward (the runner's 'selective' recompute mode)."""
        on = _check.boolean("GPTStage.set_selective_recompute", "on", on)
        for layer in self.layers:
            layer.attn.checkpoint_core = on

    def forward(self, hidden, batch):
        x = self.embed(batch.input_ids, batch.position_ids) if self.embed is not None else hidden
        if x is None:
            raise ValueError("stage without the embedding got no activation")
        for layer in self.layers:
            x = layer(x, batch, causal=True)
        return self.head(x) if self.head is not None else x


# ---- T5-style encoder-decoder ---------------------------------------------------------------------

class T5(nn.Module):
    """The whole reference encoder-decoder model."""

    def __init__(self, cfg: T5Config):
        super().__init__()
        self.cfg = cfg
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(cfg.seed)
        self.enc_embed = Embedding(cfg.vocab_size, cfg.hidden, cfg.max_positions)
        self.encoder = nn.ModuleList(EncoderBlock(cfg.hidden, cfg.heads, cfg.ffn_size())
                                     for _ in range(cfg.encoder_layers))
        self.enc_norm = nn.LayerNorm(cfg.hidden)
        self.dec_embed = Embedding(cfg.vocab_size, cfg.hidden, cfg.max_positions)
        self.decoder = nn.ModuleList(DecoderBlock(cfg.hidden, cfg.heads, cfg.ffn_size())
                                     for _ in range(cfg.decoder_layers))
        self.head = Head(cfg.vocab_size, cfg.hidden)
        torch.random.set_rng_state(gen_state)
        self.to(cfg.dtype)

    def forward(self, input_ids, position_ids, enc_mask, decoder_input_ids, decoder_position_ids, self_mask,
                cross_mask):
        """Logits of the decoder rows."""
        h = self.enc_embed(input_ids, position_ids)
        batch = MaskedBatch(enc_mask, self_mask, cross_mask)
        for layer in self.encoder:
            h = layer(h, batch, causal=False)
        memory = self.enc_norm(h)
        d = self.dec_embed(decoder_input_ids, decoder_position_ids)
        for layer in self.decoder:
            d = layer(d, memory, batch)
        return self.head(d)

    def stage(self, spec: Dict[str, Any]) -> "T5Stage":
        """The module of one virtual stage of a plan (an entry of Plan.stages)."""
        return T5Stage(self, spec)


class T5Stage(nn.Module):
    """One pipeline stage of the reference encoder-decoder model. Its input and output follow the
    plan's boundary layout: encoder stages pass [rows, seq, hidden]; decoder stages pass the
    decoder's hidden states followed along the sequence by the encoder output
    (MicroBatch.join_boundary / split_boundary)."""

    def __init__(self, full: T5, spec: Dict[str, Any]):
        super().__init__()
        cfg = full.cfg
        enc, dec = _spec_range(spec, "encoder_layers"), _spec_range(spec, "decoder_layers")
        if (enc and enc.stop > cfg.encoder_layers) or (dec and dec.stop > cfg.decoder_layers):
            raise ValueError(f"the plan's stage holds encoder layers {list(enc)} and decoder layers {list(dec)}; the "
                             f"model has {cfg.encoder_layers} and {cfg.decoder_layers}")
        loads = set(spec["loads"])
        self.spec = dict(spec)
        self.enc_embed = copy.deepcopy(full.enc_embed) if "input_ids" in loads else None
        self.encoder = nn.ModuleList(copy.deepcopy(full.encoder[i]) for i in enc)
        # The encoder's final norm sits with its last layer (or, with no encoder layer on any stage
        # after the embedding, on the first decoder stage).
        ends_encoder = (len(enc) > 0 and enc.stop == cfg.encoder_layers) or \
            (cfg.encoder_layers == 0 and "decoder_input_ids" in loads)
        self.enc_norm = copy.deepcopy(full.enc_norm) if ends_encoder else None
        self.dec_embed = copy.deepcopy(full.dec_embed) if "decoder_input_ids" in loads else None
        self.decoder = nn.ModuleList(copy.deepcopy(full.decoder[i]) for i in dec)
        self.head = copy.deepcopy(full.head) if spec["head"] else None
        self.tied_weight = None

    def set_selective_recompute(self, on: bool) -> None:
        """Recompute the attention cores in backward (the runner's 'selective' recompute mode)."""
        on = _check.boolean("T5Stage.set_selective_recompute", "on", on)
        for layer in list(self.encoder) + list(self.decoder):
            layer.attn.checkpoint_core = on
            if hasattr(layer, "cross"):
                layer.cross.checkpoint_core = on

    def forward(self, hidden, batch):
        decoder_side = self.dec_embed is not None or len(self.decoder) > 0 or self.head is not None
        if self.dec_embed is None and decoder_side:
            d, memory = batch.split_boundary(hidden)
        else:
            h = self.enc_embed(batch.input_ids, batch.position_ids) if self.enc_embed is not None else hidden
            for layer in self.encoder:
                h = layer(h, batch, causal=False)
            if self.enc_norm is not None:
                h = self.enc_norm(h)
            if not decoder_side:
                return h
            memory = h
            d = self.dec_embed(batch.decoder_input_ids, batch.decoder_position_ids)
        for layer in self.decoder:
            d = layer(d, memory, batch)
        if self.head is not None:
            return self.head(d)
        return batch.join_boundary(d, memory)

"""A small decoder-only language model, written as a user of packpipe would write their own.

It is plain PyTorch except for two things every model trained on packpipe's micro-batches needs:

* attention in the micro-batch's layout: ``packpipe.torch.attention.attention(q, k, v, batch,
  causal=True)``. A "packed" micro-batch holds several samples in one row; plain attention over the
  row would let them attend to each other. (A model with its own attention may instead plan with
  ``PartitionOptions(layouts=("padded",))``: one sample a row, padding masked as usual.)
* positions restarting at each sample: ``batch.position_ids``.

The same modules serve every path of docs/guide.md: ``TinyLM`` is the whole model (one stage:
data parallelism and gradient accumulation), ``TinyLM.stage(spec)`` one pipeline stage of it, built
from the loader's stage table (``spec["layers"]``, ``spec["embedding"]``, ``spec["head"]``). A stage
shares its parameters with the whole model, so in one process the stages are the model.
"""
import torch
import torch.nn.functional as F
from torch import nn

import packpipe.torch as pt
from packpipe.torch.attention import attention

# The demo data's token ids are GPT-2's (up to 50256). To stay fast on a CPU this demo model folds
# them into a small vocabulary (fold()); a real model has its tokenizer's vocabulary and no fold.
VOCAB = 512


def fold(ids: torch.Tensor, vocab: int = VOCAB) -> torch.Tensor:
    """Token ids folded into [0, vocab); IGNORE_INDEX (-100) labels stay."""
    return torch.where(ids < 0, ids, torch.remainder(ids, vocab))


def loss_fn(logits, batch):
    """The micro-batch's summed token loss (packpipe divides by the global batch's loss tokens)."""
    return pt.summed_token_loss(logits, batch, labels=fold(batch.labels, logits.shape[-1]))


class Block(nn.Module):
    """Pre-norm transformer layer: causal self-attention and an MLP."""

    def __init__(self, hidden: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)

    def forward(self, x, batch):
        rows, n, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(rows, n, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        y = attention(q, k, v, batch, causal=True)  # each sample attends to itself only
        x = x + self.proj(y.transpose(1, 2).reshape(rows, n, h))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


def make_block(hidden: int, heads: int, ffn: int) -> Block:
    """One layer, for ``packpipe profile --layer my_model:make_block``."""
    return Block(hidden, heads, ffn)


class TinyLM(nn.Module):
    """Token and position embeddings, `layers` blocks, a final norm and an LM head tied to the
    token embedding. Called as packpipe calls every stage: ``model(hidden, batch)`` (hidden is None:
    the whole model is the first stage)."""

    def __init__(self, vocab: int = VOCAB, hidden: int = 32, layers: int = 4, heads: int = 4, max_len: int = 2048,
                 seed: int = 0, dtype=torch.float32):
        super().__init__()
        torch.manual_seed(seed)  # every rank builds the same model
        self.embed = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_len, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, 4 * hidden) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied
        nn.init.normal_(self.embed.weight, std=0.02)
        self.to(dtype)

    def forward(self, hidden, batch):
        return TinyLMStage(self, {"layers": (0, len(self.blocks)), "embedding": True, "head": True})(hidden, batch)

    def stage(self, spec) -> "TinyLMStage":
        """The module of one virtual stage (an entry of PlanLoader.stages / Plan.stages)."""
        return TinyLMStage(self, spec)


class TinyLMStage(nn.Module):
    """The parts of a TinyLM one pipeline stage holds (shared with the model, not copied)."""

    def __init__(self, model: TinyLM, spec):
        super().__init__()
        first, last = spec["layers"]
        self.embed = model.embed if spec["embedding"] else None
        self.pos = model.pos if spec["embedding"] else None
        self.blocks = nn.ModuleList(model.blocks[first:last])
        self.norm = model.norm if spec["head"] else None
        self.head = model.head if spec["head"] else None
        # The tied weight as this stage holds it: a plan with tied_embedding=True sums its gradient
        # between the first and the last stage when they run in different processes.
        self.tied_weight = model.embed.weight if (spec["embedding"] or spec["head"]) else None

    def forward(self, hidden, batch):
        if self.embed is not None:
            x = self.embed(fold(batch.input_ids, self.embed.num_embeddings)) + self.pos(batch.position_ids)
        else:
            x = hidden
        for block in self.blocks:
            x = block(x, batch)
        return self.head(self.norm(x)) if self.head is not None else x

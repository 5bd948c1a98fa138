"""Synthetic long-context length mixtures at GPU scale, for benchmarks/layouts_sim.py.

Each mixture is a global batch of about `tokens` tokens: long documents, drawn until they hold
`long_share` of the tokens, then short instruction or chat samples up to the total. The shapes
follow the public descriptions named below; the parameters (the share, the short samples' median
and spread) are ours, chosen to match those descriptions, not fitted to released files.

- "longalign-64K": LongAlign (Bai et al., EMNLP 2024, arXiv 2401.18058) trains on LongAlign-10k,
  10k long instruction samples of 8K to 64K tokens, mixed with ShareGPT's short chats. Long
  lengths: log-uniform on [8K, 64K] (more short documents than long ones, as its length histogram
  falls); short: log-normal, median 500 tokens, sigma 1.0, within [16, 8K]; half the tokens long.
- "chatqa2-128K": ChatQA 2 (Xu et al., arXiv 2407.14482) extends Llama 3 to 128K and tunes it on
  long instruction data up to 128K tokens beside short SFT data. Long lengths: log-uniform on
  [16K, 128K]; short samples as above; half the tokens long.

Every draw comes from numpy's default_rng(seed): the same arguments give the same lengths.
"""
import numpy as np

MIXTURES = {
    # name: (long lo, long hi, long share of tokens, short median, short sigma, short cap)
    "longalign-64K": (8192, 65536, 0.5, 500, 1.0, 8192),
    "chatqa2-128K": (16384, 131072, 0.5, 500, 1.0, 8192),
}


def mixture(name: str, rng: np.random.Generator, tokens: int = 262144) -> np.ndarray:
    """One global batch's input lengths (uint32) of mixture `name`: long documents first, then short
    samples; about `tokens` tokens in all (the last sample may pass it)."""
    if name not in MIXTURES:
        raise ValueError(f"unknown mixture {name!r} (expected one of {', '.join(MIXTURES)})")
    if tokens < 1:
        raise ValueError(f"tokens must be at least 1, found {tokens}")
    lo, hi, share, median, sigma, cap = MIXTURES[name]
    out, total = [], 0
    while total < share * tokens:
        n = int(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        out.append(n)
        total += n
    while total < tokens:
        n = int(np.clip(rng.lognormal(np.log(median), sigma), 16, cap))
        out.append(n)
        total += n
    return np.asarray(out, dtype=np.uint32)


def batches(name: str, count: int, seed: int, tokens: int = 262144) -> list:
    """`count` global batches of mixture `name`."""
    rng = np.random.default_rng(seed)
    return [mixture(name, rng, tokens) for _ in range(count)]

"""Sampling for :meth:`~posenc.model.seq2seq.Seq2Seq.generate`: temperature, top-k and top-p
(nucleus) filtering, and seeded draws of each sentence's own, so that a sentence gets the same
draws whatever batch it is decoded in.

At each step the logits are divided by the temperature, every token outside the ``top_k`` most
probable is dropped, then every token outside the nucleus: sorted by probability (of what is
left, renormalised), a token is kept while the probability of the tokens before it is below
``top_p`` (the most probable token is always kept). Padding and BOS are never drawn, as beam
search never chooses them. The token is drawn by inverting the cumulative distribution (in
vocabulary order) at one uniform number, so one draw costs one number whatever the vocabulary.

The uniform numbers of sentence ``i`` come from a :class:`torch.Generator` on the model's device
seeded by ``(seed, i)``, never the global RNG: a sentence draws ``limit`` numbers (its length
limit, which only its own length sets), and its ``t``-th token uses the ``t``-th. The same seed
and device give the same translations (CPU and CUDA generators draw different numbers); sentences
decoded together or apart get the same draws, so the same tokens unless the batch changes their
logits by a rounding error that moves a cumulative probability across the drawn number.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn (``eval.sampling=true`` and its settings).

    Attributes:
        top_k: draw among the ``top_k`` most probable tokens only (None: all).
        top_p: draw among the fewest most probable tokens whose probabilities reach ``top_p``
            (in (0, 1]; None or 1: all).
        temperature: the logits are divided by it (> 0); towards 0 sampling becomes greedy.
        seed: with a sentence's index, the seed of its draws.
    """

    top_k: int | None = None
    top_p: float | None = None
    temperature: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k={self.top_k} must be an integer >= 1 or null")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be a number in (0, 1] or null")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature={self.temperature} must be a number > 0")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} must be an integer >= 0")

    def describe(self) -> str:
        """``top_k=None top_p=0.9 temperature=1.0 seed=1``, for a log line."""
        return (
            f"top_k={self.top_k} top_p={self.top_p} temperature={self.temperature} seed={self.seed}"
        )

    def uniforms(self, sentences: Sequence[int], limits: Tensor) -> Tensor:
        """``(B, max(limits))`` the uniform numbers in [0, 1) of each row: row ``b`` holds the
        first ``limits[b]`` numbers of sentence ``sentences[b]``'s generator (on ``limits``'
        device), then zeros."""
        device = limits.device
        counts = limits.tolist()
        rows = torch.zeros(len(counts), max(counts, default=0), dtype=torch.float64, device=device)
        for row, (sentence, count) in enumerate(zip(sentences, counts, strict=True)):
            generator = torch.Generator(device).manual_seed(sentence_seed(self.seed, sentence))
            drawn = torch.rand(count, generator=generator, dtype=torch.float64, device=device)
            rows[row, :count] = drawn
        return rows

    def draw(self, logits: Tensor, uniform: Tensor, never: Sequence[int] = ()) -> Tensor:
        """``(B,)`` one token per row of ``logits (B, V)``, drawn with ``uniform (B,)`` from the
        filtered distribution; the tokens ``never`` (padding, BOS) are left out first."""
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        if never:
            logits = logits.index_fill(
                -1, torch.tensor(list(never), device=logits.device), -math.inf
            )
        probs = filter_logits(logits, self.top_k, self.top_p, self.temperature).softmax(-1)
        return inverse_cdf(probs, uniform)


def sentence_seed(seed: int, sentence: int) -> int:
    """The seed of sentence ``sentence``'s generator under ``seed``: 63 bits of a hash of both,
    so that no two pairs share a generator by arithmetic accident."""
    digest = hashlib.blake2b(f"{seed},{sentence}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def filter_logits(
    logits: Tensor, top_k: int | None = None, top_p: float | None = None, temperature: float = 1.0
) -> Tensor:
    """``logits (B, V)`` divided by ``temperature``, with every token outside the ``top_k`` most
    probable, then outside the nucleus of ``top_p`` (of the distribution top-k leaves), set to
    ``-inf``. The most probable token always stays."""
    logits = logits / temperature
    vocab = logits.shape[-1]
    if top_k is not None and top_k < vocab:
        kept = logits.topk(top_k, dim=-1).indices
        mask = torch.ones_like(logits, dtype=torch.bool).scatter(-1, kept, False)
        logits = logits.masked_fill(mask, -math.inf)
    if top_p is not None and top_p < 1:
        probs, order = logits.softmax(-1).sort(dim=-1, descending=True, stable=True)
        # the probability of the tokens ranked before each (0 before the most probable)
        before = torch.cat([torch.zeros_like(probs[..., :1]), probs.cumsum(-1)[..., :-1]], -1)
        ranked_out = before >= top_p
        drop = torch.zeros_like(ranked_out).scatter(-1, order, ranked_out)
        logits = logits.masked_fill(drop, -math.inf)
    return logits


def inverse_cdf(probs: Tensor, uniform: Tensor) -> Tensor:
    """``(B,)`` for each row of ``probs (B, V)`` the first token whose cumulative probability
    (in vocabulary order) exceeds ``uniform (B,) * total``: a draw from ``probs``, never a token
    of probability 0."""
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:]
    value = uniform.to(cdf.dtype)[:, None] * total
    token = torch.searchsorted(cdf, value, right=True)[:, 0]
    last = cdf.lt(total).sum(-1)  # the first token where the cumulative probability is whole
    return torch.minimum(token, last)

"""Batched translation of tokenised sources under a token budget: greedy, sampling or beam search
(its best hypothesis, or its n best), with a progress bar over sentences."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor
from tqdm import tqdm

from posenc.config import EvalConfig
from posenc.data.batching import TokenBatcher, collate
from posenc.data.tokenizer import Tokenizer
from posenc.model.sampling import Sampling
from posenc.model.search import Hypothesis
from posenc.model.seq2seq import Translator
from posenc.runtime.progress import bar_disabled

T = TypeVar("T")


@dataclass(frozen=True)
class DecodeSettings:
    """How sentences are decoded: ``eval.batch_tokens`` (source tokens per batch),
    ``eval.max_len_a/b``, ``eval.use_cache``, ``eval.beam_size``, ``eval.lenpen``, sampling
    (``eval.sampling=true`` with ``eval.top_k``, ``eval.top_p``, ``eval.temperature`` and
    ``eval.seed``; None: off), and whether a progress bar is shown (``trainer.progress``)."""

    batch_tokens: int
    max_len_a: float
    max_len_b: int
    use_cache: bool = True
    beam_size: int = 1
    lenpen: float = 1.0
    progress: bool = False
    sampling: Sampling | None = None

    @classmethod
    def of(cls, settings: EvalConfig, progress: bool = False) -> DecodeSettings:
        """The settings of a run's ``eval`` group, a progress bar with ``progress``
        (``trainer.progress``)."""
        sampling = None
        if settings.sampling:
            sampling = Sampling(
                top_k=settings.top_k,
                top_p=settings.top_p,
                temperature=1.0 if settings.temperature is None else settings.temperature,
                seed=settings.seed or 0,
            )
        return cls(
            batch_tokens=settings.batch_tokens,
            max_len_a=settings.max_len_a,
            max_len_b=settings.max_len_b,
            use_cache=settings.use_cache,
            beam_size=settings.beam_size,
            lenpen=settings.lenpen,
            progress=progress,
            sampling=sampling,
        )

    def describe(self) -> str:
        """``greedy``, ``beam 5 (lenpen 0.6)`` or ``sampling (top_k=...)``, for a log line."""
        if self.sampling is not None:
            return f"sampling ({self.sampling.describe()})"
        return "greedy" if self.beam_size == 1 else f"beam {self.beam_size} (lenpen {self.lenpen})"


def decode_sources(
    model: Translator,
    tokenizer: Tokenizer,
    sources: list[list[int]],
    settings: DecodeSettings,
    device: torch.device,
    sentence_ids: Sequence[int] | None = None,
) -> tuple[list[list[int]], float]:
    """Translations of tokenised ``sources`` (in input order) and the seconds it took.

    Sentences are batched by length under a token budget so little compute goes to padding;
    the progress bar (stderr, cleared when done) counts sentences. Sampled, source ``i`` draws
    from the generator of sentence ``sentence_ids[i]`` (default: ``i``) whatever its batch.
    """
    ids = range(len(sources)) if sentence_ids is None else sentence_ids

    def best(src: Tensor, indices: list[int]) -> list[list[int]]:
        return model.generate(
            src,
            settings.max_len_a,
            settings.max_len_b,
            use_cache=settings.use_cache,
            beam_size=settings.beam_size,
            lenpen=settings.lenpen,
            sampling=settings.sampling,
            sentence_ids=[ids[i] for i in indices],
        )

    return _in_batches(tokenizer, sources, settings, device, best)


def decode_nbest(
    model: Translator,
    tokenizer: Tokenizer,
    sources: list[list[int]],
    settings: DecodeSettings,
    device: torch.device,
    nbest: int,
) -> tuple[list[list[Hypothesis]], float]:
    """The ``nbest`` best hypotheses of beam search (``settings.beam_size`` wide) for each of
    ``sources`` (in input order), best first, with their scores; and the seconds it took.

    Raises:
        ValueError: ``nbest`` is not in [1, beam size], or ``settings`` sample.
    """
    if settings.sampling is not None and nbest > 1:
        raise ValueError(f"nbest={nbest} lists beam search's hypotheses: sampling draws one")
    if not 1 <= nbest <= settings.beam_size:
        raise ValueError(
            f"nbest={nbest} needs a beam at least as wide: eval.beam_size={settings.beam_size}"
        )

    def hypotheses(src: Tensor, indices: list[int]) -> list[list[Hypothesis]]:
        return model.nbest(
            src,
            nbest,
            settings.beam_size,
            settings.lenpen,
            settings.max_len_a,
            settings.max_len_b,
            settings.use_cache,
        )

    return _in_batches(tokenizer, sources, settings, device, hypotheses)


def _in_batches(
    tokenizer: Tokenizer,
    sources: list[list[int]],
    settings: DecodeSettings,
    device: torch.device,
    decode: Callable[[Tensor, list[int]], list[T]],
) -> tuple[list[T], float]:
    """``decode(src, indices)`` over token-budget batches of ``sources`` (``indices``: their
    positions in ``sources``): its answers in input order and the seconds it took."""
    batcher = TokenBatcher(
        [len(s) for s in sources], [0] * len(sources), settings.batch_tokens, shuffle=False
    )
    outputs: list = [None] * len(sources)
    bar = tqdm(
        total=len(sources),
        desc="decoding",
        unit="sent",
        disable=bar_disabled(settings.progress),
        leave=False,
        dynamic_ncols=True,
    )
    started = time.perf_counter()
    for indices in batcher.batches(0):
        src, _, _ = collate(
            [sources[i] for i in indices],
            [[] for _ in indices],
            tokenizer.pad_id,
            tokenizer.bos_id,
            tokenizer.eos_id,
        )
        rows = decode(src.to(device), [int(i) for i in indices])
        for i, row in zip(indices, rows, strict=True):
            outputs[i] = row
        bar.update(len(indices))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    bar.close()
    return outputs, seconds

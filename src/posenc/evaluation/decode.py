"""Batched translation of tokenised sources under a token budget: greedy or beam search, with a
progress bar over sentences."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from posenc.config import EvalConfig
from posenc.data.batching import TokenBatcher, collate
from posenc.data.tokenizer import Tokenizer
from posenc.model.seq2seq import Seq2Seq


@dataclass(frozen=True)
class DecodeSettings:
    """How sentences are decoded: ``eval.batch_tokens`` (source tokens per batch),
    ``eval.max_len_a/b``, ``eval.use_cache``, ``eval.beam_size``, ``eval.lenpen``, and whether a
    progress bar is shown (``trainer.progress``)."""

    batch_tokens: int
    max_len_a: float
    max_len_b: int
    use_cache: bool = True
    beam_size: int = 1
    lenpen: float = 1.0
    progress: bool = False

    @classmethod
    def of(cls, cfg: DictConfig) -> DecodeSettings:
        """The settings of a run's config (its ``eval`` group and ``trainer.progress``)."""
        settings = EvalConfig.of(cfg.eval)
        return cls(
            batch_tokens=settings.batch_tokens,
            max_len_a=settings.max_len_a,
            max_len_b=settings.max_len_b,
            use_cache=settings.use_cache,
            beam_size=settings.beam_size,
            lenpen=settings.lenpen,
            progress=bool(cfg.trainer.progress),
        )


def translate(
    model: Seq2Seq,
    tokenizer: Tokenizer,
    sources: list[list[int]],
    settings: DecodeSettings,
    device: torch.device,
) -> tuple[list[list[int]], float]:
    """Translations of tokenised ``sources`` (in input order) and the seconds it took.

    Sentences are batched by length under a token budget so little compute goes to padding;
    the progress bar (stderr, cleared when done) counts sentences.
    """
    batcher = TokenBatcher(
        [len(s) for s in sources], [0] * len(sources), settings.batch_tokens, shuffle=False
    )
    outputs: list[list[int]] = [[] for _ in sources]
    bar = tqdm(
        total=len(sources),
        desc="decoding",
        unit="sent",
        disable=not settings.progress,
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
        rows = model.generate(
            src.to(device),
            settings.max_len_a,
            settings.max_len_b,
            use_cache=settings.use_cache,
            beam_size=settings.beam_size,
            lenpen=settings.lenpen,
        )
        for i, row in zip(indices, rows, strict=True):
            outputs[i] = row
        bar.update(len(indices))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    bar.close()
    return outputs, seconds

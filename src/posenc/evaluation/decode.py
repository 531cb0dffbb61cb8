"""Batched greedy translation of tokenised sources under a token budget."""

from __future__ import annotations

import time

import torch

from posenc.data.batching import TokenBatcher, collate
from posenc.data.tokenizer import Tokenizer
from posenc.model.seq2seq import Seq2Seq


def translate(
    model: Seq2Seq,
    tokenizer: Tokenizer,
    sources: list[list[int]],
    batch_tokens: int,
    max_len_a: float,
    max_len_b: int,
    use_cache: bool,
    device: torch.device,
) -> tuple[list[list[int]], float]:
    """Greedy translations of tokenised ``sources`` (in input order) and the seconds it took.

    Sentences are batched by length under a token budget so little compute goes to padding.
    """
    batcher = TokenBatcher(
        [len(s) for s in sources], [0] * len(sources), batch_tokens, shuffle=False
    )
    outputs: list[list[int]] = [[] for _ in sources]
    started = time.perf_counter()
    for indices in batcher.batches(0):
        src, _, _ = collate(
            [sources[i] for i in indices],
            [[] for _ in indices],
            tokenizer.pad_id,
            tokenizer.bos_id,
            tokenizer.eos_id,
        )
        rows = model.generate(src.to(device), max_len_a, max_len_b, use_cache=use_cache)
        for i, row in zip(indices, rows, strict=True):
            outputs[i] = row
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return outputs, time.perf_counter() - started

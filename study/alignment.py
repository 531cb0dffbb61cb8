"""How monotonically a trained model's cross-attention walks through the source: a probe of
where position enters the decoder's view of the source, by layer and head.

Translation from French to English is close to monotone, so a cross-attention head that knows
where it is in both sentences puts its weight further right in the source as the target moves
on. A head's **monotonicity** on one sentence pair is the Pearson correlation between the query
position ``t`` (BOS and the target) and the expected key position under its weights,
``sum_s w[t, s] * s`` (the source and EOS); 1 is a diagonal walk, 0 no relation to position.
A model's score is that correlation's mean over sentence pairs, per decoder layer and head,
teacher-forced."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from posenc.api import TrainedRun
from posenc.data.batching import collate

#: sentence pairs teacher-forced at once
BATCH = 32


def monotonicity(weights: np.ndarray) -> np.ndarray:
    """``(H,)`` per head: the correlation between the query position and the expected key
    position of ``weights (H, Lq, Lk)`` (each query's row sums to 1); NaN for a head whose
    expected positions do not vary, or with fewer than three queries."""
    heads, queries, keys = weights.shape
    if queries < 3:
        return np.full(heads, np.nan)
    expected = weights @ np.arange(keys, dtype=np.float64)  # (H, Lq)
    t = np.arange(queries, dtype=np.float64)
    t -= t.mean()
    centred = expected - expected.mean(axis=1, keepdims=True)
    spread = np.sqrt((centred**2).sum(axis=1)) * np.sqrt((t**2).sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        score = centred @ t / spread
    return np.where(spread > 1e-12, score, np.nan)


@dataclass
class Probe:
    """A model's monotonicity, ``scores (layers, H)``: the mean over the sentence pairs that
    defined it, per decoder layer and head; ``pairs`` is how many pairs were read."""

    scores: np.ndarray
    pairs: int

    def last_layer(self) -> float:
        """The last decoder layer's score, averaged over its heads."""
        return float(np.nanmean(self.scores[-1]))

    def best_head(self) -> tuple[float, int, int]:
        """``(score, layer, head)`` of the most monotone head."""
        layer, head = np.unravel_index(np.nanargmax(self.scores), self.scores.shape)
        return float(self.scores[layer, head]), int(layer), int(head)


def probe(run: TrainedRun, sources: Sequence[str], targets: Sequence[str]) -> Probe:
    """:class:`Probe` of ``run``'s model on the pairs ``(sources, targets)``, teacher-forced
    in batches of :data:`BATCH` (each pair's own lengths read, its padding left out)."""
    tokenizer, model = run.tokenizer, run.model
    totals: np.ndarray | None = None
    counts: np.ndarray | None = None
    for start in range(0, len(sources), BATCH):
        src_ids = tokenizer.encode_batch(list(sources[start : start + BATCH]))
        tgt_ids = tokenizer.encode_batch(list(targets[start : start + BATCH]))
        src, tgt_in, _ = collate(
            src_ids, tgt_ids, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
        )
        with torch.no_grad():
            maps = model.cross_attention_maps(src.to(run.device), tgt_in.to(run.device))
        for row, (s, t) in enumerate(zip(src_ids, tgt_ids, strict=True)):
            per_layer = np.stack(
                [
                    monotonicity(m[row, :, : len(t) + 1, : len(s) + 1].double().cpu().numpy())
                    for m in maps
                ]
            )  # (layers, H)
            if totals is None or counts is None:
                totals, counts = np.zeros_like(per_layer), np.zeros_like(per_layer)
            defined = ~np.isnan(per_layer)
            totals += np.where(defined, per_layer, 0.0)
            counts += defined
    if totals is None or counts is None:
        raise ValueError("the probe needs at least one sentence pair")
    with np.errstate(invalid="ignore"):
        return Probe(totals / counts, len(sources))

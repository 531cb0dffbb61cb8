"""Beam search for :class:`~posenc.model.seq2seq.Seq2Seq`, batched over sentences and beams.

It follows the rules of fairseq's sequence generator. Every sentence keeps ``K`` hypotheses
(``N`` sentences still decoding give ``N*K`` decoder rows). At each step the ``2K`` best
extensions of a sentence's hypotheses are ranked by their summed log-probabilities; those among
the first ``K`` that end in EOS are finished, scored ``sum of log-probabilities / length **
lenpen`` (the length counts EOS), and the ``K`` best that do not end in EOS go on. A sentence
stops once it has ``K`` finished hypotheses, or at its length limit ``max_len_a * source_length
+ max_len_b`` (where every hypothesis still growing gets EOS, as in greedy decoding). Padding
and BOS are never chosen; an empty translation (EOS first) is allowed, as in greedy decoding.

The decoder's key/value cache follows the surviving hypotheses: its rows are re-ordered with
:meth:`DecoderCache.reorder`, and the rows of finished sentences are dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from posenc.model.layers import DecoderCache

if TYPE_CHECKING:
    from posenc.model.seq2seq import Seq2Seq


@dataclass(frozen=True)
class Hypothesis:
    """A finished translation: its token ids (without BOS and EOS), its score, the sum of the
    log-probabilities of the tokens and EOS divided by ``(len(tokens) + 1) ** lenpen`` (what
    ranks hypotheses), and that sum itself, ``log_prob`` (nan where it was not given)."""

    tokens: list[int]
    score: float
    log_prob: float = math.nan


@dataclass
class Beams:
    """The hypotheses still growing: ``K`` for each of the ``N`` sentences still decoding.

    Attributes:
        tokens: ``(N*K, t)`` BOS and the ``t - 1`` tokens chosen so far, row ``n*K + k``.
        scores: ``(N, K)`` summed log-probabilities; ``-inf`` marks an empty slot.
        sentences: ``(N,)`` each sentence's index in the input batch.
        limits: ``(N,)`` the most tokens, EOS included, each sentence may produce.
        memory: ``(N*K, Ls, d)`` the encoder output for each row; ``src_pad`` ``(N*K, Ls)``.
        cache: the decoder's keys and values for each row (None: recompute every step).
    """

    tokens: Tensor
    scores: Tensor
    sentences: Tensor
    limits: Tensor
    memory: Tensor
    src_pad: Tensor
    cache: DecoderCache | None

    def select(self, sentences: Tensor, rows: Tensor, tokens: Tensor, scores: Tensor) -> None:
        """Go on with the sentences ``sentences (N',)`` (positions in this batch), whose new
        hypotheses extend rows ``rows (N'*K,)`` by ``tokens (N'*K,)`` with ``scores (N', K)``."""
        self.tokens = torch.cat([self.tokens[rows], tokens[:, None]], dim=1)
        self.scores = scores
        self.sentences = self.sentences[sentences]
        self.limits = self.limits[sentences]
        self.memory = self.memory[rows]
        self.src_pad = self.src_pad[rows]
        if self.cache is not None:
            self.cache.reorder(rows)


def max_lengths(src_pad: Tensor, max_len_a: float, max_len_b: int) -> Tensor:
    """``(B,)`` the most tokens (EOS included) each source of ``src_pad (B, Ls)`` may produce:
    ``max_len_a * source_length + max_len_b``, rounded down."""
    return ((~src_pad).sum(dim=1).float() * max_len_a + max_len_b).long()


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src: Tensor,
    beam_size: int,
    lenpen: float = 1.0,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    use_cache: bool = True,
) -> list[list[Hypothesis]]:
    """Beam search of width ``beam_size`` for each source of ``src (B, Ls)`` (``model`` in
    eval mode). Returns, per source, its finished hypotheses (at least one, at most
    ``beam_size``), best score first. ``use_cache=False`` recomputes the whole prefix at every
    step (a reference for the cache)."""
    memory, src_pad = model.encode(src)
    batch, k = src.shape[0], beam_size
    rows = torch.arange(batch, device=src.device).repeat_interleave(k)
    scores = torch.full((batch, k), -math.inf, dtype=memory.dtype, device=src.device)
    scores[:, 0] = 0.0  # one hypothesis to start from, not K copies of it
    beams = Beams(
        tokens=torch.full((batch * k, 1), model.bos_id, dtype=torch.long, device=src.device),
        scores=scores,
        sentences=torch.arange(batch, device=src.device),
        limits=max_lengths(src_pad, max_len_a, max_len_b),
        memory=memory[rows],
        src_pad=src_pad[rows],
        cache=DecoderCache() if use_cache else None,
    )
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    for step in range(max(int(beams.limits.max()), 1)):
        forced = beams.limits <= step + 1
        cand_scores, parents, tokens = _candidates(model, beams, forced)
        _finish(model, beams, finished, step, lenpen, cand_scores, parents, tokens)
        keep = _growing(tokens.eq(model.eos_id), k)
        scores = cand_scores.gather(1, keep)
        counts = [len(finished[i]) for i in beams.sentences.tolist()]
        full = torch.tensor(counts, device=forced.device).ge(k)
        done = forced | full | ~scores[:, 0].isfinite()
        going = (~done).nonzero().squeeze(1)
        if not len(going):
            break
        parent_rows = (going[:, None] * k + parents.gather(1, keep)[going]).reshape(-1)
        new_tokens = tokens.gather(1, keep)[going].reshape(-1)
        beams.select(going, parent_rows, new_tokens, scores[going])
    return [sorted(hypotheses, key=lambda h: -h.score) for hypotheses in finished]


def _candidates(model: Seq2Seq, beams: Beams, forced: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The ``C = 2K`` best extensions of each sentence's hypotheses: summed log-probabilities,
    the hypothesis each extends (``0..K-1``) and its new token, each ``(N, C)``, best first.
    The sentences ``forced (N,)`` at their length limit may only end (EOS)."""
    step_input = beams.tokens[:, -1:] if beams.cache is not None else beams.tokens
    logits = model.decode(step_input, beams.memory, beams.src_pad, beams.cache)[:, -1]
    log_probs = torch.log_softmax(logits, dim=-1)  # (N*K, V)
    log_probs[:, [model.pad_id, model.bos_id]] = -math.inf
    n, k = beams.scores.shape
    vocab = log_probs.shape[-1]
    only_eos = torch.full_like(log_probs, -math.inf)
    only_eos[:, model.eos_id] = log_probs[:, model.eos_id]
    log_probs = torch.where(forced.repeat_interleave(k)[:, None], only_eos, log_probs)
    total = (beams.scores[:, :, None] + log_probs.view(n, k, vocab)).view(n, k * vocab)
    cand_scores, flat = total.topk(min(2 * k, k * vocab), dim=1)
    return cand_scores, flat // vocab, flat % vocab


def _finish(
    model: Seq2Seq,
    beams: Beams,
    finished: list[list[Hypothesis]],
    step: int,
    lenpen: float,
    cand_scores: Tensor,
    parents: Tensor,
    tokens: Tensor,
) -> None:
    """Add to ``finished`` the candidates among each sentence's first ``K`` that end in EOS at
    ``step``, best first, until the sentence has ``K``; scores normalised by ``(step + 1) **
    lenpen``."""
    k = beams.scores.shape[1]
    ends = tokens[:, :k].eq(model.eos_id) & cand_scores[:, :k].isfinite()
    if not bool(ends.any()):
        return
    sentences = beams.sentences.tolist()
    for n, c in ends.nonzero().tolist():
        hypotheses = finished[sentences[n]]
        if len(hypotheses) < k:
            row = n * k + int(parents[n, c])
            log_prob = float(cand_scores[n, c])
            score = log_prob / (step + 1) ** lenpen
            hypotheses.append(Hypothesis(beams.tokens[row, 1:].tolist(), score, log_prob))


def _growing(ends: Tensor, k: int) -> Tensor:
    """``(N, K)`` positions of the ``K`` best candidates that do not end in EOS, given
    ``ends (N, C)`` (candidates best first; there are always ``K`` that do not end, since each
    hypothesis has one EOS extension and ``C = 2K``)."""
    count = ends.shape[1]
    order = torch.arange(count, device=ends.device) + count * ends.long()
    return order.topk(k, dim=1, largest=False).indices

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
:meth:`DecoderCache.reorder`, and the rows of finished sentences are dropped. The search asks
its model only for what :class:`Decodable` says (a :class:`~posenc.model.seq2seq.Seq2Seq`, or
an :class:`~posenc.model.ensemble.Ensemble` of them, each model with its own cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


class DecodeState(Protocol):
    """A batch of rows being decoded: what the encoder made of each row's source, and the
    decoder's key/value cache (or none, when the whole prefix is recomputed at every step).

    Attributes:
        src_pad: ``(B, Ls)`` each row's source padding mask.
        dtype: the dtype of the model's scores.
    """

    src_pad: Tensor

    @property
    def dtype(self) -> torch.dtype: ...

    def logits(self, tokens: Tensor) -> Tensor:
        """``(B, V)`` the next token's logits after ``tokens (B, t)`` (BOS first; with a cache,
        the rows as they were at the last call, each one token longer): scores whose softmax is
        the model's distribution."""
        ...

    def select(self, rows: Tensor) -> None:
        """Keep, in place, the rows ``rows (B',)`` (repeated, re-ordered or dropped)."""
        ...


class Decodable(Protocol):
    """What greedy decoding, sampling and beam search ask of a model: its special ids and
    :meth:`start`."""

    pad_id: int
    bos_id: int
    eos_id: int
    position_limit: int | None
    """the most target tokens it can place (its decoder's positions); None: any"""

    def start(self, src: Tensor, use_cache: bool) -> DecodeState:
        """Encode ``src (B, Ls)``: the state of its ``B`` rows before their first token."""
        ...


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
        state: the model's encoder output and decoder cache for each of the ``N*K`` rows.
    """

    tokens: Tensor
    scores: Tensor
    sentences: Tensor
    limits: Tensor
    state: DecodeState

    def select(self, sentences: Tensor, rows: Tensor, tokens: Tensor, scores: Tensor) -> None:
        """Go on with the sentences ``sentences (N',)`` (positions in this batch), whose new
        hypotheses extend rows ``rows (N'*K,)`` by ``tokens (N'*K,)`` with ``scores (N', K)``."""
        self.tokens = torch.cat([self.tokens[rows], tokens[:, None]], dim=1)
        self.scores = scores
        self.sentences = self.sentences[sentences]
        self.limits = self.limits[sentences]
        self.state.select(rows)


def max_lengths(
    src_pad: Tensor, max_len_a: float, max_len_b: int, cap: int | None = None
) -> Tensor:
    """``(B,)`` the most tokens (EOS included) each source of ``src_pad (B, Ls)`` may produce:
    ``max_len_a * source_length + max_len_b``, rounded down, and at most ``cap`` (a model's
    :attr:`Decodable.position_limit`: decoding never asks for a position it cannot embed)."""
    limits = ((~src_pad).sum(dim=1).float() * max_len_a + max_len_b).long()
    return limits if cap is None else limits.clamp(max=cap)


@torch.no_grad()
def beam_search(
    model: Decodable,
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
    state = model.start(src, use_cache)
    batch, k = src.shape[0], beam_size
    scores = torch.full((batch, k), -math.inf, dtype=state.dtype, device=src.device)
    scores[:, 0] = 0.0  # one hypothesis to start from, not K copies of it
    limits = max_lengths(state.src_pad, max_len_a, max_len_b, model.position_limit)
    state.select(torch.arange(batch, device=src.device).repeat_interleave(k))
    beams = Beams(
        tokens=torch.full((batch * k, 1), model.bos_id, dtype=torch.long, device=src.device),
        scores=scores,
        sentences=torch.arange(batch, device=src.device),
        limits=limits,
        state=state,
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


def _candidates(model: Decodable, beams: Beams, forced: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The ``C = 2K`` best extensions of each sentence's hypotheses: summed log-probabilities,
    the hypothesis each extends (``0..K-1``) and its new token, each ``(N, C)``, best first.
    The sentences ``forced (N,)`` at their length limit may only end (EOS)."""
    logits = beams.state.logits(beams.tokens)
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
    model: Decodable,
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

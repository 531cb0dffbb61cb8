"""Ensembles of models decoded as one, as fairseq decodes ``--path a.pt:b.pt``.

Every model keeps its own positional encoding, its own encoder output and its own decoder
key/value cache; at each step the ensemble's distribution is the arithmetic mean of the models'
probabilities, computed in the log domain as fairseq's ``EnsembleModel.forward_decoder`` does:
``logsumexp over models of log_softmax(logits) - log(number of models)`` (not the mean of the
log-probabilities, a geometric mean). An ensemble of one model passes that model's own logits
through, so it decodes token for token as the model does. Greedy decoding, sampling, beam search
and n-best lists are :class:`~posenc.model.seq2seq.Translator`'s, the code a single model
decodes with; beam search re-orders every model's cache. Sampling draws from the mean
distribution, its temperature applied to that mean (fairseq divides each model's logits by it
before averaging: the same at temperature 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from posenc.data.tokenizer import Tokenizer
from posenc.model.seq2seq import Decoding, Seq2Seq, Translator


def mean_log_probs(logits: Sequence[Tensor]) -> Tensor:
    """The log of the mean of the distributions ``softmax(logits[m])`` (each ``(..., V)``):
    ``logsumexp_m log_softmax(logits[m]) - log M``; with one model, its logits themselves (the
    same distribution, unnormalised)."""
    if len(logits) == 1:
        return logits[0]
    log_probs = torch.stack([row.log_softmax(dim=-1) for row in logits])
    return torch.logsumexp(log_probs, dim=0) - math.log(len(logits))


@dataclass
class EnsembleDecoding:
    """The ensemble's :class:`~posenc.model.search.DecodeState`: one
    :class:`~posenc.model.seq2seq.Decoding` per model (its memory and its cache), re-ordered
    together."""

    parts: list[Decoding]

    @property
    def src_pad(self) -> Tensor:
        return self.parts[0].src_pad

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype

    def logits(self, tokens: Tensor) -> Tensor:
        """``(B, V)`` :func:`mean_log_probs` of the models' next-token logits."""
        return mean_log_probs([part.logits(tokens) for part in self.parts])

    def select(self, rows: Tensor) -> None:
        """Keep the rows ``rows (B',)`` of every model's memory, mask and cache."""
        for part in self.parts:
            part.select(rows)


class Ensemble(Translator):
    """Models sharing one vocabulary and special ids, decoded as one (see the module's doc).

    Raises:
        ValueError: no model, or two models with different vocabulary sizes or special ids.
    """

    def __init__(self, models: Sequence[Seq2Seq]) -> None:
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        first = _vocabulary(models[0])
        for i, model in enumerate(models[1:], start=2):
            if _vocabulary(model) != first:
                raise ValueError(
                    f"model {i} does not share model 1's vocabulary ({_describe(model)} against "
                    f"{_describe(models[0])}): ensemble models trained with one tokenizer"
                )
        self.models = nn.ModuleList(models)
        self.pad_id, self.bos_id, self.eos_id = first[1:]

    @property
    def position_limit(self) -> int | None:
        """The smallest of the models' limits (None when none has one)."""
        limits = [m.position_limit for m in self.models if m.position_limit is not None]
        return min(limits) if limits else None

    def start(self, src: Tensor, use_cache: bool = True) -> EnsembleDecoding:
        """Every model's encoding of ``src (B, Ls)``, each with an empty cache when
        ``use_cache``."""
        return EnsembleDecoding([model.start(src, use_cache) for model in self.models])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced ``(B, Lt, V)`` :func:`mean_log_probs` of the models' logits (what the
        losses read as logits: their softmax is the ensemble's distribution)."""
        return mean_log_probs([model(src, tgt_in) for model in self.models])


def _vocabulary(model: Seq2Seq) -> tuple[int, int, int, int]:
    return model.tgt_embed.num_embeddings, model.pad_id, model.bos_id, model.eos_id


def _describe(model: Seq2Seq) -> str:
    size, pad, bos, eos = _vocabulary(model)
    return f"{size} tokens, pad/bos/eos {pad}/{bos}/{eos}"


def check_same_vocabulary(tokenizers: Sequence[Tokenizer], names: Sequence[str]) -> None:
    """ValueError (one line, naming the two runs and what differs) unless every tokenizer is the
    first one: the same kind, vocabulary size, special ids, ``tokenizer.json`` and kept types
    (the ensemble reads every source with the first, and averages over one vocabulary)."""
    first = tokenizers[0]
    for tokenizer, name in zip(tokenizers[1:], names[1:], strict=True):
        facts = [
            ("kind", first.kind, tokenizer.kind),
            ("vocabulary size", first.vocab_size, tokenizer.vocab_size),
            ("special ids (pad, bos, eos, unk)", _special_ids(first), _special_ids(tokenizer)),
            ("kept mBERT types", _kept(first), _kept(tokenizer)),
            ("tokenizer.json", first.backend.to_str(), tokenizer.backend.to_str()),
        ]
        for what, theirs, its in facts:
            if theirs != its:
                shown = (
                    ""
                    if what in ("tokenizer.json", "kept mBERT types")
                    else f" ({its} vs {theirs})"
                )
                raise ValueError(
                    f"{name} has another {what} than {names[0]}{shown}: an ensemble decodes "
                    "with one vocabulary; ensemble runs trained with the same tokenizer and data "
                    "settings"
                )


def _special_ids(tokenizer: Tokenizer) -> tuple[int, int, int, int]:
    return tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id


def _kept(tokenizer: Tokenizer) -> list[int] | None:
    return getattr(tokenizer, "kept_ids", None)

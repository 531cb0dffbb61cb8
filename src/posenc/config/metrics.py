"""The translation metrics, each declared once: what ``metrics.json`` holds of it, how the
report spells and scales it, and how it is computed. Evaluation, validation, the reader of
untrusted run files, TensorBoard's HParams and the report read this table; adding a metric that
sacreBLEU computes is one entry here, one computed by a model (BERTScore, COMET) its entry, its
scorer class and its ``eval`` settings group (docs/GUIDE.md, "Adding a metric")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Metric:
    """One metric of a split's scores.

    Attributes:
        name: its key in ``metrics.json`` (``splits.SPLIT.NAME``), in ``report.csv`` and in
            TensorBoard (``hparam/SPLIT_NAME``, ``valid/NAME``).
        label: how tables and axes spell it.
        low, high: the range of its values in ``metrics.json``.
        scale: the factor the report shows it with (BERTScore's 0-1 as 0-100, beside BLEU).
        sacrebleu: ``(class, keyword arguments)`` of the sacreBLEU metric that scores it on the
            detokenised corpus (its signature is kept as ``NAME_signature``); None for a metric
            computed otherwise.
        required: every ``metrics.json`` holds it (a metric added later is optional, so the
            runs scored before it still read).
        validation: also scored on ``trainer.valid_bleu``'s subset at every validation.
        judged: one of the metrics the decision rule judges together (a finding needs each of
            them, pointing the same way: BLEU and chrF).
        keys: what else ``metrics.json`` holds for it, key -> kind (``text``, ``count``,
            ``number``, ``score``: a value in its range), each nullable.
        scorer: ``module:Class`` of the scorer of a metric computed by a model, imported when
            an evaluation starts: ``Class.of(settings, device)`` builds it from the ``eval``
            group ``settings`` names (``eval.comet``), and ``scorer.score(sources, hypotheses,
            references)`` gives its keys of ``metrics.json``; None for a sacreBLEU metric.
        settings: the ``eval`` settings group its scorer reads.
    """

    name: str
    label: str
    low: float
    high: float
    scale: float = 1.0
    sacrebleu: tuple[str, dict[str, Any]] | None = None
    required: bool = False
    validation: bool = False
    judged: bool = False
    keys: dict[str, str] = field(default_factory=dict)
    scorer: str | None = None
    settings: str | None = None

    @property
    def shown_label(self) -> str:
        """The label as the report shows it (``BERTScore F1 ×100``)."""
        return self.label if self.scale == 1.0 else f"{self.label} ×{self.scale:g}"


#: every metric, in the order the report's tables show them
METRICS: tuple[Metric, ...] = (
    Metric(
        "bleu",
        "BLEU",
        0.0,
        100.0,
        sacrebleu=("BLEU", {}),
        required=True,
        validation=True,
        judged=True,
    ),
    Metric(
        "chrf",
        "chrF",
        0.0,
        100.0,
        sacrebleu=("CHRF", {}),
        required=True,
        validation=True,
        judged=True,
    ),
    Metric("chrf_pp", "chrF++", 0.0, 100.0, sacrebleu=("CHRF", {"word_order": 2})),
    Metric(
        "bertscore_f1",
        "BERTScore F1",
        -1.0,
        1.0,
        scale=100.0,
        keys={
            "bertscore_precision": "score",
            "bertscore_recall": "score",
            "bertscore_model": "text",
            "bertscore_layer": "count",
            "bertscore_hash": "text",
            "bertscore_reason": "text",
            "bertscore_empty_hypotheses": "count",
        },
        scorer="posenc.evaluation.metrics:BertScore",
        settings="bertscore",
    ),
    Metric(
        "comet",
        "COMET",
        -3.0,
        3.0,
        scale=100.0,
        keys={"comet_model": "text", "comet_reason": "text"},
        scorer="posenc.evaluation.comet:Comet",
        settings="comet",
    ),
)
#: the metrics sacreBLEU computes, by name
SACREBLEU_METRICS = {m.name: m for m in METRICS if m.sacrebleu is not None}
#: the names of the metrics the decision rule judges together, BLEU first (its sign names the
#: verdict)
JUDGED_METRICS = tuple(m.name for m in METRICS if m.judged)
#: the metrics a model computes, in the report's order
MODEL_METRICS = tuple(m for m in METRICS if m.scorer is not None)
#: the names of the metrics scored at every validation (sacreBLEU's only: the others are slow)
VALIDATION_METRICS = tuple(name for name, m in SACREBLEU_METRICS.items() if m.validation)


def metric(name: str) -> Metric:
    """The metric called ``name``.

    Raises:
        KeyError: no such metric (the message names those there are).
    """
    for found in METRICS:
        if found.name == name:
            return found
    raise KeyError(f"no metric {name!r}; there are {', '.join(m.name for m in METRICS)}")

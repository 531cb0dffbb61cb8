"""The translation metrics, each declared once: what ``metrics.json`` holds of it, how the
report spells and scales it, and how it is computed. Evaluation, validation, the reader of
untrusted run files, TensorBoard's HParams and the report read this table; adding a metric that
sacreBLEU computes is one entry here, one computed by a model (BERTScore, COMET) its entry, its
scorer class and its ``eval`` settings group with the class that types them (docs/GUIDE.md,
"Adding a metric")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from posenc.config import POSITIVE, ConfigGroup, setting


@dataclass(frozen=True, kw_only=True)
class BertScoreSettings(ConfigGroup):
    """``eval.bertscore``: the model (``minilm``, offline; any Hugging Face name; null: off),
    its layer (null: the model's default) and the sentences a batch holds."""

    GROUP: ClassVar[str] = "eval.bertscore"
    model: str | None = setting("str", optional=True, default=None)
    layer: int | None = setting("int", low=1, optional=True, default=None)
    batch_size: int = setting(**POSITIVE, default=64)


@dataclass(frozen=True, kw_only=True)
class CometSettings(ConfigGroup):
    """``eval.comet``: the model (a downloaded folder or checkpoint, a hub name; null: off) and
    the sentences a batch holds (null: COMET's default)."""

    GROUP: ClassVar[str] = "eval.comet"
    model: str | None = setting("str", optional=True, default=None)
    batch_size: int | None = setting("int", low=1, optional=True, default=None)


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
            an evaluation starts: ``Class.of(settings, device)`` builds it from its ``eval``
            settings group (typed by ``settings_class``), and ``scorer.score(sources,
            hypotheses, references)`` gives its keys of ``metrics.json``; None for a sacreBLEU
            metric.
        settings: the ``eval`` key of the settings group its scorer reads (``comet``).
        settings_class: the class those settings are read into (checked, defaults filled).
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
    settings_class: type[ConfigGroup] | None = None

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
        settings_class=BertScoreSettings,
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
        settings_class=CometSettings,
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

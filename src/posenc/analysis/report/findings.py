"""When a difference between two systems is a finding, for every table that compares systems.

The report, the contrasts and the decoding tables alike: the decision rule
of :mod:`posenc.analysis.decision` (its unit the training run, the test sentences a second
noise) on BLEU and on chrF; one family of comparisons corrected at once with Holm's method; a
quality floor per comparison (both systems above it, or nothing is tested); BLEU and chrF
agreeing. Each comparison also says how many seeds per system would find its difference."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from posenc.analysis.decision import (
    ALPHA,
    Comparison,
    compare_scores,
    contrast_deviation,
    equivalence,
    holm,
    loop_share,
    seeds_for_power,
    seeds_text,
    sentence_deviation,
    sentence_statistics,
)
from posenc.analysis.report.runs import Entry
from posenc.analysis.report.stats import read_lines
from posenc.config.metrics import JUDGED_METRICS

#: the metrics the rule judges together (the metric table's ``judged``)
METRICS = JUDGED_METRICS
#: a system whose mean BLEU on a split is below this is not compared there: a BLEU of about 1
#: is what a model that does not translate yet scores by chance n-gram matches
NOISE_FLOOR_BLEU = 2.0
#: ... nor one whose translations loop (:func:`posenc.analysis.decision.loops`) this often
LOOP_CEILING = 0.5

WORSE = "worse"  #: a finding: behind on BLEU and chrF after the family's correction
ONLY_BLEU = "only BLEU significant"
ONLY_CHRF = "only chrF significant"
OPPOSITE = "BLEU and chrF point opposite ways"  #: both significant, in opposite directions
ONE_SEED = "one seed only"  #: a side has one seed: its seed noise is unknown, nothing is tested
#: a side's seed scores spread :data:`MODES_RATIO` times wider than the family's others: its
#: seeds fall into separate modes, where no test at a few seeds is calibrated
SPLIT = "seeds split into modes: not tested"
#: how many times the median seed deviation of the family's other systems a system's deviation
#: must exceed to count as split. Measured on families of six systems (tests/test_modes.py): a
#: system three times noisier than the rest is taken for split in about 1.4% of families at
#: three seeds (under 0.1% at five); two modes 20 deviations apart, two seeds to one, are found
#: in about 88%, 10 apart in 15%: at three seeds closer modes cannot be told from noise
MODES_RATIO = 10.0
NOISE = "within noise"
#: with declared margins: no finding, and two one-sided tests on both metrics, corrected over the
#: family, put each difference inside its margin
EQUIVALENT = "equivalent within the margins"
#: with declared margins: neither a finding nor shown equivalent within them
NOT_RESOLVED = "not resolved"
UNINFORMATIVE = "below the quality floor"
VERDICTS = (
    WORSE,
    ONLY_BLEU,
    ONLY_CHRF,
    OPPOSITE,
    ONE_SEED,
    SPLIT,
    EQUIVALENT,
    NOT_RESOLVED,
    NOISE,
    UNINFORMATIVE,
)


class StatisticsCache:
    """What the comparisons read of each run's files, read once per report (a run takes part
    in many comparisons): its hypotheses and references, their sentence statistics per metric,
    its share of looping translations."""

    def __init__(self) -> None:
        self._texts: dict[tuple[Path, Path], tuple[list[str], list[str]] | None] = {}
        self._table: dict[tuple[Path, Path, str], np.ndarray] = {}
        self._loops: dict[Path, float] = {}

    def texts(self, entry: Entry) -> tuple[list[str], list[str]] | None:
        """``(hypotheses, references)`` of the entry, None without both or when their lengths
        differ."""
        key = (entry.hypotheses, entry.references)
        if key not in self._texts:
            hyps, refs = read_lines(entry.hypotheses), read_lines(entry.references)
            self._texts[key] = (hyps, refs) if hyps and refs and len(hyps) == len(refs) else None
        return self._texts[key]

    def of(self, entry: Entry, metric: str) -> np.ndarray | None:
        """``(N, k)`` statistics of the entry's hypotheses, None without both files."""
        key = (entry.hypotheses, entry.references, metric)
        if key not in self._table:
            texts = self.texts(entry)
            if texts is None:
                return None
            self._table[key] = sentence_statistics(metric, *texts)
        return self._table[key]

    def loops(self, entry: Entry) -> float:
        """The share of the entry's hypotheses that loop (0 without them)."""
        if entry.hypotheses not in self._loops:
            texts = self.texts(entry)
            self._loops[entry.hypotheses] = loop_share(texts[0]) if texts else 0.0
        return self._loops[entry.hypotheses]


@dataclass
class Judgement:
    """``first`` against ``second`` on one split: per metric the decision rule's
    :class:`~posenc.analysis.decision.Comparison` of ``first - second``; whether a side is below
    the quality floor, each side's mean share of looping translations; after
    :func:`judge_family`, whether a side's seeds split into modes (:func:`mark_splits`, which
    reads each side's ``seed_scores`` per metric), the Holm-adjusted p-values, with declared
    margins those of the
    equivalence tests, the seeds that would find each tested difference (None: not within
    :data:`~posenc.analysis.decision.MAX_SEEDS`; no entry for a metric that was not tested) and
    the verdict."""

    comparisons: dict[str, Comparison]
    floor: bool
    loops: tuple[float, float]
    p_holm: dict[str, float | None] = field(default_factory=dict)
    p_equivalence: dict[str, float | None] = field(default_factory=dict)
    seed_scores: dict[str, tuple[dict[int, float], dict[int, float]]] = field(default_factory=dict)
    split: bool = False
    seeds_needed: dict[str, int | None] = field(default_factory=dict)
    verdict: str = ""

    @property
    def first_leads(self) -> bool:
        """Whether ``first`` is ahead on mean BLEU (ties count for it)."""
        return self.comparisons["bleu"].difference >= 0


def by_seed(entries: Sequence[Entry]) -> dict[int, Entry]:
    """The first entry of each training seed."""
    found: dict[int, Entry] = {}
    for entry in entries:
        found.setdefault(entry.run.seed, entry)
    return found


def judge_pair(
    first: Sequence[Entry],
    second: Sequence[Entry],
    samples: int,
    cache: StatisticsCache,
) -> Judgement | None:
    """The unadjusted :class:`Judgement` of two systems' entries on one split, with
    ``samples`` resampled test sets for the sentence noise; None when a run lacks its
    hypotheses or scores, or the two were scored against different references."""
    sides = (by_seed(first), by_seed(second))
    texts = [cache.texts(e) for side in sides for e in side.values()]
    if any(t is None or t[1] != texts[0][1] for t in texts):  # type: ignore[index]
        return None
    comparisons, seed_scores = {}, {}
    for metric in METRICS:
        scores = [{s: e.scores.get(metric) for s, e in side.items()} for side in sides]
        tables = [[cache.of(e, metric) for e in side.values()] for side in sides]
        if any(v is None for side in scores for v in side.values()):
            return None
        noise = sentence_deviation(metric, *tables, samples=samples)
        comparisons[metric] = compare_scores(*scores, sentence_se=noise)
        seed_scores[metric] = tuple(scores)
    loops = tuple(statistics.fmean(cache.loops(e) for e in side.values()) for side in sides)
    bleu = [statistics.fmean(e.scores["bleu"] for e in side.values()) for side in sides]
    floor = min(bleu) < NOISE_FLOOR_BLEU or max(loops) >= LOOP_CEILING
    return Judgement(comparisons, floor, loops, seed_scores=seed_scores)  # type: ignore[arg-type]


def power_cells(judgement: Judgement) -> str:
    """``BLEU, chrF`` seeds for power as a table cell: ``-`` for a metric not tested."""
    return ", ".join(
        seeds_text(judgement.seeds_needed[m]) if m in judgement.seeds_needed else "-"
        for m in METRICS
    )


def tested_p(judgements: Sequence[Judgement]) -> dict[tuple[int, str], float]:
    """The family's tests: ``{(index, metric): p}`` for both metrics of every comparison above
    the floor that has a p-value (two seeds a side at least)."""
    return {
        (i, metric): c.p
        for i, j in enumerate(judgements)
        if not j.floor and not j.split
        for metric, c in j.comparisons.items()
        if c.p is not None
    }


def split_sides(spreads: Sequence[float | None]) -> list[bool]:
    """For the seed standard deviations of a family's systems on one metric (None: under two
    seeds), whether each exceeds :data:`MODES_RATIO` times the median of the others (never where
    that median is 0 or there are no others)."""
    known = [(i, s) for i, s in enumerate(spreads) if s is not None]
    flags = [False] * len(spreads)
    for i, spread in known:
        others = [s for j, s in known if j != i]
        if others:
            reference = statistics.median(others)
            flags[i] = reference > 0 and spread > MODES_RATIO * reference
    return flags


def mark_splits(judgements: Sequence[Judgement]) -> None:
    """Set :attr:`Judgement.split` where, on either metric, one of its sides' seeds spread
    beyond the family's others (:func:`split_sides`); a side that takes part in several
    comparisons (the baseline) counts once, known by its seed scores."""
    for metric in METRICS:
        sides: dict[tuple[tuple[int, float], ...], float | None] = {}
        for judgement in judgements:
            for side in judgement.seed_scores.get(metric, ()):
                key = tuple(sorted(side.items()))
                sides[key] = statistics.stdev(side.values()) if len(side) > 1 else None
        flagged = {k for k, f in zip(sides, split_sides(list(sides.values())), strict=True) if f}
        for judgement in judgements:
            found = judgement.seed_scores.get(metric, ())
            if any(tuple(sorted(side.items())) in flagged for side in found):
                judgement.split = True


def judge_family(
    judgements: Sequence[Judgement], margins: Mapping[str, float] | None = None
) -> None:
    """Correct every p-value of ``judgements`` (:func:`tested_p`) at once with Holm's method,
    then set each one's seeds for power (at the family's Bonferroni level) and verdict; a
    comparison whose side's seeds split into modes (:func:`mark_splits`) is left out. With
    ``margins`` for every metric (a plan's, :mod:`posenc.analysis.plan`), the tested
    differences are also tested for equivalence within them (two one-sided tests, corrected
    over the family with Holm's method), which decides :data:`EQUIVALENT` or
    :data:`NOT_RESOLVED` where no finding is made."""
    mark_splits(judgements)
    tested = tested_p(judgements)
    adjusted = holm(tested)
    use_margins = margins is not None and all(m in margins for m in METRICS)
    adjusted_equivalence: dict[tuple[int, str], float] = {}
    if use_margins:
        equivalence_p = {
            key: equivalence(judgements[key[0]].comparisons[key[1]], margins[key[1]])
            for key in tested
        }
        adjusted_equivalence = holm({k: p for k, p in equivalence_p.items() if p is not None})
    for i, judgement in enumerate(judgements):
        judgement.p_holm = {m: adjusted.get((i, m)) for m in judgement.comparisons}
        if use_margins:
            judgement.p_equivalence = {
                m: adjusted_equivalence.get((i, m)) for m in judgement.comparisons
            }
        judgement.seeds_needed = {
            m: seeds_for_power(c, len(tested))
            for m, c in judgement.comparisons.items()
            if (i, m) in tested
        }
        judgement.verdict = verdict(judgement)


def named_verdict(judgement: Judgement | None, leads: str, trails: str) -> str:
    """``leads`` or ``trails`` for a finding (by who leads on BLEU), else the judgement's own
    verdict (``-`` without one)."""
    if judgement is None:
        return "-"
    if judgement.verdict != WORSE:
        return judgement.verdict
    return leads if judgement.first_leads else trails


class SingleScore(Protocol):
    """A comparison on one score (a validation loss): what :func:`judge_single_scores` reads
    and sets; ``sentences``: whether resampled sentences are part of its noise (else the
    seeds alone are)."""

    comparison: Comparison | None
    sentences: bool
    p_holm: float | None
    p_equivalence: float | None
    margin: float | None


def judge_single_scores(cells: Sequence[SingleScore], margin: float | None = None) -> None:
    """Correct the p-values of ``cells`` (those with a test) as one family with Holm's method;
    with a ``margin``, also test each for equivalence within it (two one-sided tests, Holm over
    the family)."""
    tested = {
        i: c.comparison.p
        for i, c in enumerate(cells)
        if c.comparison is not None and c.comparison.p is not None
    }
    for i, p in holm(tested).items():
        cells[i].p_holm = p
    for cell in cells:
        cell.margin = margin
    if margin is not None:
        shown = {i: equivalence(cells[i].comparison, margin) for i in tested}  # type: ignore[arg-type]
        for i, p in holm({i: p for i, p in shown.items() if p is not None}).items():
            cells[i].p_equivalence = p


def judge_together(
    judgements: Sequence[Judgement],
    singles: Sequence[SingleScore],
    margins: Mapping[str, float] | None = None,
) -> None:
    """Judge BLEU-and-chrF ``judgements`` and one-score ``singles`` (validation losses) as one
    family, as a plan that declares them together asks: each kind judged as
    :func:`judge_family` and :func:`judge_single_scores` judge it alone, then every p-value of
    both corrected at once with Holm's method (with ``margins``, the equivalence tests
    likewise; ``valid_loss`` is the singles' margin), the seeds for power counted over the whole
    family, and each verdict set again."""
    margin = (margins or {}).get("valid_loss")
    judge_family(judgements, margins)
    judge_single_scores(singles, margin)
    pairs = tested_p(judgements)
    ones = {
        i: c.comparison.p
        for i, c in enumerate(singles)
        if c.comparison is not None and c.comparison.p is not None
    }
    adjusted = holm(
        {("pair", *k): p for k, p in pairs.items()} | {("one", i): p for i, p in ones.items()}
    )
    shown: dict[tuple, float] = {}
    if margins is not None and all(m in margins for m in METRICS):
        shown |= {
            ("pair", i, m): equivalence(judgements[i].comparisons[m], margins[m]) for i, m in pairs
        }
    if margin is not None:
        shown |= {("one", i): equivalence(singles[i].comparison, margin) for i in ones}  # type: ignore[arg-type]
    equivalent = holm({k: p for k, p in shown.items() if p is not None})
    for i, judgement in enumerate(judgements):
        for m in judgement.comparisons:
            if (i, m) in pairs:
                judgement.p_holm[m] = adjusted[("pair", i, m)]
                judgement.seeds_needed[m] = seeds_for_power(judgement.comparisons[m], len(adjusted))
                if judgement.p_equivalence:
                    judgement.p_equivalence[m] = equivalent.get(("pair", i, m))
        judgement.verdict = verdict(judgement)
    for i in ones:
        singles[i].p_holm = adjusted[("one", i)]
        if margin is not None:
            singles[i].p_equivalence = equivalent.get(("one", i))


Sentences = Mapping[int, np.ndarray]
"""A system's validation sentences: training seed -> the run's
:func:`~posenc.analysis.decision.loss_statistics` at its best validation loss."""


def loss_noise(
    terms: Sequence[tuple[float, Sequence[int], Sentences | None]], samples: int = 1000
) -> float | None:
    """The deviation, over resampled validation sets, of a signed sum of systems' seed-averaged
    validation losses: ``terms`` are ``(sign, seeds, sentences)``, one a system. None when a
    seed's run did not keep its sentence losses or the runs did not score the same sentences
    (their target token counts differ)."""
    tables = []
    for sign, seeds, sentences in terms:
        if not seeds or sentences is None or any(s not in sentences for s in seeds):
            return None
        tables.append((sign, [sentences[s] for s in seeds]))
    first = tables[0][1][0]
    same = all(
        t.shape == first.shape and np.array_equal(t[:, 1], first[:, 1])
        for _, runs in tables
        for t in runs
    )
    return contrast_deviation("loss", tables, samples) if same else None


def sentence_noise(cells: Sequence[SingleScore]) -> str:
    """How the noise of validation-loss cells is made up: seeds and resampled validation
    sentences where every run kept its sentence losses, else the seeds alone."""
    tested = [c for c in cells if c.comparison is not None]
    kept = sum(c.sentences for c in tested)
    if tested and kept == len(tested):
        return "seeds and resampled validation sentences as noise"
    if not kept:
        return "the seeds as noise: these runs did not keep their validation sentences"
    return (
        f"seeds and resampled validation sentences as noise in {kept} of {len(tested)} cells, "
        "the seeds alone where a run did not keep its validation sentences"
    )


def single_score_verdict(cell: SingleScore, lower: str, higher: str) -> str:
    """``lower`` or ``higher`` (the sign of the difference) for a finding, else why not: ``-``
    without a comparison, one seed only, within noise, or with a margin equivalent within it
    or not resolved."""
    comparison = cell.comparison
    if comparison is None:
        return "-"
    if comparison.p is None:
        return ONE_SEED
    if cell.p_holm is None or cell.p_holm >= ALPHA:
        if cell.margin is None:
            return NOISE
        shown = cell.p_equivalence is not None and cell.p_equivalence < ALPHA
        return EQUIVALENT if shown else NOT_RESOLVED
    return lower if comparison.difference < 0 else higher


def verdict(judgement: Judgement) -> str:
    """:data:`WORSE` when both metrics are significant after the correction and agree (the
    caller names who leads), else the rule it failed (:data:`VERDICTS`); without a finding,
    with equivalence tests, :data:`EQUIVALENT` when both metrics pass them."""
    if judgement.floor:
        return UNINFORMATIVE
    if any(p is None for p in (c.p for c in judgement.comparisons.values())):
        return ONE_SEED
    if judgement.split:
        return SPLIT
    significant = {m: p is not None and p < ALPHA for m, p in judgement.p_holm.items()}
    if not any(significant.values()):
        if not judgement.p_equivalence:
            return NOISE
        shown = all(p is not None and p < ALPHA for p in judgement.p_equivalence.values())
        return EQUIVALENT if shown else NOT_RESOLVED
    if not significant["bleu"]:
        return ONLY_CHRF
    if not significant["chrf"]:
        return ONLY_BLEU
    signs = {c.difference > 0 for c in judgement.comparisons.values()}
    return WORSE if len(signs) == 1 else OPPOSITE

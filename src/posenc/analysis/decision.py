"""The decision rule: when a difference between two systems is a finding. Its unit is the
training run, and the test sentences are a second source of noise.

A system is a set of runs that differ only in their training seed; each run has a corpus score
on a split (BLEU, chrF, a loss). Two systems ``a`` and ``b`` are compared by a t-test with two
variance components (a method-of-moments mixed model with seed and sentence effects):

* **seeds**: with the same seeds on both sides (at least two), the per-seed differences
  ``a_s - b_s`` (paired: a seed fixes the data order, which both runs share); otherwise each
  system's own seeds (Welch), so systems with disjoint or more seeds compare too. Its variance
  is that of the mean difference, ``var(d) / n`` or ``var(a) / n_a + var(b) / n_b``;
* **sentences**: the deviation of the seed-averaged difference over test sets resampled from
  this one (sentences drawn with replacement, the same draw for every run of both systems:
  :func:`sentence_deviation`), which says how much another test set of the same size would move
  it.

The difference's standard error adds both; its degrees of freedom are those of the seed
component alone (``n - 1`` paired, Welch-Satterthwaite's otherwise): the statistic's tails are
heaviest when the seeds' noise dominates, so this is the small-sample correction that holds
whatever the mix. Counting the sentence component in (Satterthwaite over both) was measured too
bold (7.5% false findings at three paired seeds: it raises the degrees of freedom most when the
seed variance happens to be underestimated); the price of the choice is caution where the
sentences' noise dominates (a small test set: about 1% false findings instead of 5%). The
p-value and the 95% interval come from Student's t. A report or a
contrasts table declares one family of comparisons and corrects it at once (:func:`holm`).

Calibration (``tests/test_decision.py`` simulates systems with seed and sentence noise): with
no true difference, p < 0.05 at most 5% of the time (within simulation error) at 3 and 5 seeds;
a true difference of three seed deviations is found at 5 seeds at least 80% of the time.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from posenc.evaluation.metrics import sacrebleu_scorer

#: the significance level, after the family's correction
ALPHA = 0.05
#: the power :func:`seeds_for_power` asks of each system's seed count
POWER = 0.8
#: seed counts :func:`seeds_for_power` looks through; more is reported as "more than this"
MAX_SEEDS = 50
#: resampled test sets :func:`sentence_deviation` holds at once
CHUNK = 500


@dataclass(frozen=True)
class Comparison:
    """``a`` minus ``b``: the difference of their seed means in the metric's own units, its 95%
    interval, the two-sided p-value (None with fewer than two seeds a side: no test), the
    standard error's two components and the degrees of freedom."""

    difference: float
    low: float | None
    high: float | None
    p: float | None
    seed_se: float | None
    sentence_se: float
    df: float | None
    seeds: tuple[int, int]
    paired: bool

    def text(self, digits: int = 2) -> str:
        """``+1.23 [+0.40, +2.06]``: the difference and its 95% interval (the difference alone
        where there is none)."""
        if self.low is None or self.high is None:
            return f"{self.difference:+.{digits}f}"
        return f"{self.difference:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"

    @property
    def se(self) -> float | None:
        """The standard error of :attr:`difference` (both components)."""
        if self.seed_se is None:
            return None
        return math.hypot(self.seed_se, self.sentence_se)


def compare_scores(
    a: Mapping[int, float], b: Mapping[int, float], sentence_se: float = 0.0
) -> Comparison:
    """The rule on ``{seed: corpus score}`` of two systems and the sentence component of the
    standard error (:func:`sentence_deviation`; 0 where it is not known)."""
    if not a or not b:
        raise ValueError("compare_scores needs at least one seed of each system")
    paired = set(a) == set(b) and len(a) >= 2
    if paired:
        per_seed = [a[s] - b[s] for s in sorted(a)]
        difference = statistics.fmean(per_seed)
        parts = [(statistics.variance(per_seed) / len(per_seed), len(per_seed) - 1)]
    else:
        difference = statistics.fmean(a.values()) - statistics.fmean(b.values())
        if min(len(a), len(b)) < 2:
            return Comparison(
                difference, None, None, None, None, sentence_se, None, (len(a), len(b)), False
            )
        parts = [(statistics.variance(side.values()) / len(side), len(side) - 1) for side in (a, b)]
    seed_var = sum(var for var, _ in parts)
    total = seed_var + sentence_se**2
    seed_se = math.sqrt(seed_var)
    if total == 0.0:  # every run of both systems scored the same: no evidence of a difference
        p = 1.0 if difference == 0.0 else 0.0
        return Comparison(
            difference, difference, difference, p, 0.0, 0.0, math.inf, (len(a), len(b)), paired
        )
    # the seed components' degrees of freedom (Welch-Satterthwaite over them alone): counting
    # the known sentence component in would raise them most when the seed variance is
    # underestimated, which is when the test is already too bold
    spread = sum(var**2 / dof for var, dof in parts if var > 0)
    df = seed_var**2 / spread if spread > 0 else math.inf
    se = math.sqrt(total)
    p = float(2 * stats.t.sf(abs(difference) / se, df))
    half = float(stats.t.ppf(1 - ALPHA / 2, df)) * se
    return Comparison(
        difference,
        difference - half,
        difference + half,
        p,
        seed_se,
        sentence_se,
        df,
        (len(a), len(b)),
        paired,
    )


def holm(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of ``{name: p}`` (family-wise error over them all)."""
    order = sorted(p_values, key=lambda name: p_values[name])
    adjusted, running = {}, 0.0
    for rank, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p_values[name]))
        adjusted[name] = running
    return adjusted


def seeds_for_power(comparison: Comparison, family: int = 1) -> int | None:
    """The seeds per system that would find ``comparison``'s observed difference with
    :data:`POWER`, at the Bonferroni level ``ALPHA / family`` (what the last of a Holm family
    needs), given its observed seed spread and sentence noise; None when no seed count up to
    :data:`MAX_SEEDS` would (its difference is within the test sentences' noise, or too small)
    or when it has no seed spread to go by."""
    if comparison.seed_se is None or comparison.difference == 0.0:
        return None
    n_a, n_b = comparison.seeds
    # the seed variance of one seed per side, read back from the observed standard error
    per_seed = comparison.seed_se**2 * (
        min(n_a, n_b) if comparison.paired else 2 * n_a * n_b / (n_a + n_b)
    )
    level = ALPHA / max(1, family)
    for n in range(2, MAX_SEEDS + 1):
        se = math.sqrt(per_seed / n + comparison.sentence_se**2)
        if se == 0.0:
            return n
        df = n - 1 if comparison.paired else 2 * (n - 1)
        shift = abs(comparison.difference) / se
        critical = stats.t.ppf(1 - level / 2, df)
        if stats.nct.sf(critical, df, shift) >= POWER:
            return n
    return None


def seeds_text(needed: int | None) -> str:
    """:func:`seeds_for_power`'s answer as tables show it: ``>50`` past :data:`MAX_SEEDS`."""
    return f">{MAX_SEEDS}" if needed is None else str(needed)


def sentence_statistics(
    metric: str, hypotheses: Sequence[str], references: Sequence[str]
) -> np.ndarray:
    """sacreBLEU's sufficient statistics of ``metric`` (``bleu`` or ``chrf``) per sentence,
    ``(N, k)``: summed over any sample of sentences they give that sample's corpus score."""
    return np.asarray(
        sacrebleu_scorer(metric)._extract_corpus_statistics(list(hypotheses), [list(references)]),
        dtype=np.int64,
    )


def sentence_deviation(
    metric: str,
    a: Sequence[np.ndarray],
    b: Sequence[np.ndarray],
    samples: int = 1000,
    seed: int = 12345,
) -> float:
    """The standard deviation, over ``samples`` test sets drawn with replacement from the
    sentences, of the seed-averaged corpus ``metric`` of the runs ``a`` minus the runs ``b``
    (each run's :func:`sentence_statistics` on the same references). One draw of sentences
    serves every run of a sample, so the paired structure of the test set is kept."""
    scorer = sacrebleu_scorer(metric)
    size = a[0].shape[0]
    rng = np.random.default_rng(seed)
    differences: list[float] = []
    for start in range(0, samples, CHUNK):  # bounded memory: CHUNK draws of N counts at a time
        # how often each sentence is drawn, one row per resampled test set: (chunk, N)
        draws = np.stack(
            [
                np.bincount(rng.integers(0, size, size), minlength=size)
                for _ in range(min(CHUNK, samples - start))
            ]
        )
        means = []
        for runs in (a, b):
            totals = [draws @ run for run in runs]  # (chunk, k) statistics per resampled set
            means.append(
                [
                    statistics.fmean(
                        scorer._compute_score_from_stats(list(t[i])).score for t in totals
                    )
                    for i in range(len(draws))
                ]
            )
        differences += [x - y for x, y in zip(*means, strict=True)]
    return float(np.std(differences, ddof=1))


#: a unit of 2 to 30 characters repeated at least four times in a row (spaces and punctuation
#: between allowed)
LOOP = re.compile(r"(\S.{1,29}?)(?:[\s,;:.!?-]*\1){3,}")


def loops(hypothesis: str) -> bool:
    """Whether a translation is caught in a repetition loop: some stretch of 2-30 characters
    occurs at least four times in a row (``Spepepepe``, ``the house, the house, the house, the
    house``), which sentences of the test sets do not do."""
    return LOOP.search(hypothesis) is not None


def loop_share(hypotheses: Sequence[str]) -> float:
    """The share of ``hypotheses`` that :func:`loops` (0 for none)."""
    return sum(map(loops, hypotheses)) / len(hypotheses) if hypotheses else 0.0

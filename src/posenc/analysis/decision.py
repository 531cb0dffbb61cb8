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
component alone (``n - 1`` paired; otherwise Welch-Satterthwaite's, at most the smaller side's
seeds less one half, :data:`WELCH_CAP`): the statistic's tails are heaviest when the seeds'
noise dominates, so this is the small-sample correction that holds whatever the mix. Welch's
degrees of freedom alone were measured too bold where the side with fewer seeds is the noisier
(6-8% false findings at three seeds against five, its deviation two to three times the
other's); counting the sentence component in (Satterthwaite over both) too (7.5% at three
paired seeds). The price is caution where the sentences' noise dominates (a small test set:
about 1% false findings instead of 5%) and power at unequal seed counts (docs/METHODS.md,
§10). The p-value and the 95% interval come from Student's t. A report or a
contrasts table declares one family of comparisons and corrects it at once (:func:`holm`).

Calibration (``tests/test_decision.py`` simulates systems with seed and sentence noise, the
sentence component estimated from the simulated sentences as the bootstrap estimates it): with
no true difference, p < 0.05 at most 5% of the time (within simulation error) at 3 against 3,
3 against 5 and 5 against 5 seeds, paired or not, seed deviations equal or up to three times
apart, normal or mildly skewed; a true difference of three seed deviations is found at 5 seeds
at least 80% of the time.

Equivalence (:func:`equivalence`): two one-sided tests on the same standard error and degrees
of freedom; a difference is *equivalent within a margin m* only when both ``difference <= -m``
and ``difference >= m`` are rejected, which is the 90% interval lying inside ``(-m, m)``.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from posenc.evaluation.metrics import sacrebleu_scorer
from posenc.runtime.sentence_losses import SentenceLosses

#: the significance level, after the family's correction
ALPHA = 0.05
#: the power :func:`seeds_for_power` asks of each system's seed count
POWER = 0.8
#: seed counts :func:`seeds_for_power` looks through; more is reported as "more than this"
MAX_SEEDS = 50
#: resampled test sets :func:`sentence_deviation` holds at once
CHUNK = 500
#: unpaired comparisons: the degrees of freedom are at most the smaller side's seeds less this
WELCH_CAP = 0.5


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


def seed_components(
    a: np.ndarray, b: np.ndarray, paired: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rule's seed part for ``R`` comparisons at once: ``a (R, n_a)`` and ``b (R, n_b)`` are
    the two systems' seed scores (column ``s`` of both the same seed when ``paired``). Returns
    the mean differences ``(R,)``, the seed variance of each ``(R,)`` and its degrees of freedom
    ``(R,)``: ``n - 1`` paired, Welch-Satterthwaite's capped at ``min(n_a, n_b) - WELCH_CAP``
    otherwise."""
    n_a, n_b = a.shape[1], b.shape[1]
    if paired:
        per_seed = a - b
        n = per_seed.shape[1]
        variance = per_seed.var(axis=1, ddof=1) / n
        return per_seed.mean(axis=1), variance, np.full(len(per_seed), n - 1.0)
    var_a = a.var(axis=1, ddof=1) / n_a
    var_b = b.var(axis=1, ddof=1) / n_b
    seed_var = var_a + var_b
    spread = var_a**2 / (n_a - 1) + var_b**2 / (n_b - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        welch = np.where(spread > 0, seed_var**2 / np.where(spread > 0, spread, 1.0), np.inf)
    return a.mean(axis=1) - b.mean(axis=1), seed_var, np.minimum(welch, min(n_a, n_b) - WELCH_CAP)


def t_test(
    difference: np.ndarray, seed_var: np.ndarray, sentence_se: np.ndarray, df: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Student's t for ``R`` comparisons ``(R,)`` each (:func:`seed_components`' parts and the
    sentence component): the two-sided p-values and the 95% intervals' half-widths."""
    se = np.sqrt(seed_var + sentence_se**2)
    p = 2 * stats.t.sf(np.abs(difference) / se, df)
    return p, stats.t.ppf(1 - ALPHA / 2, df) * se


def compare_scores(
    a: Mapping[int, float], b: Mapping[int, float], sentence_se: float = 0.0
) -> Comparison:
    """The rule on ``{seed: corpus score}`` of two systems and the sentence component of the
    standard error (:func:`sentence_deviation`; 0 where it is not known)."""
    if not a or not b:
        raise ValueError("compare_scores needs at least one seed of each system")
    paired = set(a) == set(b) and len(a) >= 2
    seeds = (len(a), len(b))
    if not paired and min(seeds) < 2:
        difference = statistics.fmean(a.values()) - statistics.fmean(b.values())
        return Comparison(difference, None, None, None, None, sentence_se, None, seeds, False)
    order_a = sorted(a) if paired else list(a)
    order_b = sorted(b) if paired else list(b)
    means, seed_vars, dfs = seed_components(
        np.array([[a[s] for s in order_a]], dtype=float),
        np.array([[b[s] for s in order_b]], dtype=float),
        paired,
    )
    difference, seed_var, df = float(means[0]), float(seed_vars[0]), float(dfs[0])
    if seed_var + sentence_se**2 == 0.0:  # every run of both sides scored the same: no evidence
        p = 1.0 if difference == 0.0 else 0.0
        return Comparison(difference, difference, difference, p, 0.0, 0.0, math.inf, seeds, paired)
    p, half = (float(x[0]) for x in t_test(means, seed_vars, np.array([sentence_se]), dfs))
    return Comparison(
        difference,
        difference - half,
        difference + half,
        p,
        math.sqrt(seed_var),
        sentence_se,
        df,
        seeds,
        paired,
    )


def equivalence(comparison: Comparison, margin: float) -> float | None:
    """The p-value of two one-sided tests that ``comparison``'s true difference lies inside
    ``(-margin, margin)`` (the larger of the two one-sided p-values, on the rule's standard
    error and degrees of freedom); None without a test (fewer than two seeds a side)."""
    if margin <= 0:
        raise ValueError(f"an equivalence margin must be positive, got {margin}")
    se = comparison.se
    if se is None or comparison.df is None:
        return None
    if se == 0.0:
        return 0.0 if abs(comparison.difference) < margin else 1.0
    below = stats.t.sf((comparison.difference + margin) / se, comparison.df)
    above = stats.t.cdf((comparison.difference - margin) / se, comparison.df)
    return float(max(below, above))


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
        df = n - 1 if comparison.paired else n - WELCH_CAP
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


def loss_statistics(losses: SentenceLosses) -> np.ndarray:
    """A loss's per-sentence statistics, ``(N, 2)``: summed NLL and target tokens; summed over
    any sample of sentences they give its loss per token (:func:`corpus_score`)."""
    return np.column_stack([losses.nll, losses.target_tokens]).astype(np.float64)


def corpus_score(metric: str) -> Callable[[np.ndarray], float]:
    """The corpus score of summed per-sentence statistics ``(k,)``: sacreBLEU's ``bleu`` or
    ``chrf`` (:func:`sentence_statistics`), or ``loss``, nats per target token
    (:func:`loss_statistics`)."""
    if metric == "loss":
        return lambda summed: float(summed[0] / max(summed[1], 1.0))
    scorer = sacrebleu_scorer(metric)
    return lambda summed: scorer._compute_score_from_stats(list(summed)).score


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
    return contrast_deviation(metric, [(1.0, a), (-1.0, b)], samples, seed)


def contrast_deviation(
    metric: str,
    terms: Sequence[tuple[float, Sequence[np.ndarray]]],
    samples: int = 1000,
    seed: int = 12345,
) -> float:
    """:func:`sentence_deviation` of any signed sum of seed-averaged corpus scores: ``terms``
    are ``(sign, runs)``, each run's :func:`sentence_statistics` on the same references (or
    :func:`loss_statistics` on the same sentences, ``metric`` ``loss``), e.g.
    ``[(1, a_deep), (-1, b_deep), (-1, a_shallow), (1, b_shallow)]`` for a difference of
    differences."""
    score = corpus_score(metric)
    size = terms[0][1][0].shape[0]
    rng = np.random.default_rng(seed)
    values: list[float] = []
    for start in range(0, samples, CHUNK):  # bounded memory: CHUNK draws of N counts at a time
        # how often each sentence is drawn, one row per resampled test set: (chunk, N)
        draws = np.stack(
            [
                np.bincount(rng.integers(0, size, size), minlength=size)
                for _ in range(min(CHUNK, samples - start))
            ]
        )
        total = np.zeros(len(draws))
        for sign, runs in terms:
            sums = [draws @ run for run in runs]  # (chunk, k) statistics per resampled set
            total += sign * np.array(
                [statistics.fmean(score(t[i]) for t in sums) for i in range(len(draws))]
            )
        values += total.tolist()
    return float(np.std(values, ddof=1))


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

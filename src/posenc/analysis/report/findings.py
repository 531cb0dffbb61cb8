"""When a difference between two encodings is a finding (DESIGN.md's rules): it survives the test
sentences (sacreBLEU's paired bootstrap) after Holm's correction for the number of encodings
compared, it survives the training seeds (the better one is better on every paired seed), BLEU
and chrF agree, and its size is stated against the seed noise. A split whose best BLEU is at the
noise floor ranks nothing."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from posenc.analysis.report.runs import Entry

#: the significance level, after the correction
ALPHA = 0.05
#: below this mean BLEU of the best system a split ranks nothing: a BLEU of about 1 is what
#: a model that does not translate yet scores by chance n-gram matches
NOISE_FLOOR_BLEU = 2.0

WORSE = "worse"  #: a finding: worse than the baseline on both metrics, every seed, corrected
DISAGREE = "BLEU and chrF disagree"
NOT_EVERY_SEED = "not on every seed"
ONE_SEED = "one seed only"  #: significant, but a finding needs two training seeds at least
NOISE = "within noise"
UNINFORMATIVE = "uninformative (noise floor)"
VERDICTS = (WORSE, DISAGREE, NOT_EVERY_SEED, ONE_SEED, NOISE, UNINFORMATIVE)


def holm(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment of ``{name: p}`` (family-wise error over them all)."""
    order = sorted(p_values, key=lambda name: p_values[name])
    adjusted, running = {}, 0.0
    for rank, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p_values[name]))
        adjusted[name] = running
    return adjusted


@dataclass(frozen=True)
class SeedDifference:
    """The baseline's score minus a system's on each training seed both have (corpus scores of
    each run), their mean and the mean against the seed noise (the pooled standard deviation of
    the two systems' scores over seeds; None with fewer than two seeds each)."""

    per_seed: tuple[float, ...]
    mean: float | None
    effect: float | None

    @property
    def every_seed(self) -> bool:
        """The baseline is ahead on every paired seed (and there are at least two)."""
        return len(self.per_seed) >= 2 and all(d > 0 for d in self.per_seed)


def seed_difference(
    baseline: Sequence[Entry], system: Sequence[Entry], metric: str
) -> SeedDifference:
    """:class:`SeedDifference` of ``metric`` between two systems' entries (one run per seed)."""
    base = {e.run.seed: e.scores.get(metric) for e in baseline}
    other = {e.run.seed: e.scores.get(metric) for e in system}
    seeds = sorted(
        s for s in set(base) & set(other) if base[s] is not None and other[s] is not None
    )
    per_seed = tuple(float(base[s]) - float(other[s]) for s in seeds)
    if not per_seed:
        return SeedDifference((), None, None)
    mean = statistics.fmean(per_seed)
    spreads = [
        statistics.stdev(values)
        for values in ([base[s] for s in seeds], [other[s] for s in seeds])
        if len(values) >= 2
    ]
    pooled = (sum(s * s for s in spreads) / len(spreads)) ** 0.5 if len(spreads) == 2 else None
    effect = mean / pooled if pooled else None
    return SeedDifference(per_seed, mean, effect)


def verdict(
    p_adjusted: Mapping[str, float | None],
    differences: Mapping[str, SeedDifference],
    floor: bool,
) -> str:
    """The verdict on one system against the baseline from its Holm-adjusted bootstrap p-values
    and seed differences on ``bleu`` and ``chrf`` (the baseline's score minus the system's);
    ``floor``: the split is at the noise floor. The metrics disagree when only one is
    significant or when both are and their mean differences point opposite ways."""
    if floor:
        return UNINFORMATIVE
    significant = {m: p is not None and p < ALPHA for m, p in p_adjusted.items()}
    if not any(significant.values()):
        return NOISE
    if not all(significant.values()):
        return DISAGREE
    means = [differences[m].mean for m in p_adjusted if differences[m].mean is not None]
    if len({mean > 0 for mean in means}) > 1:
        return DISAGREE
    if all(differences[m].every_seed for m in p_adjusted):
        return WORSE
    if any(len(differences[m].per_seed) < 2 for m in p_adjusted):
        return ONE_SEED
    return NOT_EVERY_SEED

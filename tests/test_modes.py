"""Seeds that split into modes (:func:`posenc.analysis.report.findings.split_sides`): no test at a
few seeds is calibrated there, so a comparison with a side whose seeds spread far wider than
the family's other systems' is not tested, says so, and leaves the family's correction; a
system merely three times noisier than the rest is seldom taken for one, and at three seeds
only modes far apart can be told from noise."""

from __future__ import annotations

import numpy as np
import pytest

from posenc.analysis.decision import compare_scores
from posenc.analysis.report.findings import (
    METRICS,
    MODES_RATIO,
    SPLIT,
    Judgement,
    judge_family,
    split_sides,
)
from posenc.analysis.report.findings import (
    tested_p as family_tests,
)

FAMILIES = 4_000


def judgement(first: dict[int, float], second: dict[int, float]) -> Judgement:
    """The same seed scores on both metrics, the sentences no noise."""
    return Judgement(
        {m: compare_scores(first, second) for m in METRICS},
        floor=False,
        loops=(0.0, 0.0),
        seed_scores={m: (first, second) for m in METRICS},
    )


def test_a_side_spread_beyond_the_ratio_of_the_others_median_is_split():
    assert split_sides([1.0, 1.2, 0.9, MODES_RATIO * 1.0 + 0.1]) == [False, False, False, True]
    assert split_sides([1.0, 1.2, 0.9, MODES_RATIO * 1.0 - 0.1]) == [False] * 4
    assert split_sides([5.0, None, 1.0]) == [False] * 3  # one other: 5 < 10 x 1
    assert split_sides([0.0, 0.0, 3.0]) == [False] * 3  # the others' median is 0: no reference
    assert split_sides([2.0]) == [False]


def test_a_split_system_is_not_tested_and_leaves_the_family():
    baseline = {0: 20.0, 1: 20.5, 2: 19.8}
    steady = [{0: 22.0 + d, 1: 22.4 + d, 2: 21.9 + d} for d in (0.0, 0.3, 0.6)]
    modes = {0: 17.7, 1: 18.3, 2: 51.2}  # two seeds in one mode, one in another
    family = [judgement(s, baseline) for s in steady] + [judgement(modes, baseline)]
    judge_family(family)
    assert family[-1].split and family[-1].verdict == SPLIT
    assert not any(j.split for j in family[:-1])
    assert len(family_tests(family)) == 2 * len(steady)  # the split comparison is no test
    assert all(j.p_holm and all(p is not None for p in j.p_holm.values()) for j in family[:-1])


def simulated_split_rate(spread: float, modes: bool, seeds: int = 3, seed: int = 0) -> float:
    """The share of FAMILIES simulated families (five systems against a baseline, ``seeds``
    seeds each, seed deviation 1) in which the last system is taken as split: its seeds
    ``spread`` times noisier, or (``modes``) two of them in one mode and the rest ``spread``
    deviations away. The six systems' seed deviations are what :func:`judge_family` reads
    (each system once)."""
    rng = np.random.default_rng(seed)
    flagged = 0
    for _ in range(FAMILIES):
        scores = rng.standard_normal((6, seeds))
        if modes:
            scores[5, 2:] += spread
        else:
            scores[5] *= spread
        flagged += split_sides(scores.std(axis=1, ddof=1).tolist())[-1]
    return flagged / FAMILIES


@pytest.mark.parametrize(("seeds", "limit"), [(3, 0.025), (5, 0.005)])
def test_a_system_three_times_noisier_is_seldom_taken_for_split(seeds, limit):
    assert simulated_split_rate(3.0, modes=False, seeds=seeds) <= limit


def test_two_modes_twenty_deviations_apart_are_found_at_three_seeds():
    assert simulated_split_rate(20.0, modes=True) >= 0.8

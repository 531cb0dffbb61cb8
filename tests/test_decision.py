"""The decision rule (:mod:`posenc.analysis.decision`): its unit is the training run; with no
true difference it calls a finding at most 5% of the time, and it finds a true difference of
three seed deviations at five seeds at least 80% of the time; its sentence component is what
resampling the test set gives; its seed counts for power, its loop detector."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from sacrebleu import corpus_bleu, corpus_chrf
from scipy import stats

from posenc.analysis.decision import (
    ALPHA,
    compare_scores,
    holm,
    loop_share,
    loops,
    seeds_for_power,
    sentence_deviation,
    sentence_statistics,
)

SIMULATIONS = 10_000
#: the largest false-finding rate the simulation may show: 5% plus three of its standard errors
LIMIT = ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / SIMULATIONS)


def simulated_rate(seeds, seed_sd, sentence_sd, difference, paired, correlation=0.3, rng=None):
    """The share of simulated pairs of systems whose comparison is significant at ALPHA. Each
    run's score is its system's true score on this test set plus seed noise (correlated between
    the two systems' runs of one seed when they share seeds, independent otherwise); the test
    set itself shifts the
    true difference by N(0, sentence_sd^2), whose size the rule is told."""
    rng = rng or np.random.default_rng(0)
    found = 0
    for _ in range(SIMULATIONS):
        shared = rng.standard_normal(seeds)
        own = rng.standard_normal((2, seeds))
        rho = correlation if paired else 0.0
        noise = seed_sd * (math.sqrt(rho) * shared + math.sqrt(1 - rho) * own)
        test_set = rng.normal(0.0, sentence_sd)
        a = {s: difference + test_set + noise[0, s] for s in range(seeds)}
        b = {(s if paired else s + seeds): noise[1, s] for s in range(seeds)}
        p = compare_scores(a, b, sentence_sd).p
        found += p < ALPHA
    return found / SIMULATIONS


@pytest.mark.parametrize("paired", [True, False], ids=["same seeds", "other seeds"])
@pytest.mark.parametrize("seeds", [3, 5])
@pytest.mark.parametrize(
    ("seed_sd", "sentence_sd"),
    [(0.3, 0.045), (0.3, 0.3), (0.05, 0.3)],
    ids=["seeds dominate (newstest2014)", "both", "sentences dominate"],
)
def test_with_no_true_difference_at_most_5_percent_are_findings(
    seeds, seed_sd, sentence_sd, paired
):
    assert simulated_rate(seeds, seed_sd, sentence_sd, 0.0, paired) <= LIMIT


@pytest.mark.parametrize("paired", [True, False], ids=["same seeds", "other seeds"])
def test_a_difference_of_three_seed_deviations_is_found_at_five_seeds_80_percent_of_the_time(
    paired,
):
    rate = simulated_rate(5, 0.3, 0.045, 3 * 0.3, paired, correlation=0.0)
    assert rate >= 0.8


def test_without_sentence_noise_the_rule_is_students_t_over_seeds():
    a = {0: 30.1, 1: 29.4, 2: 30.8}
    b = {0: 29.0, 1: 29.2, 2: 29.9}
    paired = compare_scores(a, b)
    assert paired.paired and paired.seeds == (3, 3)
    assert paired.p == pytest.approx(stats.ttest_rel(list(a.values()), list(b.values())).pvalue)
    other = {5: 29.0, 6: 29.2, 7: 29.9, 8: 28.7}
    welch = compare_scores(a, other)
    assert not welch.paired and welch.seeds == (3, 4)
    expected = stats.ttest_ind(list(a.values()), list(other.values()), equal_var=False)
    assert welch.p == pytest.approx(expected.pvalue)
    assert welch.difference == pytest.approx(statistics.fmean(a.values()) - 29.2)
    low, high = expected.confidence_interval(0.95)
    assert (welch.low, welch.high) == (pytest.approx(low), pytest.approx(high))


def test_sentence_noise_widens_the_interval_and_one_seed_gets_no_test():
    a, b = {0: 30.1, 1: 29.4, 2: 30.8}, {0: 29.0, 1: 29.2, 2: 29.9}
    narrow, wide = compare_scores(a, b), compare_scores(a, b, sentence_se=1.0)
    assert wide.p > narrow.p and wide.high - wide.low > narrow.high - narrow.low
    single = compare_scores({0: 30.0}, {0: 29.0})
    assert single.p is None and single.difference == 1.0 and single.low is None


def test_holm_adjusts_a_family_at_once():
    assert holm({"a": 0.01, "b": 0.04, "c": 0.03}) == {
        "a": 0.03,
        "c": pytest.approx(0.06),
        "b": pytest.approx(0.06),
    }


def test_the_seeds_for_power_fall_with_the_difference_and_rise_with_the_family():
    def needed(difference, family=1, sentence_se=0.0):
        return seeds_for_power(
            compare_scores(
                {0: difference, 1: difference + 0.6, 2: difference - 0.3},
                {0: 0.0, 1: 0.3, 2: -0.6},
                sentence_se,
            ),
            family,
        )

    assert needed(2.0) < needed(0.5) < needed(0.5, family=57)
    assert needed(0.1, sentence_se=1.0) is None  # within the test set's noise: more sentences
    assert seeds_for_power(compare_scores({0: 1.0}, {0: 0.0})) is None


def _resampled_reference(metric, a, b, references, samples, seed):
    """The slow, obvious form: draw the sentence indices as the rule does, rebuild the
    resampled files and score each run with sacreBLEU's corpus functions."""
    score = {"bleu": corpus_bleu, "chrf": corpus_chrf}[metric]
    rng = np.random.default_rng(seed)
    differences = []
    for _ in range(samples):  # the same draws as the rule's, one sample after another
        index = rng.integers(0, len(references), len(references))
        refs = [references[i] for i in index]
        mean = {
            side: statistics.fmean(
                score([h[i] for i in index], [refs]).score for h in runs.values()
            )
            for side, runs in (("a", a), ("b", b))
        }
        differences.append(mean["a"] - mean["b"])
    return statistics.stdev(differences)


@pytest.mark.parametrize("metric", ["bleu", "chrf"])
def test_the_sentence_component_is_the_spread_over_resampled_test_sets(metric):
    references = [
        "the cat sat on the mat",
        "a dog barked at night",
        "we went home early today",
        "it is raining again",
        "she reads a long book",
        "the train was late",
    ]
    a = {
        0: [
            "the cat sat on a mat",
            "a dog barked at night",
            "we went home today",
            "it rains again",
            "she reads a book",
            "the train is late",
        ],
        1: [
            "the cat sat on the mat",
            "the dog barked",
            "we went home early",
            "it is raining",
            "she read a long book",
            "a train was late",
        ],
    }
    b = {
        0: [
            "a cat on the mat",
            "dog barked night",
            "we home early today",
            "raining again",
            "she reads long book",
            "train late",
        ],
        1: [
            "the cat sat",
            "a dog at night",
            "we went early today",
            "it is raining again",
            "reads a long book",
            "the train was",
        ],
    }
    statistics_of = {
        side: [sentence_statistics(metric, h, references) for h in runs.values()]
        for side, runs in (("a", a), ("b", b))
    }
    found = sentence_deviation(metric, statistics_of["a"], statistics_of["b"], samples=30, seed=7)
    assert found == pytest.approx(_resampled_reference(metric, a, b, references, 30, 7))
    assert sentence_deviation(metric, statistics_of["a"], statistics_of["a"], samples=30) == 0.0


@pytest.mark.parametrize(
    ("hypothesis", "looping"),
    [
        ("Spepepepepepe", True),
        ("the house, the house, the house, the house", True),
        ("It is a very, very good idea.", False),
        ("The committee met on 12 December 2012 in Brussels.", False),
        ("", False),
    ],
)
def test_a_translation_loops_when_a_stretch_repeats_four_times_in_a_row(hypothesis, looping):
    assert loops(hypothesis) is looping


def test_the_loop_share_counts_looping_translations():
    assert loop_share(["ok then", "lalalala la", "fine"]) == pytest.approx(1 / 3)
    assert loop_share([]) == 0.0

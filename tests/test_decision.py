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
    equivalence,
    holm,
    loop_share,
    loops,
    loss_statistics,
    seed_components,
    seeds_for_power,
    sentence_deviation,
    sentence_statistics,
    t_test,
)
from posenc.runtime.sentence_losses import SentenceLosses

SIMULATIONS = 10_000
#: the largest false-finding rate the simulation may show: 5% plus three of its standard errors
LIMIT = ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / SIMULATIONS)
#: sentences of a simulated test set (the sentence component is estimated from them)
SENTENCES = 200
#: (seeds of a, seeds of b, the same seeds on both sides)
DESIGNS = [(3, 3, True), (5, 5, True), (3, 3, False), (5, 5, False), (3, 5, False), (5, 3, False)]


def seed_noise(rng, shape, shape_name):
    """Standardised seed noise: normal, or mildly right-skewed (a gamma of shape 4: skewness 1)."""
    if shape_name == "normal":
        return rng.standard_normal(shape)
    return (rng.gamma(4.0, 1.0, shape) - 4.0) / 2.0


def simulated_rate(
    design, seed_sd_a, seed_sd_b, sentence_sd, difference, shape="normal", correlation=0.3, seed=0
):
    """The share of SIMULATIONS pairs of systems the rule (:func:`seed_components`,
    :func:`t_test`) calls different at ALPHA. A run's score is its system's true score plus seed
    noise (correlated between the two systems' runs of one seed when they share seeds); the
    test set shifts the true difference by the mean of its SENTENCES per-sentence differences,
    and the rule is told the bootstrap's estimate of that shift's deviation from the same
    sentences (their deviation over the root of their number), not its true value."""
    n_a, n_b, paired = design
    rng = np.random.default_rng(seed)
    rho = correlation if paired else 0.0
    shared = seed_noise(rng, (SIMULATIONS, max(n_a, n_b)), shape)
    own_a = seed_noise(rng, (SIMULATIONS, n_a), shape)
    own_b = seed_noise(rng, (SIMULATIONS, n_b), shape)
    a = seed_sd_a * (math.sqrt(rho) * shared[:, :n_a] + math.sqrt(1 - rho) * own_a)
    b = seed_sd_b * (math.sqrt(rho) * shared[:, :n_b] + math.sqrt(1 - rho) * own_b)
    sentences = sentence_sd * math.sqrt(SENTENCES) * rng.standard_normal((SIMULATIONS, SENTENCES))
    a = a + difference + sentences.mean(axis=1, keepdims=True)
    estimate = sentences.std(axis=1) / math.sqrt(SENTENCES)
    difference_found, seed_var, df = seed_components(a, b, paired)
    p, _ = t_test(difference_found, seed_var, estimate, df)
    return float(np.mean(p < ALPHA))


@pytest.mark.parametrize("shape", ["normal", "mildly skewed"])
@pytest.mark.parametrize("deviation_ratio", [1, 2, 3])
@pytest.mark.parametrize("design", DESIGNS, ids=lambda d: f"{d[0]}v{d[1]}{'p' if d[2] else ''}")
@pytest.mark.parametrize(
    "sentence_sd", [0.15, 1.0, 6.0], ids=["seeds dominate", "both", "sentences dominate"]
)
def test_with_no_true_difference_at_most_5_percent_are_findings(
    design, deviation_ratio, shape, sentence_sd
):
    """Every cell of the grid: 3 or 5 seeds a side, paired or not, side a up to three times
    noisier (at 3v5 the side with fewer seeds, at 5v3 the one with more), normal or mildly
    skewed seed scores."""
    rate = simulated_rate(design, deviation_ratio, 1.0, sentence_sd, 0.0, shape)
    assert rate <= LIMIT


@pytest.mark.parametrize("paired", [True, False], ids=["same seeds", "other seeds"])
def test_a_difference_of_three_seed_deviations_is_found_at_five_seeds_80_percent_of_the_time(
    paired,
):
    rate = simulated_rate((5, 5, paired), 1.0, 1.0, 0.15, 3.0, correlation=0.0)
    assert rate >= 0.8


def test_the_power_welchs_cap_costs_at_three_seeds_against_five():
    """The cap's price, stated in docs/METHODS.md §10: a difference of three seed deviations at
    three seeds against five is found 65-75% of the time (with Welch's own degrees of freedom
    about 80%); paired seeds keep ``n - 1`` (three: about half the time)."""
    assert 0.65 <= simulated_rate((3, 5, False), 1.0, 1.0, 0.15, 3.0) <= 0.75
    assert 0.45 <= simulated_rate((3, 3, True), 1.0, 1.0, 0.15, 3.0, correlation=0.0) <= 0.55


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
    assert expected.df > 2.5  # Welch's own degrees of freedom, above the cap of 3 - 0.5 seeds
    assert welch.df == 2.5
    t = expected.statistic
    assert welch.p == pytest.approx(2 * stats.t.sf(abs(t), 2.5))
    assert welch.difference == pytest.approx(statistics.fmean(a.values()) - 29.2)
    half = stats.t.ppf(0.975, 2.5) * welch.difference / t
    assert (welch.low, welch.high) == (
        pytest.approx(welch.difference - half),
        pytest.approx(welch.difference + half),
    )
    uneven = compare_scores({0: 30.1, 1: 24.4, 2: 36.8}, other)  # the noisy side dominates
    assert uneven.df < 2.5
    assert uneven.df == pytest.approx(
        stats.ttest_ind([30.1, 24.4, 36.8], list(other.values()), equal_var=False).df
    )


def test_sentence_noise_widens_the_interval_and_one_seed_gets_no_test():
    a, b = {0: 30.1, 1: 29.4, 2: 30.8}, {0: 29.0, 1: 29.2, 2: 29.9}
    narrow, wide = compare_scores(a, b), compare_scores(a, b, sentence_se=1.0)
    assert wide.p > narrow.p and wide.high - wide.low > narrow.high - narrow.low
    single = compare_scores({0: 30.0}, {0: 29.0})
    assert single.p is None and single.difference == 1.0 and single.low is None


def test_equivalence_is_two_one_sided_tests_on_the_rules_error():
    a = {0: 30.1, 1: 29.4, 2: 30.8}
    b = {0: 29.9, 1: 29.6, 2: 30.3}
    comparison = compare_scores(a, b)
    per_seed = [a[s] - b[s] for s in a]
    margin = 1.0
    lower = stats.ttest_1samp(per_seed, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(per_seed, margin, alternative="less").pvalue
    assert equivalence(comparison, margin) == pytest.approx(max(lower, upper))
    # equivalent at ALPHA exactly when the 90% interval lies inside the margins
    half = stats.t.ppf(1 - ALPHA, comparison.df) * comparison.se
    for m in (0.3, 0.6, 1.0, 2.0):
        inside = -m < comparison.difference - half and comparison.difference + half < m
        assert (equivalence(comparison, m) < ALPHA) == inside
    assert equivalence(compare_scores({0: 1.0}, {0: 1.0}), margin) is None
    with pytest.raises(ValueError, match="margin must be positive"):
        equivalence(comparison, 0.0)


@pytest.mark.parametrize("design", [(3, 3, True), (3, 5, False)], ids=["3v3p", "3v5"])
def test_a_true_difference_at_the_margin_is_called_equivalent_at_most_5_percent_of_the_time(
    design,
):
    n_a, n_b, paired = design
    rng = np.random.default_rng(5)
    margin, calls = 1.0, 0
    for _ in range(2_000):
        a = {s: margin + rng.normal(0.0, 0.3) for s in range(n_a)}
        b = {(s if paired else 10 + s): rng.normal(0.0, 0.3) for s in range(n_b)}
        calls += equivalence(compare_scores(a, b), margin) < ALPHA
    assert calls / 2_000 <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / 2_000)


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


def test_a_loss_contrast_resamples_sentences_as_a_score_does():
    """``loss``: each run's loss per token over the resampled sentences (summed NLL over
    summed target tokens), seed-averaged, signed and summed: a slow loop over the same draws."""
    rng = np.random.default_rng(3)
    tokens = rng.integers(3, 30, size=40)
    runs = {side: [rng.gamma(2.0, 1.5, size=40) * tokens for _ in range(3)] for side in "ab"}
    tables = {
        side: [loss_statistics(SentenceLosses([1] * 40, list(n), list(tokens))) for n in nll]
        for side, nll in runs.items()
    }
    found = sentence_deviation("loss", tables["a"], tables["b"], samples=40, seed=5)
    draw, differences = np.random.default_rng(5), []
    for _ in range(40):
        index = draw.integers(0, 40, 40)
        mean = {
            side: statistics.fmean(
                sum(n[i] for i in index) / sum(tokens[i] for i in index) for n in nll
            )
            for side, nll in runs.items()
        }
        differences.append(mean["a"] - mean["b"])
    assert found == pytest.approx(statistics.stdev(differences))
    assert found > 0 and sentence_deviation("loss", tables["a"], tables["a"], samples=40) == 0.0


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

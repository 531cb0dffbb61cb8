"""The report's reading paragraph says what its significance rows say under the rules of a finding
(``posenc.analysis.report.findings``), and how far to trust it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from posenc.analysis.reading import reading, split_reading
from posenc.analysis.report.findings import (
    DISAGREE,
    NOISE,
    NOT_EVERY_SEED,
    ONE_SEED,
    UNINFORMATIVE,
    WORSE,
    holm,
    seed_difference,
    verdict,
)


def row(section: str, split: str, encoding: str, metric: str, value, run: str = "") -> dict:
    """One row of a report's CSV."""
    return dict(
        section=section, split=split, encoding=encoding, run=run, metric=metric, value=value
    )


def rows(
    split: str,
    bleu: dict[str, float],
    verdicts: dict[str, str],
    seeds: int = 3,
    floor: bool = False,
) -> list[dict]:
    """The rows a report writes for ``split``: significance (BLEU, p and verdict against the
    best, the first encoding), seeds per encoding and each run's training seconds (100, ...)."""
    best = next(iter(bleu))
    return [
        *(row("significance", split, e, "bleu", v) for e, v in bleu.items()),
        *(row("significance", split, e, "p_bleu", 0.01) for e in verdicts),
        *(row("significance", split, e, "verdict", v) for e, v in verdicts.items()),
        *(row("significance", split, e, "delta_bleu", bleu[best] - bleu[e]) for e in verdicts),
        *(row("significance", split, e, "effect_bleu", 2.5) for e in verdicts),
        row("significance", split, best, "noise_floor", int(floor)),
        *(row("scores", split, e, "bleu_n", seeds) for e in bleu),
        *(
            row("runs", split, e, "train_seconds", 100 + i, run=f"pe={e}")
            for i, e in enumerate(bleu)
        ),
    ]


def test_it_names_the_best_the_findings_with_their_size_and_what_is_not_a_finding():
    text = split_reading(
        rows(
            "test",
            {"rope": 19.0, "sinpe": 18.5, "alibi": 17.0, "t5": 16.0, "nonepe": 11.0},
            {"sinpe": NOISE, "alibi": NOT_EVERY_SEED, "t5": DISAGREE, "nonepe": WORSE},
        ),
        "test",
    )
    assert "**rope** scores best (BLEU 19.0)" in text
    assert "range from 11.0 (nonepe) to 18.5 (sinpe)" in text
    assert "on every training seed and after Holm's correction (p < 0.05): nonepe +8.0 BLEU" in text
    assert "= 2.5 seed sd" in text
    assert "alibi: worse on the pooled test sentences but not on every seed" in text
    assert "BLEU and chrF disagree on t5" in text
    assert "The rest are within noise of it" in text


def test_without_a_finding_it_says_so():
    text = split_reading(rows("t", {"a": 20.0, "b": 19.0}, {"b": NOT_EVERY_SEED}), "t")
    assert "the other one, b, has 19.0" in text
    assert "No encoding is found worse beyond the noise of sentences and seeds" in text


def test_a_split_at_the_noise_floor_ranks_nothing():
    data = rows("test", {"a": 1.2, "b": 0.9}, {"b": UNINFORMATIVE}, floor=True)
    text = split_reading(data, "test")
    assert "below the noise floor of 2: no encoding is ranked" in text and "best" in text
    assert "scores best" not in text


def test_one_seed_is_named_as_a_limit_of_trust():
    data = rows("test", {"a": 13.0, "b": 11.0}, {"b": NOT_EVERY_SEED}, seeds=1) + rows(
        "tatoeba", {"a": 15.0, "b": 16.0}, {"b": NOISE}, seeds=1
    )
    text = reading(data, ["test", "tatoeba"])
    assert text.index("On `test`") < text.index("On `tatoeba`")
    assert "one seed per encoding after 100 to 101 s of training" in text
    assert "With one seed nothing can be a finding" in text


def test_without_two_scored_encodings_it_points_to_the_learning_curves():
    text = reading(rows("test", {"a": 3.0}, {}), ["test"])
    assert "no scores to compare" in text and "equal steps" in text


def test_one_training_time_is_named_once():
    both = rows("test", {"a": 3.0, "b": 1.0}, {"b": NOISE})
    data = [r for r in both if not (r["section"] == "runs" and r["encoding"] == "b")]
    assert "after 100 s of training" in reading(data, ["test"])


def test_runs_that_stopped_at_different_steps_are_not_read_as_equal_training():
    data = rows("test", {"a": 3.0, "b": 1.0}, {"b": NOISE})
    for run, steps, status in (("pe=a", 2791, "done"), ("pe=b", 1745, "done"), ("c", 9, "")):
        data += [
            row("runs", "test", run, "steps", steps, run),
            row("runs", "test", run, "status", status, run),
        ]
    assert "different numbers of steps (1,745 to 2,791" in reading(data, ["test"])
    data[-4]["value"] = 2700  # within 5%; the unfinished run's steps do not count
    assert "different numbers of steps" not in reading(data, ["test"])


# ---------------------------------------------------------------- the rules of a finding


def test_holm_multiplies_the_smallest_p_by_the_number_of_tests_and_keeps_the_order():
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert adjusted == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06})
    assert holm({"a": 0.6, "b": 0.9}) == {"a": 1.0, "b": 1.0}  # capped at 1


def entries(scores: dict[int, float]) -> list:
    """Entries of one system: seed -> BLEU."""
    return [
        SimpleNamespace(run=SimpleNamespace(seed=s), scores={"bleu": v}) for s, v in scores.items()
    ]


def test_a_seed_difference_pairs_seeds_and_measures_against_the_seed_spread():
    base, other = entries({0: 10.0, 1: 11.0, 2: 12.0}), entries({0: 9.0, 1: 10.0, 2: 9.0, 3: 1.0})
    difference = seed_difference(base, other, "bleu")
    assert difference.per_seed == (1.0, 1.0, 3.0) and difference.every_seed
    assert difference.mean == pytest.approx(5 / 3)
    assert difference.effect == pytest.approx((5 / 3) / ((1.0 + 1 / 3) / 2) ** 0.5)
    one = seed_difference(entries({0: 10.0}), entries({0: 9.0}), "bleu")
    assert one.effect is None and not one.every_seed  # one seed: no finding can stand on it


def test_the_verdict_needs_both_metrics_every_seed_and_the_correction():
    ahead = seed_difference(entries({0: 10.0, 1: 11.0}), entries({0: 9.0, 1: 10.5}), "bleu")
    mixed = seed_difference(entries({0: 10.0, 1: 11.0}), entries({0: 9.0, 1: 11.5}), "bleu")
    both = {"bleu": ahead, "chrf": ahead}
    assert verdict({"bleu": 0.01, "chrf": 0.02}, both, floor=False) == WORSE
    assert verdict({"bleu": 0.01, "chrf": 0.02}, {"bleu": ahead, "chrf": mixed}, False) == (
        NOT_EVERY_SEED
    )
    assert verdict({"bleu": 0.01, "chrf": 0.3}, both, floor=False) == DISAGREE
    assert verdict({"bleu": 0.2, "chrf": 0.3}, both, floor=False) == NOISE
    assert verdict({"bleu": 0.01, "chrf": 0.02}, both, floor=True) == UNINFORMATIVE
    one = seed_difference(entries({0: 10.0}), entries({0: 9.0}), "bleu")
    assert verdict({"bleu": 0.01, "chrf": 0.02}, {"bleu": one, "chrf": one}, False) == ONE_SEED
    behind = seed_difference(entries({0: 9.0}), entries({0: 10.0}), "bleu")
    # both significant but pointing opposite ways: a disagreement before any count of seeds
    assert verdict({"bleu": 0.01, "chrf": 0.02}, {"bleu": one, "chrf": behind}, False) == DISAGREE


def test_one_seed_is_never_a_finding_and_the_reading_says_why():
    text = split_reading(rows("t", {"a": 20.0, "b": 15.0}, {"b": ONE_SEED}, seeds=1), "t")
    assert "b: worse on the test sentences, with one training seed only" in text
    assert "No encoding is found worse" in text

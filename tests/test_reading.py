"""The report's reading paragraph says what its significance rows say under the rules of a finding
(``posenc.analysis.report.findings``), and how far to trust it."""

from __future__ import annotations

from posenc.analysis.report.findings import (
    NOISE,
    ONE_SEED,
    ONLY_CHRF,
    OPPOSITE,
    UNINFORMATIVE,
    WORSE,
)
from posenc.analysis.report.reading import reading, split_reading


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
        *(row("significance", split, e, "low_bleu", bleu[best] - bleu[e] - 1) for e in verdicts),
        *(row("significance", split, e, "high_bleu", bleu[best] - bleu[e] + 1) for e in verdicts),
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
            {"sinpe": NOISE, "alibi": ONLY_CHRF, "t5": OPPOSITE, "nonepe": WORSE},
        ),
        "test",
    )
    assert "**rope** scores best (BLEU 19.0)" in text
    assert "range from 11.0 (nonepe) to 18.5 (sinpe)" in text
    assert "after Holm's correction (p < 0.05): nonepe by 8.0 BLEU (95% CI 7.0 to 9.0)" in text
    assert "beyond the noise of training seeds and test sentences" in text
    assert "alibi: behind on chrF only, so not a finding" in text
    assert "t5: BLEU and chrF significant in opposite directions" in text
    assert "The rest are within noise of it" in text


def test_without_a_finding_it_says_so():
    text = split_reading(rows("t", {"a": 20.0, "b": 19.0}, {"b": NOISE}), "t")
    assert "the other one, b, has 19.0" in text
    assert "No encoding is found behind it beyond the noise of seeds and sentences" in text


def test_a_split_at_the_noise_floor_ranks_nothing():
    data = rows("test", {"a": 1.2, "b": 0.9}, {"b": UNINFORMATIVE}, floor=True)
    text = split_reading(data, "test")
    assert "below the noise floor of 2: no encoding is ranked" in text and "best" in text
    assert "scores best" not in text


def test_one_seed_is_named_as_a_limit_of_trust():
    data = rows("test", {"a": 13.0, "b": 11.0}, {"b": ONE_SEED}, seeds=1) + rows(
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


def test_one_seed_is_never_a_finding_and_the_reading_says_why():
    text = split_reading(rows("t", {"a": 20.0, "b": 15.0}, {"b": ONE_SEED}, seeds=1), "t")
    assert "b: one training seed, so not tested (a test needs two seeds a side)" in text
    assert "No encoding is found behind it" in text

"""The report's reading paragraph says what its significance rows say, and how far to trust it."""

from __future__ import annotations

from posenc.analysis.reading import reading, split_reading


def row(section: str, split: str, encoding: str, metric: str, value, run: str = "") -> dict:
    """One row of a report's CSV."""
    return dict(
        section=section, split=split, encoding=encoding, run=run, metric=metric, value=value
    )


def rows(split: str, bleu: dict[str, float], p: dict[str, float], seeds: int = 1) -> list[dict]:
    """The rows a report writes for ``split``: significance (BLEU and p against the best),
    seeds per encoding and each run's training seconds (100, 101, ...)."""
    return [
        *(row("significance", split, e, "bleu", v) for e, v in bleu.items()),
        *(row("significance", split, e, "p_bleu", v) for e, v in p.items()),
        *(row("scores", split, e, "bleu_n", seeds) for e in bleu),
        *(
            row("runs", split, e, "train_seconds", 100 + i, run=f"pe={e}")
            for i, e in enumerate(bleu)
        ),
    ]


def test_it_names_the_best_encoding_and_the_significantly_worse_ones():
    text = split_reading(
        rows("test", {"rope": 9.0, "sinpe": 8.5, "nonepe": 1.0}, {"sinpe": 0.3, "nonepe": 0.001}),
        "test",
    )
    assert "**rope** scores best (BLEU 9.0)" in text
    assert "range from 1.0 (nonepe) to 8.5 (sinpe)" in text
    assert "1 of them is significantly worse" in text and "nonepe;" in text
    assert "within test-set noise" in text


def test_it_says_when_nothing_or_everything_differs():
    same = split_reading(rows("t", {"a": 2.0, "b": 1.9}, {"b": 0.6}), "t")
    assert "the other one, b, has 1.9" in same and "None of them is significantly worse" in same
    apart = split_reading(rows("t", {"a": 20.0, "b": 1.9, "c": 1.0}, {"b": 0.01, "c": 0.001}), "t")
    assert "All of them are significantly worse" in apart


def test_one_seed_is_named_as_a_limit_of_trust():
    data = rows("test", {"a": 3.0, "b": 1.0}, {"b": 0.01}) + rows(
        "tatoeba", {"a": 5.0, "b": 6.0}, {"a": 0.2}
    )
    text = reading(data, ["test", "tatoeba"])
    assert text.index("On `test`") < text.index("On `tatoeba`")
    assert "one seed per encoding after 100 to 101 s of training" in text
    assert "not how much a ranking moves with the training seed" in text


def test_without_two_scored_encodings_there_is_nothing_to_read():
    assert "nothing to compare" in reading(rows("test", {"a": 3.0}, {}), ["test"])


def test_one_training_time_is_named_once():
    both = rows("test", {"a": 3.0, "b": 1.0}, {"b": 0.01})
    data = [r for r in both if not (r["section"] == "runs" and r["encoding"] == "b")]
    assert "after 100 s of training" in reading(data, ["test"])

"""A sweep report's reading: one paragraph that says what its numbers say and how far to trust
them, written from the report's own rows (``report.csv``: section, split, encoding, run, metric,
value), so the words can never disagree with the tables."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ALPHA = 0.05  # the significance level the reading uses


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _values(rows: Iterable[Mapping[str, Any]], section: str, split: str, metric: str) -> dict:
    """Encoding -> value of the rows of ``section``/``split``/``metric`` with no run (the
    encoding's summary rows)."""
    return {
        r["encoding"]: _number(r["value"])
        for r in rows
        if r["section"] == section
        and r["split"] == split
        and r["metric"] == metric
        and not r["run"]
    }


def _names(names: Sequence[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def split_reading(rows: Sequence[Mapping[str, Any]], split: str) -> str | None:
    """What the paired bootstrap of ``split`` says: the best encoding, the spread of BLEU and
    which encodings are significantly worse; None when the split has no significance rows."""
    bleu = _values(rows, "significance", split, "bleu")
    p_bleu = _values(rows, "significance", split, "p_bleu")
    if len(bleu) < 2:
        return None
    best = next(name for name in bleu if name not in p_bleu)
    others = sorted((n for n in bleu if n != best), key=lambda n: -bleu[n])
    worse = [n for n in others if p_bleu.get(n, 1.0) < ALPHA]
    low, high = others[-1], others[0]
    spread = (
        f"the other one, {low}, has {bleu[low]:.1f}"
        if low == high
        else f"the other {len(others)} range from {bleu[low]:.1f} ({low}) to "
        f"{bleu[high]:.1f} ({high})"
    )
    text = f"On `{split}`, **{best}** scores best (BLEU {bleu[best]:.1f}); {spread}. "
    if not worse:
        return text + f"None of them is significantly worse (paired bootstrap, p < {ALPHA}). "
    if len(worse) == len(others):
        return text + f"All of them are significantly worse (paired bootstrap, p < {ALPHA}). "
    return (
        text
        + f"{len(worse)} of them {'is' if len(worse) == 1 else 'are'} significantly worse "
        + f"(paired bootstrap, p < {ALPHA}): "
        + f"{_names(worse)}; the rest are within test-set noise of it. "
    )


def reading(rows: Sequence[Mapping[str, Any]], splits: Sequence[str]) -> str:
    """The reading paragraph of a report with ``rows``, over ``splits`` (focus first)."""
    parts = [text for split in splits if (text := split_reading(rows, split))]
    if not parts:
        return "Fewer than two encodings have scored hypotheses: there is nothing to compare yet."
    seeds = [int(v) for v in _values(rows, "scores", splits[0], "bleu_n").values() if v == v]
    seconds = [
        _number(r["value"])
        for r in rows
        if r["section"] == "runs" and r["metric"] == "train_seconds"
    ]
    if seconds:
        shortest, longest = f"{min(seconds):.0f}", f"{max(seconds):.0f}"
        span = shortest if shortest == longest else f"{shortest} to {longest}"
        budget = f"after {span} s of training"
    else:
        budget = "at this budget"
    if seeds and min(seeds) == max(seeds):
        n_seeds = "one seed" if seeds[0] == 1 else f"{seeds[0]} seeds"
    else:
        n_seeds = "a varying number of seeds"
    trust = (
        f"How far to trust this: {n_seeds} per encoding {budget}. The bootstrap measures "
        "only the sampling of test sentences, "
        + (
            "not how much a ranking moves with the training seed (run more seeds to see that); "
            if not seeds or max(seeds) < 2
            else "and the hypotheses of all seeds are pooled; "
        )
        + "and a ranking this early says which encoding learns fastest, not which is best when "
        "trained to convergence."
    )
    return "".join(parts) + trust

"""A sweep report's reading: one paragraph that says what its numbers say and how far to trust
them, written from the report's own rows (``report.csv``: section, split, encoding, run, metric,
value), so the words can never disagree with the tables."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from posenc.analysis.decision import ALPHA
from posenc.analysis.report.findings import (
    NOISE,
    NOISE_FLOOR_BLEU,
    ONE_SEED,
    ONLY_BLEU,
    ONLY_CHRF,
    OPPOSITE,
    UNINFORMATIVE,
    VERDICTS,
    WORSE,
)


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


def _texts(rows: Iterable[Mapping[str, Any]], section: str, split: str, metric: str) -> dict:
    """Encoding -> the text value of the summary rows of ``section``/``split``/``metric``."""
    return {
        r["encoding"]: str(r["value"])
        for r in rows
        if r["section"] == section and r["split"] == split and r["metric"] == metric
    }


def split_reading(rows: Sequence[Mapping[str, Any]], split: str) -> str | None:
    """What the significance rows of ``split`` say under :mod:`.report.findings`' rules: the
    best encoding and the spread of BLEU; nothing ranked when the best is below the quality
    floor; otherwise the encodings found behind it (by how much, with the interval) and every
    other verdict but noise by name. None when the split has no significance rows."""
    bleu = _values(rows, "significance", split, "bleu")
    p_bleu = _values(rows, "significance", split, "p_bleu")
    if len(bleu) < 2:
        return None
    best = next(name for name in bleu if name not in p_bleu)
    others = sorted((n for n in bleu if n != best), key=lambda n: -bleu[n])
    low, high = others[-1], others[0]
    spread = (
        f"the other one, {low}, has {bleu[low]:.1f}"
        if low == high
        else f"the other {len(others)} range from {bleu[low]:.1f} ({low}) to "
        f"{bleu[high]:.1f} ({high})"
    )
    text = f"On `{split}`, **{best}** scores best (BLEU {bleu[best]:.1f}); {spread}. "
    if _values(rows, "significance", split, "noise_floor").get(best) == 1:
        return (
            f"On `{split}`, the best BLEU is {bleu[best]:.1f} ({best}), below the noise floor of "
            f"{NOISE_FLOOR_BLEU:g}: no encoding is ranked on this split. "
        )
    verdicts = _texts(rows, "significance", split, "verdict")
    by_verdict = {v: [n for n in others if verdicts.get(n) == v] for v in VERDICTS}
    delta = _values(rows, "significance", split, "delta_bleu")
    low = _values(rows, "significance", split, "low_bleu")
    high = _values(rows, "significance", split, "high_bleu")
    parts = [text]
    if by_verdict[WORSE]:
        sizes = ", ".join(
            f"{n} by {delta[n]:.1f} BLEU (95% CI {low[n]:.1f} to {high[n]:.1f})"
            for n in by_verdict[WORSE]
        )
        parts.append(
            "Found behind it, on BLEU and chrF, beyond the noise of training seeds and test "
            f"sentences after Holm's correction (p < {ALPHA}): {sizes}. "
        )
    for said, words in (
        (ONLY_BLEU, "behind on BLEU only, so not a finding"),
        (ONLY_CHRF, "behind on chrF only, so not a finding"),
        (OPPOSITE, "BLEU and chrF significant in opposite directions"),
        (ONE_SEED, "one training seed, so not tested (a test needs two seeds a side)"),
        (UNINFORMATIVE, "below the quality floor, so not compared"),
    ):
        if by_verdict[said]:
            parts.append(f"{_names(by_verdict[said])}: {words}. ")
    if not by_verdict[WORSE]:
        parts.append("No encoding is found behind it beyond the noise of seeds and sentences. ")
    elif by_verdict[NOISE]:
        parts.append("The rest are within noise of it. ")
    return "".join(parts)


#: runs whose step counts differ by more than this factor are not compared at equal training
UNEQUAL_STEPS = 1.05


def reading(rows: Sequence[Mapping[str, Any]], splits: Sequence[str]) -> str:
    """The reading paragraph of a report with ``rows``, over ``splits`` (focus first)."""
    parts = [text for split in splits if (text := split_reading(rows, split))]
    if not parts:
        return (
            "Fewer than two encodings have scored hypotheses: no scores to compare yet (the "
            "learning curves compare validation loss, at equal steps in the table under them)."
        )
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
    runs = [r for r in rows if r["section"] == "runs"]
    done = {r["run"] for r in runs if r["metric"] == "status" and r["value"] == "done"}
    steps = [_number(r["value"]) for r in runs if r["metric"] == "steps" and r["run"] in done]
    if steps and max(steps) > UNEQUAL_STEPS * min(steps):
        parts.append(
            f"The runs were trained for different numbers of steps ({min(steps):,.0f} to "
            f"{max(steps):,.0f}; a time budget ends each where its speed took it): these scores "
            "say how far each run got, not how the encodings compare at equal training, which "
            "the learning curves' table at equal steps shows. "
        )
    if seeds and min(seeds) == max(seeds):
        n_seeds = "one seed" if seeds[0] == 1 else f"{seeds[0]} seeds"
    else:
        n_seeds = "a varying number of seeds"
    trust = (
        f"How far to trust this: {n_seeds} per encoding {budget}. "
        + (
            "With one seed nothing can be a finding: a test needs two training seeds a side, "
            "and a finding must stand beyond the noise of seeds and test sentences alike; "
            if not seeds or max(seeds) < 2
            else "A finding stands beyond the noise of training seeds and test sentences alike; "
        )
        + "and a ranking this early says which encoding learns fastest, not which is best when "
        "trained to convergence."
    )
    return "".join(parts) + trust

"""The report's numbers: means over seeds, the ranking of systems, sacreBLEU's paired bootstrap,
length buckets and limits, and cost (learning curves: :mod:`.curves`). Numbers only: no markdown,
no figures."""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from posenc.analysis.report.runs import Entry, Group, Run
from posenc.config import LENGTH_LIMITS
from posenc.config.metrics import METRICS
from posenc.runtime import untrusted

#: the note of a system whose output equals the baseline's (its p-value is 1 by definition)

#: a mean over seeds: (mean, sample standard deviation, number of values)
Stats = tuple[float, float, int]

#: the scores drawn as bars, every metric of :mod:`posenc.config.metrics`: (metric in
#: metrics.json, label, decimals, scale). A metric is shown on its declared scale (BERTScore F1
#: x100, on BLEU's 0-100) wherever the report shows it; ``report.csv`` keeps metrics.json's value
BAR_SCORES = tuple((m.name, m.shown_label, 2, m.scale) for m in METRICS)
#: the scores of the tables: the metrics and the loss
SCORES = (*BAR_SCORES, ("loss", "loss", 4, 1.0))


def finite(values: Iterable[Any]) -> list[float]:
    """The finite numbers among ``values`` as floats (None, NaN, booleans and text dropped)."""
    return [
        float(v)
        for v in values
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ]


def mean_std(values: Iterable[Any]) -> Stats | None:
    """Mean, sample standard deviation (0 for one value) and count, or None without values."""
    vals = finite(values)
    if not vals:
        return None
    return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0, len(vals)


def system_order(systems: dict[str, list[Entry]]) -> list[str]:
    """The systems' names by mean BLEU, best first (systems without BLEU last, ties by name)."""

    def key(name: str) -> tuple[float, str]:
        stats = mean_std(e.scores.get("bleu") for e in systems[name])
        return (-stats[0] if stats else math.inf, name)

    return sorted(systems, key=key)


def seed_list(entries: Sequence[Entry]) -> str:
    """The training seeds of ``entries``' runs, sorted (``0, 1, 2``): the ``seeds`` column of
    the score and significance tables."""
    return ", ".join(str(s) for s in sorted(e.run.seed for e in entries)) or "—"


def bar_values(entries: Sequence[Entry], metric: str, scale: float) -> list[float]:
    """The finite values of ``metric`` of ``entries`` (one per seed), times ``scale``."""
    return [v * scale for v in finite(e.scores.get(metric) for e in entries)]


def error_bar(values: Sequence[float]) -> float | None:
    """The sample standard deviation of a bar's seeds; None (no error bar) for one seed."""
    return statistics.stdev(values) if len(values) > 1 else None


def score_limits(splits: Iterable[dict[str, list[Entry]]]) -> dict[str, tuple[float, float]]:
    """One y range per bar score (:data:`BAR_SCORES`) for the score figures of every split:
    from 0 (or the lowest value below it) to 8% above the highest seed or mean + std of any
    system on any split."""
    splits, limits = list(splits), {}
    for metric, _, _, scale in BAR_SCORES:
        points = [0.0]
        for systems in splits:
            for entries in systems.values():
                values = bar_values(entries, metric, scale)
                if values:
                    points += [*values, statistics.fmean(values) + (error_bar(values) or 0.0)]
        low, high = min(points), max(points)
        span = (high - low) or 1.0
        limits[metric] = (low - 0.08 * span if low < 0 else 0.0, high + 0.08 * span)
    return limits


# ---------------------------------------------------------------- hypotheses and references


#: the largest hypothesis or reference file read (newstest2014's references are 0.4 MB)
MAX_TEXT_BYTES = 100_000_000


def read_lines(path: Path) -> list[str] | None:
    """The lines of a hypothesis/reference file (empty lines kept), or None if it is missing or
    cannot be read as one (a FIFO, a device, too large, not UTF-8: a warning names it, and the
    run's comparisons on that split are left out, not the report)."""
    if not path.exists():
        return None
    try:
        text = untrusted.read_text(path, MAX_TEXT_BYTES)
    except untrusted.UntrustedFileError as err:
        logging.getLogger(__name__).warning("%s (left out of the comparisons)", err)
        return None
    return (text[:-1] if text.endswith("\n") else text).split("\n")


def seed_texts(entries: Sequence[Entry]) -> dict[int, tuple[list[str], list[str]]]:
    """Per seed (first run of a seed), ``(hypotheses, references)`` whose lengths agree; seeds
    without both files are left out."""
    texts: dict[int, tuple[list[str], list[str]]] = {}
    for entry in entries:
        hyps, refs = read_lines(entry.hypotheses), read_lines(entry.references)
        if hyps and refs and len(hyps) == len(refs) and entry.run.seed not in texts:
            texts[entry.run.seed] = (hyps, refs)
    return texts


# ---------------------------------------------------------------- length buckets


def bucket_label(low: int, high: int) -> str:
    """A length bucket ``[low, high)`` as its first and last length, ``"20–29"``."""
    return f"{low}–{high - 1}"


def bucket_values(
    systems: dict[str, list[Entry]],
) -> tuple[list[tuple[int, int]], dict[tuple[int, int], int], dict[str, dict[str, list]]]:
    """The buckets ``(min, max)`` sorted, sentences per bucket, and per system
    ``{"bleu": [...], "loss": [...], "bleu_sd": [...], "loss_sd": [...]}``: the mean over seeds
    per bucket and the seeds' standard deviation (None where no seed has sentences there; the
    deviation None with one seed)."""
    buckets: dict[tuple[int, int], int] = {}
    for entries in systems.values():
        for entry in entries:
            for b in entry.scores.get("buckets") or []:
                key = (b["min"], b["max"])
                buckets[key] = max(buckets.get(key, 0), int(b.get("sentences") or 0))
    edges = sorted(buckets)
    values: dict[str, dict[str, list]] = {}
    for name, entries in systems.items():
        rows = [b for e in entries for b in e.scores.get("buckets") or []]
        values[name] = {}
        for metric in ("bleu", "loss"):
            means = [
                mean_std(b.get(metric) for b in rows if (b["min"], b["max"]) == edge)
                for edge in edges
            ]
            values[name][metric] = [None if m is None else m[0] for m in means]
            values[name][f"{metric}_sd"] = [None if m is None or m[2] < 2 else m[1] for m in means]
    return edges, buckets, values


def length_limits(runs: Sequence[Run]) -> list[tuple[str, float, str]]:
    """The training length limits the runs' configs set: ``(key, value, unit)`` for every key of
    :data:`posenc.config.LENGTH_LIMITS` a config gives a finite value (each pair once)."""
    limits: dict[tuple[str, float], str] = {}
    for run in runs:
        for key, unit in LENGTH_LIMITS.items():
            value = run.config.get(key)
            if finite([value]):
                limits.setdefault((key, float(value)), unit)
    return [(key, value, unit) for (key, value), unit in limits.items()]


def bucket_position(value: float, edges: Sequence[tuple[int, int]]) -> float | None:
    """Where ``value`` falls on the categorical bucket axis (bucket i spans i-0.5..i+0.5), or
    None outside the buckets."""
    for i, (low, high) in enumerate(edges):
        if low <= value < high:
            return i - 0.5 + (value - low) / (high - low)
    return None


#: the units of ``posenc.config.LENGTH_LIMITS`` that convert to the length buckets' axis (source
#: length in tokens, EOS included), with the tokens to add; the others (words, symbols) do not
#: convert and are not drawn on that axis
AXIS_OFFSET = {"tokens incl. EOS": 0, "source tokens": 1}


def limit_on_axis(value: float, unit: str) -> float | None:
    """The first source length on the buckets' axis (tokens incl. EOS) that a training limit of
    ``value`` in ``unit`` excludes (a line drawn there separates the longest trained source from
    the next), or None when ``unit`` does not convert to tokens."""
    offset = AXIS_OFFSET.get(unit)
    return None if offset is None else value + offset + 1


# ---------------------------------------------------------------- cost


#: the cost metrics: CSV name -> column label (``{focus}`` is the focus split)
COST_METRICS = {
    "train_tokens_per_s": "train tokens/s",
    "own_memory_mb": "own memory MB",
    "peak_memory_mb": "peak memory MB",
    "decode_tokens_per_s": "decode tokens/s ({focus})",
    "parameters": "parameters",
    "train_seconds": "train s",
}


def cost_values(group: Group, focus: str) -> dict[str, Stats | None]:
    """Per metric of :data:`COST_METRICS`, the mean over seeds of training speed, own and peak
    memory, decoding speed on ``focus``, parameters and training time."""
    runs = group.runs
    return {
        "train_tokens_per_s": mean_std(r.train.get("train_tokens_per_s") for r in runs),
        "own_memory_mb": mean_std(r.train.get("own_memory_mb") for r in runs),
        "peak_memory_mb": mean_std(r.train.get("peak_memory_mb") for r in runs),
        "decode_tokens_per_s": mean_std(
            r.metrics.get("splits", {}).get(focus, {}).get("decode_tokens_per_s") for r in runs
        ),
        "parameters": mean_std(r.train.get("parameters") for r in runs),
        "train_seconds": mean_std(r.train.get("train_seconds") for r in runs),
    }

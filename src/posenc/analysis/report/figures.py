"""The report's figures: validation loss curves, scores per system, scores per length bucket
(with the training length limits), and attention maps drawn from ``attention.npz``."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc.analysis.report.render import Writer, new_figure, slug
from posenc.analysis.report.runs import Entry, Group
from posenc.analysis.report.stats import (
    aggregate_curves,
    bucket_position,
    common_grid,
    finite,
    system_order,
)


def plot_curves(
    w: Writer, groups: Sequence[Group], kind: str, colours: dict[str, Any], xlabel: str
) -> None:
    """``valid_loss_vs_KIND.png`` (``kind``: ``steps`` or ``time``): one line per encoding (mean
    over seeds), min–max band."""
    fig, (ax,) = new_figure(7.5, 4.5)
    for group in groups:
        curves = [r.curves[kind] for r in group.runs if kind in r.curves]
        if not curves:
            continue
        agg = aggregate_curves(curves, common_grid(curves))
        colour = colours[group.label]
        ax.plot(
            agg["x"],
            agg["mean"],
            color=colour,
            marker="." if len(agg["x"]) < 30 else None,
            label=f"{group.label} (n={len(curves)})",
        )
        if len(curves) > 1:
            ax.fill_between(agg["x"], agg["min"], agg["max"], color=colour, alpha=0.2, lw=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("validation loss (token NLL)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7, ncol=2)
    w.figure(fig, f"valid_loss_vs_{kind}.png", f"validation loss vs {kind}")


def plot_scores(
    w: Writer, split: str, systems: dict[str, list[Entry]], colours: dict[str, Any]
) -> None:
    """``scores_SPLIT.png``: BLEU, chrF and BERTScore F1 (x100) per system, bars = mean,
    error bars = std over seeds, dots = seeds."""
    order = system_order(systems)
    metrics = [
        ("bleu", "BLEU", 1.0),
        ("chrf", "chrF", 1.0),
        ("bertscore_f1", "BERTScore F1 x100", 100.0),
    ]
    metrics = [
        m for m in metrics if any(finite(e.scores.get(m[0]) for e in systems[s]) for s in order)
    ]
    fig, axes = new_figure(3.2 * max(len(metrics), 1) + 1, 4.0, max(len(metrics), 1))
    for ax, (metric, label, scale) in zip(axes, metrics, strict=False):
        for i, name in enumerate(order):
            values = [v * scale for v in finite(e.scores.get(metric) for e in systems[name])]
            if not values:
                continue
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            ax.bar(
                i,
                statistics.fmean(values),
                yerr=std,
                color=colours.get(name, "grey"),
                capsize=3,
                alpha=0.85,
            )
            ax.plot([i] * len(values), values, "k.", markersize=4)
        ax.set_xticks(range(len(order)), order, rotation=60, ha="right", fontsize=7)
        ax.set_title(label, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    w.figure(fig, f"scores_{slug(split)}.png", f"scores on {split}")


def plot_buckets(
    w: Writer,
    split: str,
    edges: list[tuple[int, int]],
    values: dict[str, dict[str, list]],
    limits: list[tuple[str, float, str]],
    colours: dict[str, Any],
) -> None:
    """``buckets_SPLIT.png``: BLEU and loss by source-length bucket (``values``: per system
    ``{"bleu": [...], "loss": [...]}`` aligned with ``edges``), one line per system, the
    training length limits ``(key, value, unit)`` as vertical lines."""
    fig, axes = new_figure(11, 4.2, 2)
    x = np.arange(len(edges))
    styles = iter(["--", ":", "-.", (0, (5, 1)), (0, (1, 3))])
    for ax, metric in zip(axes, ("bleu", "loss"), strict=True):
        for name, per in values.items():
            y = np.array([np.nan if v is None else v for v in per[metric]], dtype=float)
            ax.plot(x, y, marker="o", color=colours.get(name, "grey"), label=name)
        ax.set_xticks(x, [f"{lo}–{hi - 1}" for lo, hi in edges], rotation=45, fontsize=7)
        ax.set_xlabel("source length (tokens incl. EOS)")
        ax.set_ylabel("BLEU" if metric == "bleu" else "loss (token NLL)")
        ax.grid(alpha=0.3)
    for key, value, unit in limits:
        position = bucket_position(value, edges)
        if position is not None:
            style = next(styles, "--")
            for ax in axes:
                ax.axvline(
                    position,
                    color="black",
                    ls=style,
                    lw=1,
                    label=f"{key}={value:g} ({unit})" if ax is axes[0] else None,
                )
    axes[0].legend(fontsize=7)
    w.figure(fig, f"buckets_{slug(split)}.png", f"BLEU and loss by source length on {split}")


def render_attention(npz: Path, title: str, target: Path) -> None:
    """Draw the arrays of an ``attention.npz`` (``(H, Lq, Lk)`` per site; leading axes beyond
    three take their first element, a 2-D map is one head) as the PNG ``target``.

    Raises:
        ValueError: the file holds no arrays, or one that is not 2-D or more.
    """
    from posenc.evaluation.attention_maps import plot_attention

    with np.load(npz) as data:
        maps = {}
        for key in data.files:
            array = np.asarray(data[key], dtype=float)
            while array.ndim > 3:
                array = array[0]
            maps[key] = array.reshape((1, *array.shape)) if array.ndim == 2 else array
    if not maps or any(a.ndim != 3 for a in maps.values()):
        raise ValueError("expected arrays (H, Lq, Lk)")
    plot_attention(maps, title, target)

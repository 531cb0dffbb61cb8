"""The report's figures: learning curves, scores per system, scores per length bucket (with the
training length limits) and attention maps drawn from ``attention.npz``. Each function saves its
figure through the :class:`~.render.Writer` and returns it, so the data drawn can be checked."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from posenc.analysis.report.curves import aggregate_curves, smoothing_span, tails, trailing_mean
from posenc.analysis.report.render import GREY, Writer, new_figure, outside_legend, slug
from posenc.analysis.report.runs import Curve, Entry, Group
from posenc.analysis.report.stats import (
    BAR_SCORES,
    bar_values,
    bucket_label,
    bucket_position,
    error_bar,
    limit_on_axis,
    system_order,
)
from posenc.config.metrics import JUDGED_METRICS
from posenc.config.metrics import metric as declared

#: the panels of a learning-curve figure: (curve key prefix, y label)
CURVE_PANELS = (
    ("", "validation loss (token NLL)"),
    ("train_", "training loss (objective, trailing mean)"),
)
#: the most encodings one learning-curve panel draws; more go to further rows
MAX_PER_PANEL = 8
#: the line styles of the length limits, in the order the configs name them
LIMIT_STYLES = ("--", ":", "-.", (0, (5, 1)), (0, (1, 3)))


# ---------------------------------------------------------------- learning curves


def _draw_group(ax: Any, label: str, curves: Sequence[Curve], style: dict[str, Any]) -> None:
    """One encoding on ``ax``: the mean over its seeds where all have data, the min–max band
    there (several seeds), and thin lines for what a seed logged outside that range."""
    agg = aggregate_curves(curves)
    points = len(agg["x"])
    legend = f"{label} (n={len(curves)})"
    if points:
        ax.plot(
            agg["x"],
            agg["mean"],
            color=style["color"],
            linestyle=style["linestyle"],
            marker=style["marker"],
            markevery=None if points < 30 else max(1, points // 8),
            markersize=4,
            label=legend,
        )
        if len(curves) > 1:
            ax.fill_between(
                agg["x"], agg["min"], agg["max"], color=style["color"], alpha=0.15, lw=0
            )
    for i, (x, y) in enumerate(tails(curves)):
        ax.plot(
            x,
            y,
            color=style["color"],
            linestyle=style["linestyle"],
            lw=1.0,
            alpha=0.6,
            label=legend if not points and i == 0 else None,
        )


def panel_groups(groups: Sequence[Group], most: int = MAX_PER_PANEL) -> list[list[Group]]:
    """``groups`` in order, cut into the fewest rows of at most ``most``, as even as they go."""
    rows = max(1, math.ceil(len(groups) / most))
    size, longer = divmod(len(groups), rows)  # the first ``longer`` rows take one more
    cuts = np.cumsum([0] + [size + (row < longer) for row in range(rows)])
    return [list(groups[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def plot_curves(
    w: Writer, groups: Sequence[Group], kind: str, styles: dict[str, Any], xlabel: str
) -> Figure:
    """``valid_loss_vs_KIND.png`` (``kind``: ``steps`` or ``time``): the validation loss (left)
    and the training loss (right) of each encoding against ``kind`` (see :func:`_draw_group`),
    at most :data:`MAX_PER_PANEL` encodings a panel: more go to further rows in the report's
    order, every row on the same axes. The training loss is each run's trailing mean over one
    span for every run of the figure (:func:`smoothing_span`), so a run that validated once
    still shows how it learned. Axes in row order: ``fig.axes[2 * row + column]``."""
    rows = panel_groups(groups)
    fig = Figure(figsize=(12, 4.5 if len(rows) == 1 else 3.4 * len(rows)), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(len(rows), 2, squeeze=False, sharex="col", sharey="col")
    for column, (prefix, ylabel) in enumerate(CURVE_PANELS):
        key = prefix + kind
        logged = {g.label: [r.curves[key] for r in g.runs if key in r.curves] for g in groups}
        span = smoothing_span([curve for curves in logged.values() for curve in curves])
        for row, chunk in enumerate(rows):
            ax = grid[row][column]
            for group in chunk:
                curves = logged[group.label]
                if prefix:
                    curves = [trailing_mean(c, span) for c in curves]
                if curves:
                    _draw_group(ax, group.label, curves, styles.get(group.label, GREY))
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if row == len(rows) - 1:
                ax.set_xlabel(xlabel)
            if not ax.lines:
                ax.text(0.5, 0.5, "nothing logged", transform=ax.transAxes, ha="center")
    if len(rows) == 1:
        outside_legend(fig, max(grid[0], key=lambda ax: len(ax.get_legend_handles_labels()[1])))
    else:
        for row in grid:
            labelled = max(row, key=lambda ax: len(ax.get_legend_handles_labels()[1]))
            labelled.legend(fontsize=7, loc="upper right")
    w.figure(fig, f"valid_loss_vs_{kind}.png", f"validation and training loss vs {kind}")
    return fig


# ---------------------------------------------------------------- scores


#: bar hatches for a colour that an earlier bar of the same figure already used (the palette's
#: colours repeat past its length; hatches tell those bars apart)
HATCHES = ("", "//", "..", "xx", "\\\\")


def plot_scores(
    w: Writer,
    split: str,
    systems: dict[str, list[Entry]],
    styles: dict[str, Any],
    limits: dict[str, tuple[float, float]],
) -> Figure:
    """``scores_SPLIT.png``: BLEU, chrF and BERTScore F1 x100 per system (:data:`BAR_SCORES`),
    one horizontal bar a system in rank order (the best on top, names readable however many),
    bar = mean, error bar = sample std over seeds (none for one seed), dots = seeds; a bar
    whose colour an earlier bar has is hatched. Each score's x range is ``limits[metric]``,
    the same on every split; the title names the split and its sentences."""
    order = system_order(systems)
    metrics = [m for m in BAR_SCORES if any(bar_values(systems[s], m[0], 1.0) for s in order)]
    panels = max(len(metrics), 1)
    fig, axes = new_figure(3.2 * panels + 2.5, 1.4 + 0.28 * max(len(order), 3), panels)
    seen: dict[Any, int] = {}
    hatches = {}
    for name in order:
        colour = styles.get(name, GREY)["color"]
        hatches[name] = HATCHES[seen.get(colour, 0) % len(HATCHES)]
        seen[colour] = seen.get(colour, 0) + 1
    for panel, (ax, (metric, label, _, scale)) in enumerate(zip(axes, metrics, strict=False)):
        for i, name in enumerate(order):
            values = bar_values(systems[name], metric, scale)
            if not values:
                continue
            ax.barh(
                i,
                statistics.fmean(values),
                xerr=error_bar(values),
                color=styles.get(name, GREY)["color"],
                hatch=hatches[name],
                edgecolor="white" if hatches[name] else None,
                capsize=3,
                alpha=0.85,
            )
            ax.plot(values, [i] * len(values), "k.", markersize=4)
        ax.set_yticks(range(len(order)), order if panel == 0 else [], fontsize=7)
        ax.set_ylim(len(order) - 0.5, -0.5)  # the best on top
        ax.set_title(label, fontsize=9)
        ax.set_xlabel(label)
        ax.set_xlim(*limits.get(metric, (0.0, None)))
        ax.grid(axis="x", alpha=0.3)
    sentences = {e.scores.get("sentences") for entries in systems.values() for e in entries}
    counted = ""
    if len(sentences) == 1 and isinstance(only := next(iter(sentences)), int):
        counted = f", {only:,} sentences"
    fig.suptitle(
        f"{split}{counted}\nbars: mean over seeds; dots: seeds; error bars: seed sd\n"
        "(95% bootstrap intervals over sentences: the significance section's figure)",
        fontsize=8,
    )
    w.figure(fig, f"scores_{slug(split)}.png", f"scores on {split}")
    return fig


def plot_intervals(
    w: Writer,
    split: str,
    baseline: str,
    differences: dict[str, dict[str, tuple[float, float, float]]],
    styles: dict[str, Any],
) -> Figure:
    """``intervals_SPLIT.png``: each system's difference from ``baseline`` with its 95%
    interval (``differences``: system -> ``{"bleu"|"chrf": (difference, low, high)}``, the
    system minus the baseline, systems in rank order, the first on top), one panel per metric,
    a line at no difference: an interval clear of it is a difference beyond the seeds' and
    sentences' noise (before the family's correction)."""
    metrics = [
        (m, label)
        for m, label in ((name, declared(name).label) for name in JUDGED_METRICS)
        if any(m in per for per in differences.values())
    ]
    names = list(differences)
    fig, axes = new_figure(10, 0.8 + 0.28 * max(len(names), 3), max(len(metrics), 1))
    for panel, (ax, (metric, label)) in enumerate(zip(axes, metrics, strict=False)):
        for i, name in enumerate(names):
            if metric not in differences[name]:
                continue
            value, low, high = differences[name][metric]
            style = styles.get(name, GREY)
            ax.errorbar(
                value,
                i,
                xerr=[[value - low], [high - value]],
                fmt=style["marker"],
                color=style["color"],
                capsize=3,
            )
        ax.axvline(0.0, color="black", linewidth=0.8)
        # the same rows in every panel: named once, on the left, leaving the others their width
        ax.set_yticks(range(len(names)), names if panel == 0 else [], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(f"{label}: system minus {baseline}", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(
        f"{split}: each system minus the baseline, {baseline}, with its 95% interval (seeds and "
        "test sentences as noise)",
        fontsize=9,
    )
    w.figure(fig, f"intervals_{slug(split)}.png", f"differences from the baseline on {split}")
    return fig


# ---------------------------------------------------------------- length buckets


def limit_lines(
    limits: Sequence[tuple[str, float, str]], edges: Sequence[tuple[int, int]]
) -> list[tuple[str, float]]:
    """The length limits drawn on the bucket axis: ``(legend label, position)`` for each limit
    whose unit converts to tokens (:func:`~.stats.limit_on_axis`) and that falls inside the
    buckets; the line separates the longest trained source from the next."""
    lines = []
    for key, value, unit in limits:
        first = limit_on_axis(value, unit)
        position = None if first is None else bucket_position(first, edges)
        if position is not None:
            label = f"{key}={value:g}\n({unit}: trained sources ≤ {first - 1:g} incl. EOS)"
            lines.append((label, position))
    return lines


def plot_buckets(
    w: Writer,
    split: str,
    edges: list[tuple[int, int]],
    sentences: list[int],
    values: dict[str, dict[str, list]],
    limits: list[tuple[str, float, str]],
    styles: dict[str, Any],
) -> Figure:
    """``buckets_SPLIT.png``: BLEU and loss by source-length bucket (``values``: per system
    ``{"bleu": [...], "loss": [...]}`` aligned with ``edges``, ``sentences`` per bucket), one
    line per system in its own colour, marker and line style, the legend outside; each tick
    says how many sentences its bucket holds and markers grow with it (a bucket of one sentence
    is a small dot, not a point as solid as one of 400); the training length limits
    ``(key, value, unit)`` that convert to the axis' tokens as black vertical lines
    (:func:`limit_lines`)."""
    fig, axes = new_figure(13, 4.6, 2)
    x = np.arange(len(edges))
    sizes = 2.0 + 8.0 * np.sqrt(np.asarray(sentences, dtype=float) / max(max(sentences), 1))
    ticks = [f"{bucket_label(*edge)}\nn={n}" for edge, n in zip(edges, sentences, strict=True)]
    for ax, metric in zip(axes, ("bleu", "loss"), strict=True):
        for name, per in values.items():
            y = np.array([np.nan if v is None else v for v in per[metric]], dtype=float)
            style = styles.get(name, GREY)
            ax.plot(x, y, lw=1.3, markersize=3, label=name, **style)
            ax.scatter(x, y, s=sizes**2, color=style["color"], marker=style["marker"], zorder=3)
        ax.set_xticks(x, ticks, fontsize=7)
        ax.set_xlabel("source length (tokens incl. EOS); n = sentences in the bucket")
        ax.set_ylabel("BLEU" if metric == "bleu" else "loss (token NLL)")
        ax.grid(alpha=0.3)
    for (label, position), style in zip(limit_lines(limits, edges), LIMIT_STYLES, strict=False):
        for ax in axes:
            ax.axvline(
                position, color="black", ls=style, lw=1, label=label if ax is axes[0] else None
            )
    outside_legend(fig, axes[0])
    fig.suptitle(f"{split}: BLEU and loss by source length, mean over seeds", fontsize=9)
    w.figure(fig, f"buckets_{slug(split)}.png", f"BLEU and loss by source length on {split}")
    return fig


# ---------------------------------------------------------------- attention maps


#: the most bytes an ``attention.npz`` of a run directory may unpack to (a layer-0 example map
#: is far smaller; a compressed file can claim gigabytes)
MAX_ATTENTION_BYTES = 64 * 2**20


def render_attention(npz: Path, title: str, target: Path) -> None:
    """Draw an ``attention.npz`` as the PNG ``target``: its maps (``(H, Lq, Lk)`` per site;
    leading axes beyond three take their first element, a 2-D map is one head) with the
    tokens it holds on the axes (positions when it holds none) and a colour bar per site.

    Raises:
        ValueError: the file holds no maps, one that is not 2-D or more, or unpacks to more than
            :data:`MAX_ATTENTION_BYTES`.
    """
    from posenc.evaluation.attention_maps import TOKEN_KEYS, plot_attention

    with np.load(npz) as data:  # arrays only: a pickled object in it is refused
        unpacked = sum(info.file_size for info in data.zip.infolist())
        if unpacked > MAX_ATTENTION_BYTES:
            raise ValueError(f"it unpacks to {unpacked:,} bytes (at most {MAX_ATTENTION_BYTES:,})")
        maps = {}
        for key in data.files:
            if key in TOKEN_KEYS:
                maps[key] = np.asarray(data[key]).astype(str)
                continue
            array = np.asarray(data[key], dtype=float)
            while array.ndim > 3:
                array = array[0]
            maps[key] = array.reshape((1, *array.shape)) if array.ndim == 2 else array
    sites = [a for k, a in maps.items() if k not in TOKEN_KEYS]
    if not sites or any(a.ndim != 3 for a in sites):
        raise ValueError("expected arrays (H, Lq, Lk)")
    plot_attention(maps, title, target)

"""The study's headline: each system's difference from a baseline with its interval, by split
and by model depth, from several sweeps at once (``scripts/headline.py``).

Every difference is the decision rule's (:mod:`posenc.analysis.decision`: the seeds' spread and
the resampled test sentences as noise), all of them one family corrected with Holm's method
(:mod:`posenc.analysis.report.findings`); the table gives the difference and its 95% interval
in the metric's points, with the verdict, and the figure draws them as small multiples: one
panel per split, the systems down the side, one marker per depth, at most
:data:`MAX_SYSTEMS` systems a figure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from posenc.analysis.report.findings import (
    WORSE,
    Judgement,
    StatisticsCache,
    judge_family,
    judge_pair,
)
from posenc.analysis.report.render import new_figure
from posenc.analysis.report.runs import Entry

#: the most systems one figure draws (more would not be read)
MAX_SYSTEMS = 8
#: each depth's marker, in the order the sweeps are given
MARKERS = ("o", "s", "D", "^", "v")
#: how the metrics are spelled on the axes
LABELS = {"bleu": "BLEU", "chrf": "chrF"}

Systems = Mapping[str, Sequence[Entry]]
"""A split's systems: name -> entries (one per run)."""


@dataclass
class Cell:
    """One system at one depth on one split: its judgement against the baseline (the system
    minus the baseline; None when either is missing or they cannot be compared)."""

    depth: str
    split: str
    system: str
    judgement: Judgement | None

    def verdict(self) -> str:
        """``ahead``/``behind`` for a finding, else the rule it failed (``-`` when missing)."""
        if self.judgement is None:
            return "-"
        if self.judgement.verdict != WORSE:
            return self.judgement.verdict
        return "ahead" if self.judgement.first_leads else "behind"


def headline(
    sweeps: Mapping[str, Mapping[str, Systems]],
    systems: Sequence[str],
    baseline: str,
    samples: int = 1000,
) -> list[Cell]:
    """Every system of ``systems`` against ``baseline`` in every sweep (``depth label ->
    split -> systems``) and split, judged as one family."""
    cache = StatisticsCache()
    cells = []
    for depth, splits in sweeps.items():
        for split, found in splits.items():
            for system in systems:
                judgement = None
                if system in found and baseline in found:
                    judgement = judge_pair(found[system], found[baseline], samples, cache)
                cells.append(Cell(depth, split, system, judgement))
    judge_family([c.judgement for c in cells if c.judgement is not None])
    return cells


def headline_table(cells: Sequence[Cell], metric: str, baseline: str) -> list[str]:
    """Markdown: one row per system, one column per depth and split: the difference from
    ``baseline`` in ``metric`` with its interval and the verdict."""
    columns = list(dict.fromkeys((c.depth, c.split) for c in cells))
    systems = list(dict.fromkeys(c.system for c in cells))
    at = {(c.depth, c.split, c.system): c for c in cells}
    lines = [
        "| system | " + " | ".join(f"{depth}, {split}" for depth, split in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for system in systems:
        row = []
        for depth, split in columns:
            cell = at.get((depth, split, system))
            judged = cell.judgement if cell else None
            if judged is None:
                row.append("-")
                continue
            row.append(f"{judged.comparisons[metric].text()} {cell.verdict()}")
        lines.append(f"| {system} | " + " | ".join(row) + " |")
    lines += [
        "",
        f"Each cell: the system's mean {LABELS.get(metric, metric)} over its seeds minus "
        f"{baseline}'s, its 95% "
        "interval (seeds and resampled test sentences as noise) and the verdict, every cell of "
        "every metric one family under Holm's correction.",
    ]
    return lines


def plot_headline(cells: Sequence[Cell], metric: str, baseline: str, path: Path) -> Path:
    """The small multiples of :func:`headline_table` for ``metric`` saved as ``path`` (PNG).

    Raises:
        ValueError: more than :data:`MAX_SYSTEMS` systems (draw them in several figures).
    """
    splits = list(dict.fromkeys(c.split for c in cells))
    depths = list(dict.fromkeys(c.depth for c in cells))
    systems = list(dict.fromkeys(c.system for c in cells))
    if len(systems) > MAX_SYSTEMS:
        raise ValueError(
            f"{len(systems)} systems in one figure; draw at most {MAX_SYSTEMS} a figure"
        )
    width = max(7.0, 3.2 * len(splits) + 1.5)
    fig, axes = new_figure(width, 1.2 + 0.4 * len(systems), len(splits))
    offsets = {d: (i - (len(depths) - 1) / 2) * 0.18 for i, d in enumerate(depths)}
    for panel, (ax, split) in enumerate(zip(axes, splits, strict=True)):
        for cell in cells:
            if cell.split != split or cell.judgement is None:
                continue
            c = cell.judgement.comparisons[metric]
            y = systems.index(cell.system) + offsets[cell.depth]
            marker = MARKERS[depths.index(cell.depth) % len(MARKERS)]
            filled = cell.verdict() in ("ahead", "behind")
            xerr = None if c.low is None else [[c.difference - c.low], [c.high - c.difference]]
            ax.errorbar(
                c.difference,
                y,
                xerr=xerr,
                fmt=marker,
                color=f"C{depths.index(cell.depth)}",
                mfc=None if filled else "white",
                capsize=2,
                label=cell.depth if panel == 0 and cell.system == systems[0] else None,
            )
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(systems)), systems if panel == 0 else [], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(split, fontsize=9)
        ax.set_xlabel(f"{LABELS.get(metric, metric)} minus {baseline}")
        ax.grid(axis="x", alpha=0.3)
    if depths:
        fig.legend(fontsize=7, loc="outside lower center", ncols=len(depths))
    fig.suptitle(
        f"Against {baseline}: 95% intervals (seeds and sentences as noise); filled: a finding",
        fontsize=9,
    )
    fig.savefig(path, dpi=110)
    return path

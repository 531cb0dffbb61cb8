"""The study's headline: each system's difference from a baseline with its interval, by split
and by model depth, from several sweeps at once (``python -m study headline``).

Every difference is the decision rule's (:mod:`posenc.analysis.decision`: the seeds' spread and
the resampled test sentences as noise), each depth's BLEU-and-chrF cells one family corrected with
Holm's method and its validation losses another (:mod:`posenc.analysis.report.findings`), as its
sweep's own report would: a depth added leaves the others' verdicts as they were; a plan's family
may join them (:func:`judge_headline`); the table gives the difference and its 95% interval
in the metric's points, with the verdict, and the figure draws them as small multiples: one
panel per split, the systems down the side, one marker per depth, at most
:data:`MAX_SYSTEMS` systems a figure."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posenc.analysis.decision import Comparison, compare_scores, loss_statistics
from posenc.analysis.markdown import system_table
from posenc.analysis.plan import HOLM_FACTORS, add_plan_arguments
from posenc.analysis.report.clean import entries_by_split
from posenc.analysis.report.findings import (
    ONE_SEED,
    SPLIT,
    UNINFORMATIVE,
    Judgement,
    Sentences,
    StatisticsCache,
    judge_family,
    judge_pair,
    judge_single_scores,
    judge_together,
    loss_noise,
    named_verdict,
    sentence_noise,
    single_score_verdict,
    tested_p,
)
from posenc.analysis.report.render import new_figure
from posenc.analysis.report.runs import (
    Entry,
    Group,
    ReportError,
    Run,
    group_runs,
    load_run,
)
from posenc.analysis.report.seeds import seed_selection
from posenc.config import reference_encoding
from posenc.config.metrics import METRICS as METRIC_TABLE
from posenc.runtime.figures import save_figure
from posenc.runtime.rundir import RunDir, find_run_dirs
from posenc.runtime.sentence_losses import read_losses

#: the most systems one figure draws (more would not be read)
MAX_SYSTEMS = 10
#: each depth's marker, in the order the sweeps are given
MARKERS = ("o", "s", "D", "^", "v")
#: how the metrics are spelled on the axes (the metric table's labels)
LABELS = {**{m.name: m.label for m in METRIC_TABLE}, "loss": "validation loss"}

Systems = Mapping[str, Sequence[Entry]]
"""A split's systems: name -> entries (one per run)."""
Losses = Mapping[str, Mapping[int, float]]
"""A sweep's validation losses: system -> {training seed: best validation loss}."""

#: a finding against the baseline, by the direction of the difference
FINDINGS = ("ahead", "behind")
#: verdicts of a comparison that was not tested
UNTESTED = ("-", ONE_SEED, SPLIT, UNINFORMATIVE)


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
        return named_verdict(self.judgement, "ahead", "behind")


@dataclass
class LossCell:
    """One system at one depth: its best validation loss minus the baseline's over the seeds
    (:func:`~posenc.analysis.decision.compare_scores`; ``sentences``: whether resampled
    validation sentences are a second noise); None when either side is missing. ``p_holm``
    after :func:`loss_headline`'s or :func:`judge_headline`'s correction."""

    depth: str
    system: str
    comparison: Comparison | None
    sentences: bool = False
    p_holm: float | None = None
    p_equivalence: float | None = None
    margin: float | None = None

    def verdict(self) -> str:
        """``ahead`` (lower loss) or ``behind`` for a finding, else why not."""
        return single_score_verdict(self, "ahead", "behind")


def add_comparison_arguments(parser: argparse.ArgumentParser, splits: str, out: str) -> None:
    """The arguments of a command that sets systems against a baseline: ``--systems``,
    ``--baseline``, ``--splits`` (default ``splits``), ``--bootstrap``, ``--seeds``, ``--out``
    (``out``: what it holds) and a plan's ``--plan``/``--family``."""
    parser.add_argument("--systems", required=True, help="comma-separated, as reports name them")
    parser.add_argument(
        "--baseline", default=reference_encoding(), help="default: the reference encoding"
    )
    parser.add_argument("--splits", default=splits)
    parser.add_argument("--bootstrap", type=int, default=1000, help="resampled test sets")
    parser.add_argument(
        "--seeds", type=seed_selection, help="only the runs of these seeds (1-4, 0,2)"
    )
    parser.add_argument("--out", type=Path, required=True, help=f"folder for {out}")
    add_plan_arguments(parser)


@dataclass
class SweepReading:
    """What :func:`read_sweep` reads of a sweep: its entries by split and its runs' groups."""

    entries: dict[str, Systems]  #: split -> systems
    groups: list[Group]

    def losses(self, step: int | None = None) -> Losses:
        """``system -> {seed: validation loss}``: the best, or the one each run's curve logged
        at ``step`` (a run that did not log it is left out)."""
        return {g.label: dict(validation_losses(g.runs, step)) for g in self.groups}

    def sentences(self) -> dict[str, Sentences]:
        """``system -> {seed: statistics}`` of the sentence losses the runs kept at their best
        validation loss (``valid_losses.tsv``; runs trained before they were kept have none)."""
        return {g.label: dict(kept_sentences(g.runs)) for g in self.groups}


def read_sweep(
    folder: Path,
    splits: Sequence[str],
    scratch: Path,
    seeds: frozenset[int] | None = None,
) -> SweepReading:
    """A sweep's runs (with ``seeds``, the runs of those training seeds alone) and its entries
    by split (``NAME-clean`` splits scored into ``scratch``).

    Raises:
        ReportError: the folder holds no run.
    """
    runs = [load_run(run, folder) for run in find_run_dirs(folder, folder / "report")]
    runs = [run for run in runs if seeds is None or run.seed in seeds]
    if not runs:
        raise ReportError(f"no run under {folder}" + (" of those seeds" if seeds else ""))
    groups = group_runs(runs)
    return SweepReading(entries_by_split(groups, splits, scratch), groups)


def kept_sentences(runs: Sequence[Run]) -> Iterator[tuple[int, np.ndarray]]:
    """``(seed, loss statistics)`` of each run whose ``valid_losses.tsv`` can be read (an
    unreadable one counts as missing)."""
    for run in runs:
        try:
            yield run.seed, loss_statistics(read_losses(RunDir(run.path).valid_losses))
        except (OSError, ValueError):
            continue


def validation_losses(runs: Sequence[Run], step: int | None) -> Iterator[tuple[int, float]]:
    """``(seed, validation loss)`` of each run that has it: the best, or the one logged at
    ``step``."""
    for run in runs:
        if step is None:
            if run.train.get("best_valid_loss") is not None:
                yield run.seed, float(run.train["best_valid_loss"])
            continue
        x, y = run.curves.get("steps", ((), ()))
        at = [value for s, value in zip(x, y, strict=True) if int(s) == step]
        if at:
            yield run.seed, float(at[-1])


def headline(
    sweeps: Mapping[str, Mapping[str, Systems]],
    systems: Sequence[str],
    baseline: str,
    samples: int = 1000,
    margins: Mapping[str, float] | None = None,
) -> list[Cell]:
    """Every system of ``systems`` against ``baseline`` in every sweep (``depth label ->
    split -> systems``) and split, each depth's cells (every split and metric) one family
    (:func:`judge_headline`); with a plan's ``margins`` (by metric) also tested for
    equivalence within them."""
    cache = StatisticsCache()
    cells = []
    for depth, splits in sweeps.items():
        for split, found in splits.items():
            for system in systems:
                judgement = None
                if system in found and baseline in found:
                    judgement = judge_pair(found[system], found[baseline], samples, cache)
                cells.append(Cell(depth, split, system, judgement))
    judge_headline(cells, [], margins)
    return cells


def loss_headline(
    losses: Mapping[str, Losses],
    systems: Sequence[str],
    baseline: str,
    margin: float | None = None,
    sentences: Mapping[str, Mapping[str, Sentences]] | None = None,
    samples: int = 1000,
) -> list[LossCell]:
    """Every system of ``systems`` against ``baseline`` on validation loss in every sweep
    (``depth label -> losses``), each depth's tested cells one family under Holm's
    correction; with a ``margin`` (nats) also tested for equivalence within it (two one-sided
    tests, Holm over the family). Where every run kept its validation sentences (``sentences``:
    depth label -> system -> seed -> statistics), their resampling adds its noise
    (:func:`~posenc.analysis.report.findings.loss_noise`); else the seeds are the only noise."""
    cells = []
    for depth, found in losses.items():
        kept = (sentences or {}).get(depth, {})
        for system in systems:
            comparison, noise = None, None
            if found.get(system) and found.get(baseline):
                sides = [
                    (sign, list(found[n]), kept.get(n))
                    for sign, n in ((1.0, system), (-1.0, baseline))
                ]
                noise = loss_noise(sides, samples)
                comparison = compare_scores(
                    found[system], found[baseline], sentence_se=noise or 0.0
                )
            cells.append(LossCell(depth, system, comparison, noise is not None))
    judge_headline([], cells, {"valid_loss": margin} if margin is not None else None)
    return cells


def judge_headline(
    cells: Sequence[Cell],
    losses: Sequence[LossCell],
    margins: Mapping[str, float] | None = None,
    within: Sequence[str] = HOLM_FACTORS,
) -> None:
    """Correct ``cells`` and ``losses`` with Holm's method split by the factors ``within``
    (:data:`~posenc.analysis.plan.HOLM_FACTORS`; a plan family's ``holm_within``): ``depth``,
    each depth apart; ``kind``, the BLEU-and-chrF cells apart from the validation losses
    (:func:`~posenc.analysis.report.findings.judge_together` where kinds are joined). The
    default, both, is what :func:`headline` and :func:`loss_headline` apply."""
    depths = [c.depth for c in cells] + [c.depth for c in losses]
    groups = dict.fromkeys(depths) if "depth" in within else [None]
    margin = (margins or {}).get("valid_loss")
    for depth in groups:
        judged = [
            c.judgement for c in cells if depth in (None, c.depth) and c.judgement is not None
        ]
        ones = [c for c in losses if depth in (None, c.depth)]
        if "kind" in within:
            judge_family(judged, margins)
            judge_single_scores(ones, margin)
        else:
            judge_together(judged, ones, margins)


def correction_note(
    cells: Sequence[Cell], losses: Sequence[LossCell], within: Sequence[str] = HOLM_FACTORS
) -> str:
    """The sentence a table ends with: how :func:`judge_headline` formed the families of
    ``cells`` and ``losses`` (split by the factors ``within``) and the tests each holds."""
    by_depth, by_kind = "depth" in within, "kind" in within
    depths = list(dict.fromkeys([c.depth for c in cells] + [c.depth for c in losses]))

    def sizes(depth: str | None) -> str:
        pairs = [c.judgement for c in cells if depth in (None, c.depth) and c.judgement]
        pair_tests = len(tested_p(pairs))
        loss_tests = sum(c.p_holm is not None for c in losses if depth in (None, c.depth))
        counts = f"{pair_tests} + {loss_tests}" if by_kind else f"{pair_tests + loss_tests}"
        return f"{depth + ': ' if depth else ''}{counts} tests"

    scope = "each depth's" if by_depth else "the"
    if len(depths) > 1 and not by_depth:
        scope = "every depth's"
    kinds = (
        "BLEU and chrF cells are one family under Holm's correction, its validation losses another"
        if by_kind
        else "BLEU and chrF cells and validation losses are one family under Holm's correction"
    )
    counted = ", ".join(sizes(d) for d in depths) if by_depth else sizes(None)
    return f"{scope} {kinds} ({counted})"


def depth_changes(
    cells: Sequence[Cell], losses: Sequence[LossCell], shallow: str, deep: str
) -> list[str]:
    """Markdown: for each system, on validation loss and on each split (BLEU and chrF
    together), its verdict against the baseline at ``shallow`` and at ``deep`` and what
    became of it (:func:`change`)."""
    rows = [(c.system, "validation loss", c.depth, c.verdict()) for c in losses]
    rows += [(c.system, c.split, c.depth, c.verdict()) for c in cells]
    at = {(system, where, depth): v for system, where, depth, v in rows}
    lines = [
        f"| system | measured on | {shallow} | {deep} | at {deep} |",
        "|---|---|---|---|---|",
    ]
    for system, where in dict.fromkeys((system, where) for system, where, _, _ in rows):
        before, after = (at.get((system, where, d), "-") for d in (shallow, deep))
        lines.append(f"| {system} | {where} | {before} | {after} | {change(before, after)} |")
    return lines


def change(shallow: str, deep: str) -> str:
    """What became of a verdict against the baseline from the shallower model to the deeper:
    ``holds`` (the same finding), ``reverses`` (findings of opposite directions), ``appears``
    (a finding only deeper), ``not found`` (a finding only shallower, the deeper tested),
    ``neither`` (tested at both, found at neither), else ``untested`` (a side without a test:
    one seed, missing or below the quality floor)."""
    tested = {shallow: shallow not in UNTESTED, deep: deep not in UNTESTED}
    if shallow in FINDINGS and deep in FINDINGS:
        return "holds" if shallow == deep else "reverses"
    if not (tested[shallow] and tested[deep]):
        return "untested"
    if deep in FINDINGS:
        return "appears"
    if shallow in FINDINGS:
        return "not found"
    return "neither"


def headline_table(cells: Sequence[Cell], metric: str, baseline: str, correction: str) -> list[str]:
    """Markdown: one row per system, one column per depth and split: the difference from
    ``baseline`` in ``metric`` with its interval and the verdict; ``correction``: how the
    families were formed (:func:`correction_note`)."""
    columns = list(dict.fromkeys((c.depth, c.split) for c in cells))
    at = {(c.depth, c.split, c.system): c for c in cells}

    def text(system: str, i: int) -> str | None:
        found = at.get((*columns[i], system))
        if found is None or found.judgement is None:
            return None
        return f"{found.judgement.comparisons[metric].text()} {found.verdict()}"

    headings = [f"{depth}, {split}" for depth, split in columns]
    lines = system_table(headings, list(dict.fromkeys(c.system for c in cells)), text)
    lines += [
        "",
        f"Each cell: the system's mean {LABELS.get(metric, metric)} over its seeds minus "
        f"{baseline}'s, its 95% "
        f"interval (seeds and resampled test sentences as noise) and the verdict; {correction}.",
    ]
    return lines


def loss_table(cells: Sequence[LossCell], baseline: str, correction: str) -> list[str]:
    """Markdown: one row per system, one column per depth: the difference from ``baseline`` in
    best validation loss (nats) with its interval and the verdict; ``correction``: how the
    families were formed (:func:`correction_note`)."""
    depths = list(dict.fromkeys(c.depth for c in cells))
    at = {(c.depth, c.system): c for c in cells}

    def text(system: str, i: int) -> str | None:
        found = at.get((depths[i], system))
        if found is None or found.comparison is None:
            return None
        return f"{found.comparison.text(3)} {found.verdict()}"

    lines = system_table(depths, list(dict.fromkeys(c.system for c in cells)), text)
    lines += [
        "",
        f"Each cell: the system's best validation loss (nats, mean over its seeds) minus "
        f"{baseline}'s, its 95% interval ({sentence_noise(cells)}) and the verdict (ahead: "
        f"lower loss); {correction}.",
    ]
    return lines


@dataclass
class _Point:
    """One marker of a small-multiples figure."""

    panel: str
    system: str
    depth: str
    comparison: Comparison
    finding: bool


def plot_headline(cells: Sequence[Cell], metric: str, baseline: str, path: Path) -> Path:
    """The small multiples of :func:`headline_table` for ``metric`` saved as ``path`` (PNG):
    one panel per split.

    Raises:
        ValueError: more than :data:`MAX_SYSTEMS` systems (draw them in several figures).
    """
    points = [
        _Point(c.split, c.system, c.depth, c.judgement.comparisons[metric], c.verdict() in FINDINGS)
        for c in cells
        if c.judgement is not None
    ]
    xlabel = f"{LABELS.get(metric, metric)} minus {baseline}"
    return _plot(points, cells, xlabel, (baseline, "seeds and sentences as noise"), path)


def plot_loss_headline(cells: Sequence[LossCell], baseline: str, path: Path) -> Path:
    """:func:`loss_table` drawn as one panel saved as ``path`` (PNG).

    Raises:
        ValueError: more than :data:`MAX_SYSTEMS` systems.
    """
    points = [
        _Point(LABELS["loss"], c.system, c.depth, c.comparison, c.verdict() in FINDINGS)
        for c in cells
        if c.comparison is not None
    ]
    xlabel = f"validation loss minus {baseline} (nats)"
    return _plot(points, cells, xlabel, (baseline, "seeds as noise"), path)


def _plot(
    points: Sequence[_Point],
    cells: Sequence[Cell] | Sequence[LossCell],
    xlabel: str,
    against: tuple[str, str],
    path: Path,
) -> Path:
    """Small multiples of ``points``: a panel per ``panel``, the systems and depths of
    ``cells`` down the side (missing ones left empty), one marker per depth; ``against``: the
    baseline and the noise, for the title."""
    panels = list(dict.fromkeys(getattr(c, "split", LABELS["loss"]) for c in cells))
    depths = list(dict.fromkeys(c.depth for c in cells))
    systems = list(dict.fromkeys(c.system for c in cells))
    if len(systems) > MAX_SYSTEMS:
        raise ValueError(
            f"{len(systems)} systems in one figure; draw at most {MAX_SYSTEMS} a figure"
        )
    width = max(7.0, 3.2 * len(panels) + 1.5)
    fig, axes = new_figure(width, 1.2 + 0.4 * len(systems), len(panels))
    offsets = {d: (i - (len(depths) - 1) / 2) * 0.18 for i, d in enumerate(depths)}
    labelled: set[str] = set()
    for index, (ax, panel) in enumerate(zip(axes, panels, strict=True)):
        for point in points:
            if point.panel != panel:
                continue
            c = point.comparison
            colour = depths.index(point.depth)
            xerr = None if c.low is None else [[c.difference - c.low], [c.high - c.difference]]
            ax.errorbar(
                c.difference,
                systems.index(point.system) + offsets[point.depth],
                xerr=xerr,
                fmt=MARKERS[colour % len(MARKERS)],
                color=f"C{colour}",
                mfc=None if point.finding else "white",
                capsize=2,
                label=None if point.depth in labelled else point.depth,
            )
            labelled.add(point.depth)
        ax.axvline(0.0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(systems)), systems if index == 0 else [], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", alpha=0.3)
    if labelled:
        fig.legend(fontsize=7, loc="outside lower center", ncols=len(depths))
    fig.suptitle(
        f"Against {against[0]}: 95% intervals ({against[1]}); filled: a finding",
        fontsize=9,
    )
    save_figure(fig, path, dpi=110)
    return path

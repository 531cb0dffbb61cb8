"""Learning curves averaged over seeds, honestly: a mean only where every seed has data.

A seed that stopped earlier (a shorter time budget reached, an unfinished run) would otherwise
leave the mean to the others from its last point on, and the mean would jump there (up, when
the slower seed is the worse one). So the mean and its min–max band cover only the range all
seeds share; what a seed logged outside it is drawn as its own thin line (:func:`tails`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from posenc.analysis.report.runs import Curve

#: the most points a curve averaged over seeds is evaluated at
MAX_GRID = 300
#: the trailing mean of a figure's training-loss curves spans this share of its longest x range
SMOOTHING = 0.05


def common_range(curves: Sequence[Curve]) -> tuple[float, float] | None:
    """The x range every curve covers (from the latest first point to the earliest last
    point), or None when they share none."""
    if not curves:
        return None
    low = max(float(x[0]) for x, _ in curves)
    high = min(float(x[-1]) for x, _ in curves)
    return (low, high) if low <= high else None


def common_grid(curves: Sequence[Curve]) -> np.ndarray:
    """The curves' x values inside their :func:`common_range` (an even grid of
    :data:`MAX_GRID` points over it when there are more); empty when they share no range."""
    shared = common_range(curves)
    if shared is None:
        return np.array([], dtype=float)
    grid = np.unique(np.concatenate([x for x, _ in curves]))
    grid = grid[(grid >= shared[0]) & (grid <= shared[1])]
    if len(grid) > MAX_GRID:
        grid = np.linspace(shared[0], shared[1], MAX_GRID)
    return grid


def aggregate_curves(curves: Sequence[Curve], grid: np.ndarray | None = None) -> dict:
    """The seeds interpolated linearly onto ``grid`` (default :func:`common_grid`) and
    aggregated: ``{"x", "mean", "min", "max"}`` (arrays of one length) and ``"n"`` (seeds).
    Grid points outside any seed's range are dropped: every point is a mean over all seeds,
    so the curve ends where the shortest seed ends."""
    grid = common_grid(curves) if grid is None else np.asarray(grid, dtype=float)
    shared = common_range(curves)
    grid = grid[:0] if shared is None else grid[(grid >= shared[0]) & (grid <= shared[1])]
    if not len(grid):
        return {"x": grid, "mean": grid, "min": grid, "max": grid, "n": len(curves)}
    values = np.array([np.interp(grid, x, y) for x, y in curves])
    return {
        "x": grid,
        "mean": values.mean(axis=0),
        "min": values.min(axis=0),
        "max": values.max(axis=0),
        "n": len(curves),
    }


def tails(curves: Sequence[Curve]) -> list[Curve]:
    """What each seed logged outside the range all seeds share: the part before its start and
    the part after its end (each joined to the shared range by the interpolated value at its
    edge); every whole curve when they share no range."""
    shared = common_range(curves)
    if shared is None:
        return list(curves)
    low, high = shared
    segments: list[Curve] = []
    for x, y in curves:
        before, after = x < low, x > high
        if before.any():
            segments.append((np.append(x[before], low), np.append(y[before], np.interp(low, x, y))))
        if after.any():
            segments.append(
                (np.insert(x[after], 0, high), np.insert(y[after], 0, np.interp(high, x, y)))
            )
    return segments


def smoothing_span(curves: Sequence[Curve], share: float = SMOOTHING) -> float:
    """The x span of the trailing mean for curves drawn together: ``share`` of the longest
    curve's x range, one span for all, so runs that stopped at different steps are smoothed
    alike (a share of each curve's own points would smooth a longer run's start more)."""
    return share * max((float(x[-1] - x[0]) for x, _ in curves if len(x)), default=0.0)


def trailing_mean(curve: Curve, span: float) -> Curve:
    """``curve`` smoothed by a trailing mean over the points whose x lies within ``span``
    before each point's, itself included (a span below the points' spacing leaves it as it
    is); the x values are kept."""
    x, y = curve
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    sums = np.cumsum(np.insert(y, 0, 0.0))
    ends = np.arange(1, len(y) + 1)
    starts = np.minimum(np.searchsorted(x, x - span, side="right"), ends - 1)  # itself at least
    return x, (sums[ends] - sums[starts]) / (ends - starts)


def rankings_at_last_validations(
    curves_by_system: dict[str, Sequence[Curve]],
) -> list[tuple[int, list[str]]]:
    """The systems ranked by their mean validation loss over seeds (best first) at each of the
    last two validation steps that every run of every system logged: ``[(step, ranking), ...]``
    (fewer entries when fewer such steps exist). Whether the two rankings agree is the rule for
    a budget long enough for the ranking to settle."""
    if len(curves_by_system) < 2 or any(not curves for curves in curves_by_system.values()):
        return []
    steps, means = means_at_equal_steps(curves_by_system, columns=2)
    return [
        (step, sorted(means, key=lambda name: (means[name][i], name)))
        for i, step in enumerate(steps)
        if all(values[i] is not None for values in means.values())
    ]


def means_at_equal_steps(
    curves_by_system: dict[str, Sequence[Curve]], columns: int = 3
) -> tuple[list[int], dict[str, list[float | None]]]:
    """Each system's mean over its runs at the last ``columns`` steps that every run logged and,
    after them, at the last step that every run of N systems logged, for the ``columns`` largest
    N >= 2 below all: ``(steps, {system: [mean, or None where a run of it lacks the step]})``.
    The comparison that stays fair when runs stopped at different steps (time budgets)."""
    logged = {
        name: set.intersection(*(set(np.asarray(x, dtype=int).tolist()) for x, _ in curves))
        for name, curves in curves_by_system.items()
        if curves
    }
    counts = Counter(step for steps in logged.values() for step in steps)
    every = sorted(step for step, count in counts.items() if count == len(logged))
    after = max(every, default=0)
    last_by_count: dict[int, int] = {}
    for step, count in counts.items():
        if 2 <= count < len(logged) and step > after:
            last_by_count[count] = max(step, last_by_count.get(count, step))
    beyond = [last_by_count[count] for count in sorted(last_by_count, reverse=True)[:columns]]
    steps = every[-columns:] + sorted(beyond)
    means = {
        name: [
            float(np.mean(values_at(curves_by_system[name], s))) if s in logged[name] else None
            for s in steps
        ]
        for name in logged
    }
    return steps, means


def values_at(curves: Sequence[Curve], step: int) -> list[float]:
    """Each curve's value at ``step`` (every curve must have logged it)."""
    return [float(y[np.flatnonzero(np.asarray(x, dtype=int) == step)[0]]) for x, y in curves]


def swaps_against_noise(
    curves_by_system: dict[str, Sequence[Curve]],
    first: Sequence[str],
    second: Sequence[str],
    step: int,
) -> list[tuple[str, str, float, float | None]]:
    """The pairs of systems ordered one way in ranking ``first`` and the other in ``second``
    (the ranking at ``step``), each as ``(better, worse, gap, noise)`` at ``step``: ``gap`` the
    difference of their mean values (worse minus better, >= 0), ``noise`` the standard error of
    that difference over the training seeds, ``sqrt(var_a / n_a + var_b / n_b)`` (None when a
    system has one seed). A swap whose gap is below twice its noise is a tie the seeds cannot
    order."""
    position = {name: i for i, name in enumerate(first)}
    found = []
    for i, better in enumerate(second):
        for worse in second[i + 1 :]:
            if position[better] < position[worse]:
                continue
            a, b = (
                values_at(curves_by_system[better], step),
                values_at(curves_by_system[worse], step),
            )
            noise = (
                float(np.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b)))
                if min(len(a), len(b)) > 1
                else None
            )
            found.append((better, worse, float(np.mean(b) - np.mean(a)), noise))
    return found


def kendall_tau(first: Sequence[str], second: Sequence[str]) -> float:
    """Kendall's rank correlation of two orderings of the same names (1: the same order)."""
    position = {name: i for i, name in enumerate(second)}
    pairs = [(a, b) for i, a in enumerate(first) for b in first[i + 1 :]]
    agree = sum(1 if position[a] < position[b] else -1 for a, b in pairs)
    return agree / len(pairs) if pairs else 1.0

"""Chosen contrasts between two systems of a sweep, judged by the report's rules (:mod:`.findings`).

A claim of a paper or of the seed report names two systems ("relative positions beat
sinusoids"); the report itself only compares every system with the best one. A contrast is
the paired bootstrap of the two on the pooled test sentences of the seeds both have, the
difference on each of those seeds, BLEU and chrF, with Holm's correction over every contrast and
split of the family asked for at once. It is a finding (``"<name> ahead"``) when the leader is
ahead on both metrics, on every paired seed, after the correction, on a split above the noise
floor; otherwise the verdict says which rule it failed.

A decoding contrast (:func:`decoding_contrasts`) sets every system under a standalone evaluation
of its runs (``RUN/evals/NAME``: beam 5, say) against the same runs' own evaluation (greedy),
judged by the same rules, and says whether the ranking of the systems changes.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from posenc.analysis.report.curves import kendall_tau
from posenc.analysis.report.findings import (
    NOISE_FLOOR_BLEU,
    WORSE,
    SeedDifference,
    holm,
    seed_difference,
    verdict,
)
from posenc.analysis.report.runs import (
    DONE,
    Entry,
    Group,
    ReportError,
    Run,
    group_runs,
    load_run,
    split_entries,
)
from posenc.analysis.report.stats import best_mean_bleu, paired_bootstrap, pooled, seed_texts
from posenc.config.variants import settings_text
from posenc.runtime.rundir import find_run_dirs

METRICS = ("bleu", "chrf")
MISSING = "not in the sweep"


@dataclass
class Contrast:
    """``first`` against ``second`` on ``split``: the seeds compared, each metric's difference
    ``first - second`` per seed (:class:`SeedDifference`), the bootstrap p-values (Holm-adjusted
    once :func:`judge` has run) and the verdict."""

    split: str
    first: str
    second: str
    seeds: tuple[int, ...] = ()
    differences: dict[str, SeedDifference] | None = None
    p_values: dict[str, float | None] | None = None
    verdict: str = MISSING

    @property
    def leader(self) -> str:
        """The system ahead on mean BLEU over the paired seeds."""
        bleu = self.differences["bleu"].mean if self.differences else None
        return self.second if bleu is not None and bleu < 0 else self.first


def contrast(
    systems: dict[str, list[Entry]], split: str, first: str, second: str, samples: int
) -> Contrast:
    """The unadjusted :class:`Contrast` of two systems' entries on one split (``verdict`` is
    :data:`MISSING` when either has no run there or no seed in common)."""
    row = Contrast(split, first, second)
    if first not in systems or second not in systems:
        return row
    texts = {name: seed_texts(systems[name]) for name in (first, second)}
    row.seeds = tuple(sorted(set(texts[first]) & set(texts[second])))
    if not row.seeds or any(texts[first][s][1] != texts[second][s][1] for s in row.seeds):
        row.seeds = ()
        return row
    named = [(name, pooled(texts[name], row.seeds, 0)) for name in (first, second)]
    results, _ = paired_bootstrap(named, pooled(texts[first], row.seeds, 1), samples)
    row.p_values = {m: results[1][m].p_value for m in METRICS}
    row.differences = {m: seed_difference(systems[first], systems[second], m) for m in METRICS}
    return row


def judge(rows: Sequence[Contrast], best_bleu: dict[str, float]) -> None:
    """Adjust every compared row's p-values with Holm's method over the whole family (per
    metric) and set its verdict: ``"<leader> ahead"`` for a finding, else the rule it failed
    (:data:`posenc.analysis.report.findings.VERDICTS`). ``best_bleu``: the best mean BLEU of each
    split, below :data:`NOISE_FLOOR_BLEU` of which nothing is ranked."""
    compared = [r for r in rows if r.p_values is not None]
    for metric in METRICS:
        raw = {i: r.p_values[metric] for i, r in enumerate(compared)}
        adjusted = holm({i: p for i, p in raw.items() if p is not None})
        for i, row in enumerate(compared):
            row.p_values[metric] = adjusted.get(i)
    for row in compared:
        ahead = {  # the leader's lead on each seed, positive where it is ahead
            m: _oriented(row.differences[m], row.leader == row.second) for m in METRICS
        }
        floor = best_bleu.get(row.split, 0.0) < NOISE_FLOOR_BLEU
        said = verdict(row.p_values, ahead, floor)
        row.verdict = f"{row.leader} ahead" if said == WORSE else said


def _oriented(difference: SeedDifference, flip: bool) -> SeedDifference:
    if not flip:
        return difference
    return SeedDifference(
        tuple(-d for d in difference.per_seed),
        None if difference.mean is None else -difference.mean,
        None if difference.effect is None else -difference.effect,
    )


def sweep_contrasts(
    sweep: Path,
    pairs: Sequence[tuple[str, str]],
    splits: Sequence[str],
    samples: int,
    evaluation: str | None = None,
) -> list[Contrast]:
    """Every pair on every split of the sweep in ``sweep`` (systems named as the report labels
    them: ``rope``, ``rope (pe.cross_attention=rotated)``), judged together.

    Raises:
        ReportError: no run under ``sweep``, or ``samples`` is not positive.
    """
    groups = group_runs(_sweep_runs(sweep, samples, evaluation))
    rows, best = [], {}
    for split in splits:
        systems = split_entries(groups, split)
        best[split] = (best_mean_bleu(systems) if systems else None) or 0.0
        rows += [contrast(systems, split, a, b, samples) for a, b in pairs]
    judge(rows, best)
    return rows


@dataclass
class DecodingComparison:
    """Every system under ``decoding`` (the standalone evaluation's settings that differ from
    the runs' own, ``own``: ``eval.beam_size=5`` against ``eval.beam_size=1``) against its own
    evaluation: one :class:`Contrast` per system and split (``first`` is the system under
    ``decoding``: ``rope (eval.beam_size=5)``), judged together, and per split Kendall's tau
    between the systems' rankings by mean BLEU under the two decodings over the seeds each
    system has under both (None: fewer than two systems)."""

    decoding: str
    own: str
    rows: list[Contrast]
    tau: dict[str, float | None]


def decoding_contrasts(
    sweep: Path, evaluation: str, splits: Sequence[str], samples: int
) -> DecodingComparison:
    """Each system of ``sweep`` scored by its runs' standalone evaluation ``RUN/evals/
    <evaluation>`` (a glob pattern may name it) against the same runs' own evaluation, on the
    seeds that have both.

    Raises:
        ReportError: no run under ``sweep``, ``samples`` is not positive, or no run has the
            evaluation.
    """
    own = group_runs(_sweep_runs(sweep, samples))
    other = {r.path: r for r in _sweep_runs(sweep, samples, evaluation)}
    scored = [(r, other[r.path]) for g in own for r in g.runs if other[r.path].status == DONE]
    if not scored:
        raise ReportError(f"no run of {sweep} has the evaluation {evaluation!r}")
    decoding = _decoding_name(*scored[0]) or evaluation
    under = [
        Group(_with(g, decoding), g.pe, g.variant, [other[r.path] for r in g.runs]) for g in own
    ]
    rows, best, tau = [], {}, {}
    for split in splits:
        systems = split_entries(own, split)
        decoded = split_entries(under, split)
        best[split] = max((best_mean_bleu(s) or 0.0 for s in (systems, decoded) if s), default=0.0)
        pairs = [(g.label, u.label) for g, u in zip(own, under, strict=True) if u.label in decoded]
        split_rows = [contrast(systems | decoded, split, b, a, samples) for a, b in pairs]
        rows += split_rows
        tau[split] = ranking_agreement(systems, decoded, pairs, split_rows)
    judge(rows, best)
    return DecodingComparison(decoding, _decoding_name(*scored[0][::-1]), rows, tau)


def _sweep_runs(sweep: Path, samples: int, evaluation: str | None = None) -> list[Run]:
    """Every run under ``sweep``, scored by ``evaluation`` when named.

    Raises:
        ReportError: no run under ``sweep``, or ``samples`` is not positive.
    """
    if samples < 1:
        raise ReportError(f"--bootstrap must be a positive number of resamples, not {samples}")
    runs = [load_run(path, sweep, evaluation) for path in find_run_dirs(sweep, sweep / "report")]
    if not runs:
        raise ReportError(f"no run directory (one with a config.yaml) under {sweep}")
    return runs


def _with(group: Group, decoding: str) -> str:
    """The group's label with ``decoding`` among its settings: ``rope (pe.x=1, eval.k=5)``."""
    return f"{group.pe} ({', '.join(s for s in (group.variant, decoding) if s)})"


def _decoding_name(own: Run, other: Run) -> str:
    """``eval.KEY=VALUE, ...``: the decoding settings in which a run's standalone evaluation
    differs from its own."""
    keys = sorted(k for k in other.config if k.startswith("eval.") and k != "eval.splits")
    return settings_text({k: other.config[k] for k in keys if own.config.get(k) != other.config[k]})


def ranking_agreement(
    systems: dict[str, list[Entry]],
    decoded: dict[str, list[Entry]],
    pairs: Sequence[tuple[str, str]],
    rows: Sequence[Contrast],
) -> float | None:
    """Kendall's tau between the systems' orders by mean BLEU under each decoding, each system's
    means over the seeds of its contrast (None when fewer than two systems have any)."""
    means: dict[str, tuple[float, float]] = {}
    for (name, decoded_name), row in zip(pairs, rows, strict=True):
        if row.seeds:
            means[name] = tuple(  # type: ignore[assignment]
                statistics.fmean(e.scores["bleu"] for e in entries if e.run.seed in row.seeds)
                for entries in (systems[name], decoded[decoded_name])
            )
    if len(means) < 2:
        return None
    orders = [sorted(means, key=lambda n, i=i: -means[n][i]) for i in (0, 1)]
    return kendall_tau(*orders)


def contrasts_markdown(rows: Sequence[Contrast], samples: int) -> list[str]:
    """The rows as a markdown table (differences ``first - second``; effect = mean over the
    pooled seed standard deviation) with a caption stating the rules."""
    lines = [
        "| split | first | second | seeds | BLEU first - second (per seed) | effect (seed sd) "
        "| chrF first - second | p BLEU | p chrF | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row.differences is None:
            lines.append(
                f"| {row.split} | {row.first} | {row.second} | - | - | - | - | - | - | "
                f"{row.verdict} |"
            )
            continue
        bleu, chrf = row.differences["bleu"], row.differences["chrf"]
        lines.append(
            f"| {row.split} | {row.first} | {row.second} | {', '.join(map(str, row.seeds))} | "
            f"{_signed(bleu.mean)} ({', '.join(_signed(d) for d in bleu.per_seed)}) | "
            f"{_signed(bleu.effect, 1)} | {_signed(chrf.mean)} | {_p(row.p_values['bleu'])} | "
            f"{_p(row.p_values['chrf'])} | {row.verdict} |"
        )
    lines += [
        "",
        f"Paired bootstrap ({samples} resamples) of the second system against the first on the "
        "test sentences of the seeds both have, p-values adjusted with Holm's method over every "
        "row and split above, per metric. A row is a finding (`NAME ahead`) when the leader is "
        "ahead on BLEU and chrF, on every paired seed (two at least), after the correction, on "
        f"a split whose best mean BLEU is at least {NOISE_FLOOR_BLEU:g}.",
    ]
    return lines


def decoding_markdown(comparison: DecodingComparison, samples: int) -> list[str]:
    """The decoding contrasts as :func:`contrasts_markdown`'s table, then per split how many
    systems each decoding leads beyond the noise and Kendall's tau between the rankings."""
    lines = contrasts_markdown(comparison.rows, samples)
    for split, tau in comparison.tau.items():
        rows = [r for r in comparison.rows if r.split == split and r.differences is not None]
        ahead = sum(r.verdict == f"{r.first} ahead" for r in rows)
        behind = sum(r.verdict == f"{r.second} ahead" for r in rows)
        agreement = "-" if tau is None else f"{tau:.2f}"
        lines.append(
            f"- {split}: {comparison.decoding} ahead of {comparison.own} for {ahead} of "
            f"{len(rows)} systems, behind for {behind}, the rest no finding; Kendall's tau "
            f"between the two rankings by mean BLEU: {agreement}."
        )
    return lines


def _signed(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:+.{digits}f}"


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"

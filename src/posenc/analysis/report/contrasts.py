"""Chosen contrasts between two systems of a sweep, judged by the report's rules (:mod:`.findings`).

A claim of a paper or of the seed report names two systems ("relative positions beat
sinusoids"); the report itself only compares every system with the best one. A contrast is the
decision rule of :mod:`posenc.analysis.decision` on BLEU and chrF (its unit the training run,
the test sentences a second noise), every contrast and split asked for at once corrected as one
family with Holm's method. It is a finding (``"<name> ahead"``) when both metrics are
significant after the correction and agree, on a split where both systems are above the quality
floor; otherwise the verdict says which rule it failed, and the table says how many seeds per
system would find the observed difference.

A decoding contrast (:func:`decoding_contrasts`) sets every system under a standalone evaluation
of its runs (``RUN/evals/NAME``: beam 5, say) against the same runs' own evaluation (greedy),
judged by the same rules, and says whether the ranking of the systems changes.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from posenc.analysis.decision import MAX_SEEDS
from posenc.analysis.report.clean import entries_by_split
from posenc.analysis.report.curves import kendall_tau
from posenc.analysis.report.findings import (
    LOOP_CEILING,
    NOISE_FLOOR_BLEU,
    WORSE,
    Judgement,
    StatisticsCache,
    judge_family,
    judge_pair,
    power_cells,
    tested_p,
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
from posenc.config.variants import settings_text
from posenc.runtime.rundir import find_run_dirs

MISSING = "not in the sweep"


@dataclass
class Contrast:
    """``first`` against ``second`` on ``split``: the :class:`~.findings.Judgement` of
    ``first - second`` (None when either is missing or they cannot be compared) and the
    verdict (``"<leader> ahead"`` for a finding)."""

    split: str
    first: str
    second: str
    judgement: Judgement | None = None
    verdict: str = MISSING

    @property
    def leader(self) -> str:
        """The system ahead on mean BLEU."""
        if self.judgement is None or self.judgement.first_leads:
            return self.first
        return self.second


def contrast(
    systems: dict[str, list[Entry]],
    split: str,
    first: str,
    second: str,
    samples: int,
    cache: StatisticsCache,
) -> Contrast:
    """The unadjusted :class:`Contrast` of two systems' entries on one split (``verdict`` is
    :data:`MISSING` when either has no run there or they cannot be compared)."""
    row = Contrast(split, first, second)
    if first in systems and second in systems:
        row.judgement = judge_pair(systems[first], systems[second], samples, cache)
    return row


def judge(rows: Sequence[Contrast], margins: Mapping[str, float] | None = None) -> None:
    """Correct every compared row as one family (:func:`~.findings.judge_family`, with a plan's
    equivalence ``margins`` by metric when given) and set its verdict: ``"<leader> ahead"`` for
    a finding, else the rule it failed or the equivalence it showed."""
    compared = [r for r in rows if r.judgement is not None]
    judge_family([r.judgement for r in compared], margins)  # type: ignore[misc]
    for row in compared:
        said = row.judgement.verdict  # type: ignore[union-attr]
        row.verdict = f"{row.leader} ahead" if said == WORSE else said


def sweep_contrasts(
    sweep: Path,
    pairs: Sequence[tuple[str, str]],
    splits: Sequence[str],
    samples: int,
    evaluation: str | None = None,
    seeds: frozenset[int] | None = None,
    margins: Mapping[str, float] | None = None,
) -> list[Contrast]:
    """Every pair on every split of the sweep in ``sweep`` (systems named as the report labels
    them: ``rope``, ``rope (pe.cross_attention=rotated)``; a split ``NAME-clean`` is a held-out
    set's clean part, :mod:`.clean`), judged together; with ``seeds``, on the runs of those
    training seeds alone; with ``margins`` (BLEU and chrF points), a difference that is no
    finding also tested for equivalence within them.

    Raises:
        ReportError: no run under ``sweep``, or ``samples`` is not positive.
    """
    runs = [r for r in _sweep_runs(sweep, samples, evaluation) if not seeds or r.seed in seeds]
    if not runs:
        raise ReportError(f"no run of seeds {sorted(seeds or ())} under {sweep}")
    groups = group_runs(runs)
    rows, cache = [], StatisticsCache()
    with tempfile.TemporaryDirectory() as scratch:  # the clean splits' files, while read
        for split, systems in entries_by_split(groups, splits, Path(scratch)).items():
            rows += [contrast(systems, split, a, b, samples, cache) for a, b in pairs]
    judge(rows, margins)
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
    rows, tau, cache = [], {}, StatisticsCache()
    for split in splits:
        systems = split_entries(own, split)
        decoded = split_entries(under, split)
        pairs = [(g.label, u.label) for g, u in zip(own, under, strict=True) if u.label in decoded]
        for name, decoded_name in pairs:  # the same runs under both: the seeds decoded both ways
            seeds = {e.run.seed for e in decoded[decoded_name]}
            same = {
                decoded_name: decoded[decoded_name],
                name: [e for e in systems[name] if e.run.seed in seeds],
            }
            rows.append(contrast(same, split, decoded_name, name, samples, cache))
        tau[split] = ranking_agreement(systems, decoded, pairs)
    judge(rows)
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
) -> float | None:
    """Kendall's tau between the systems' orders by mean BLEU under each decoding, each system's
    means over its seeds scored under both (None when fewer than two systems have any)."""
    means: dict[str, tuple[float, float]] = {}
    for name, decoded_name in pairs:
        own = {e.run.seed: e.scores["bleu"] for e in systems[name]}
        other = {e.run.seed: e.scores["bleu"] for e in decoded[decoded_name]}
        seeds = sorted(set(own) & set(other))
        if seeds:
            means[name] = (
                statistics.fmean(own[s] for s in seeds),
                statistics.fmean(other[s] for s in seeds),
            )
    if len(means) < 2:
        return None
    orders = [sorted(means, key=lambda n, i=i: -means[n][i]) for i in (0, 1)]
    return kendall_tau(*orders)


def contrasts_markdown(
    rows: Sequence[Contrast], samples: int, margins: Mapping[str, float] | None = None
) -> list[str]:
    """The rows as a markdown table (differences ``first - second`` with their 95% intervals,
    the seeds each side has, Holm-adjusted p-values, the seeds per system that would find the
    difference; with the ``margins`` the rows were judged with, the equivalence tests'
    adjusted p-values) with a caption stating the rules."""
    equivalence = margins is not None and any(
        r.judgement is not None and r.judgement.p_equivalence for r in rows
    )
    lines = [
        "| split | first | second | seeds | BLEU first - second [95% CI] | chrF first - second "
        "[95% CI] | p BLEU | p chrF | seeds for 80% power (BLEU, chrF) | "
        + ("p equivalent (BLEU, chrF) | " if equivalence else "")
        + "verdict |",
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if equivalence else "") + "---|",
    ]
    tests = len(tested_p([row.judgement for row in rows if row.judgement is not None]))
    for row in rows:
        judged = row.judgement
        if judged is None:
            lines.append(
                f"| {row.split} | {row.first} | {row.second} | - | - | - | - | - | - | "
                + ("- | " if equivalence else "")
                + f"{row.verdict} |"
            )
            continue
        bleu, chrf = judged.comparisons["bleu"], judged.comparisons["chrf"]
        seeds = f"{bleu.seeds[0]} / {bleu.seeds[1]}" + (" paired" if bleu.paired else "")
        needed = power_cells(judged)
        lines.append(
            f"| {row.split} | {row.first} | {row.second} | {seeds} | {bleu.text()} | "
            f"{chrf.text()} | {_p(judged.p_holm.get('bleu'))} | "
            f"{_p(judged.p_holm.get('chrf'))} | {needed} | "
            + (_equivalence_cell(judged) if equivalence else "")
            + f"{row.verdict} |"
        )
    lines += [
        "",
        "Each difference is the mean over the first system's seeds minus the mean over the "
        "second's, in the metric's own points, with its 95% interval (of the row alone, before "
        "the family's correction); its standard error adds "
        "the spread between training seeds (paired where both have the same seeds, Welch "
        f"otherwise) and the spread over {samples} test sets resampled from this one, with the "
        "seeds' degrees of freedom (posenc.analysis.decision). p-values are adjusted with "
        f"Holm's method over the {tests} tests above at once (one family: both metrics of "
        "every row with two seeds a side above the quality floor). A row is a finding "
        "(`NAME ahead`) when BLEU and chrF are both significant and agree; both systems must "
        f"be above the quality floor (mean BLEU at least {NOISE_FLOOR_BLEU:g}, fewer than "
        f"{LOOP_CEILING:.0%} looping translations). Seeds for 80% power: the seeds per system "
        "that would find the observed difference at the family's Bonferroni level, given the "
        f"observed noise (`>{MAX_SEEDS}`: not within {MAX_SEEDS}, or not with seeds at all: "
        "the test set's own noise is larger).",
    ]
    if equivalence:
        lines[-1] += (
            f" With the plan's margins (BLEU {margins['bleu']:g}, chrF {margins['chrf']:g} "
            "points), a row that is no finding is `equivalent within the margins` when two "
            "one-sided tests put both differences inside them (Holm over the family's "
            "equivalence tests), else `not resolved`."
        )
    return lines


def _equivalence_cell(judged: Judgement) -> str:
    return f"{_p(judged.p_equivalence.get('bleu'))}, {_p(judged.p_equivalence.get('chrf'))} | "


def decoding_markdown(comparison: DecodingComparison, samples: int) -> list[str]:
    """The decoding contrasts as :func:`contrasts_markdown`'s table, then per split how many
    systems each decoding leads beyond the noise and Kendall's tau between the rankings."""
    lines = contrasts_markdown(comparison.rows, samples)
    for split, tau in comparison.tau.items():
        rows = [r for r in comparison.rows if r.split == split and r.judgement is not None]
        ahead = sum(r.verdict == f"{r.first} ahead" for r in rows)
        behind = sum(r.verdict == f"{r.second} ahead" for r in rows)
        agreement = "-" if tau is None else f"{tau:.2f}"
        lines.append(
            f"- {split}: {comparison.decoding} ahead of {comparison.own} for {ahead} of "
            f"{len(rows)} systems, behind for {behind}, the rest no finding; Kendall's tau "
            f"between the two rankings by mean BLEU: {agreement}."
        )
    return lines


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"

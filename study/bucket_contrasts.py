"""Loss differences on a source-length bucket, judged by the decision rule.

The rule's unit is the training run (:mod:`posenc.analysis.decision`).

Whether a system's test loss on the bucket differs from a baseline's (the runs'
``reference_pe`` unless named) beyond the noise of the training seeds and of the test sentences,
from each run's sentence losses (:mod:`posenc.runtime.sentence_losses`). For every system
against the baseline, on the bucket's sentences:

- each run's loss per target token on the bucket (the same references, so the same tokens);
- the difference of the two systems' means over their seeds (negative = lower loss) with its
  95% interval and p from the rule: the seeds' spread (paired where both have the same seeds,
  Welch otherwise) plus the spread over resampled bucket sentences (the same resampled
  sentences for every run of both systems), with the seeds' degrees of freedom;
- Holm's correction over the systems compared. A difference is a finding when the corrected
  p < 0.05 (a loss has no second metric to agree with); with one seed a side nothing is
  tested; the seeds per system that would find it are given where it is not.

``python -m study bucket-contrasts SWEEP [--bucket 80-120] [--baseline NAME]
[--systems A,B] [--bootstrap 10000] [--eval NAME] [--plan FILE --family NAME]`` prints the table
under the line naming its plan's family (without one: exploratory) (``--systems``: the
family judged, Holm over it alone; default every system of the sweep); with
``--eval 'eval.pe_variants=*' --baseline rope`` it compares RoPE's test-time scalings
(``rope [pi4]``) with RoPE itself.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from posenc.analysis.decision import (
    ALPHA,
    Comparison,
    compare_scores,
    holm,
    seeds_for_power,
    seeds_text,
)
from posenc.analysis.plan import (
    Plan,
    add_plan_arguments,
    declared_tests_note,
    plan_of,
    provenance,
)
from posenc.analysis.report.runs import Entry, reference_of
from posenc.analysis.report.stats import Stats, mean_std
from posenc.config.variants import split_labels
from posenc.runtime.sentence_losses import SentenceLosses, read_losses
from study.penalty import done_runs, systems_of

LOWER = "lower loss (finding)"
HIGHER = "higher loss (finding)"
ONE_SEED = "one seed only"
NOISE = "within noise"


@dataclass(frozen=True)
class BucketContrast:
    """One system against the baseline on one bucket: the rule's ``comparison`` of the system
    minus the baseline (nats per target token), the system's bucket ``loss`` over its seeds
    (mean, sd, n), the Holm-corrected ``p_holm`` (None: not tested), the seeds per system that
    would find the difference (``seeds_needed``; None: not within the limit or not tested)
    and the ``verdict``."""

    system: str
    comparison: Comparison
    loss: Stats
    p_holm: float | None = None
    seeds_needed: int | None = None
    verdict: str = ""


@dataclass(frozen=True)
class BucketComparison:
    """Every system against ``baseline`` on ``bucket`` (``sentences`` in it): the baseline's
    ``loss`` over its seeds (mean, sd, n) and the ``contrasts``, lowest loss first, their
    sentence noise from ``resamples`` resampled buckets."""

    bucket: tuple[int, int]
    baseline: str
    sentences: int
    loss: Stats
    contrasts: list[BucketContrast]
    resamples: int


def in_bucket(losses: SentenceLosses, bucket: tuple[int, int]) -> np.ndarray:
    """The indices of the sentences whose source length lies in ``[bucket[0], bucket[1])``."""
    lengths = np.asarray(losses.source_tokens)
    return np.flatnonzero((lengths >= bucket[0]) & (lengths < bucket[1]))


def _losses(entry: Entry) -> SentenceLosses:
    if entry.losses is None or not entry.losses.is_file():
        raise ValueError(
            f"{entry.run.path}: no sentence losses for {entry.system}; write them with "
            "scripts/sentence_losses.py (runs evaluated before they were kept)"
        )
    return read_losses(entry.losses)


def _same_sentences(a: SentenceLosses, b: SentenceLosses, where: str) -> None:
    if a.source_tokens != b.source_tokens or a.target_tokens != b.target_tokens:
        raise ValueError(
            f"{where}: the two runs' sentence losses are not of the same sentences (lengths "
            "differ); compare runs scored on the same split with the same tokenizer"
        )


def _bucket_loss(losses: SentenceLosses, idx: np.ndarray) -> float:
    return float(np.asarray(losses.nll)[idx].sum() / np.asarray(losses.target_tokens)[idx].sum())


def sentence_sd(
    system: Sequence[np.ndarray],
    baseline: Sequence[np.ndarray],
    tokens: np.ndarray,
    resamples: int,
    rng: np.random.Generator,
) -> float:
    """The standard deviation, over resampled bucket sentences (the same draw for every run),
    of the system's mean loss per token over its runs minus the baseline's: ``system`` and
    ``baseline`` hold each run's NLL of the N bucket sentences, ``tokens (N,)`` their target
    tokens."""
    n = len(tokens)
    stats = []
    for start in range(0, resamples, 1000):  # 1000 resamples at a time bound the memory
        idx = rng.integers(0, n, size=(min(1000, resamples - start), n))
        per_token = tokens[idx].sum(axis=1)
        means = [
            np.mean([run[idx].sum(axis=1) / per_token for run in side], axis=0)
            for side in (system, baseline)
        ]
        stats.append(means[0] - means[1])
    return float(np.concatenate(stats).std(ddof=1))


def bucket_contrasts(
    systems: dict[str, list[Entry]],
    baseline: str,
    bucket: tuple[int, int],
    resamples: int = 10_000,
    seed: int = 0,
    family: Sequence[str] | None = None,
) -> BucketComparison:
    """The systems of ``family`` (default: every system of ``systems`` but the baseline)
    against ``baseline`` on ``bucket``, Holm over the family.

    Raises:
        ValueError: the baseline or a system of the family is not among the systems, a run
            lacks its sentence losses, two runs' sentences differ, or the bucket holds no
            sentence (one line).
    """
    if baseline not in systems:
        raise ValueError(f"no system {baseline!r} to compare against; pick one of the sweep's")
    judged = [s for s in (sorted(systems) if family is None else family) if s != baseline]
    unknown = [s for s in judged if s not in systems]
    if unknown:
        raise ValueError(
            f"no system {unknown[0]!r} in the sweep; name systems as the report does, one of: "
            + ", ".join(sorted(systems))
        )
    base = {e.run.seed: _losses(e) for e in systems[baseline]}
    first = next(iter(base.values()))
    idx = in_bucket(first, bucket)
    if not len(idx):
        raise ValueError(f"no sentence has a source of {bucket[0]} to {bucket[1] - 1} tokens")
    rng = np.random.default_rng(seed)
    contrasts = [_contrast(system, systems[system], base, idx, resamples, rng) for system in judged]
    tested = {c.system: c.comparison.p for c in contrasts if c.comparison.p is not None}
    adjusted = holm(tested)
    corrected = [
        replace(
            c,
            p_holm=adjusted.get(c.system),
            seeds_needed=seeds_for_power(c.comparison, len(tested)),
            verdict=_verdict(c.comparison, adjusted.get(c.system)),
        )
        for c in contrasts
    ]
    return BucketComparison(
        bucket,
        baseline,
        len(idx),
        mean_std(_bucket_loss(losses, idx) for losses in base.values()),
        sorted(corrected, key=lambda c: c.comparison.difference),
        resamples,
    )


def _contrast(
    system: str,
    entries: list[Entry],
    base: dict[int, SentenceLosses],
    idx: np.ndarray,
    resamples: int,
    rng: np.random.Generator,
) -> BucketContrast:
    """One system's :class:`BucketContrast` before the correction."""
    reference = next(iter(base.values()))
    tokens = np.asarray(reference.target_tokens, dtype=float)[idx]
    runs = {}
    for entry in entries:
        losses = _losses(entry)
        _same_sentences(losses, reference, str(entry.run.path))
        runs.setdefault(entry.run.seed, losses)
    own = {s: _bucket_loss(losses, idx) for s, losses in runs.items()}
    theirs = {s: _bucket_loss(losses, idx) for s, losses in base.items()}
    noise = sentence_sd(
        [np.asarray(r.nll, dtype=float)[idx] for r in runs.values()],
        [np.asarray(r.nll, dtype=float)[idx] for r in base.values()],
        tokens,
        resamples,
        rng,
    )
    return BucketContrast(system, compare_scores(own, theirs, noise), mean_std(own.values()))


def _verdict(comparison: Comparison, p_holm: float | None) -> str:
    if comparison.p is None:
        return ONE_SEED
    if p_holm is None or p_holm >= ALPHA:
        return NOISE
    return LOWER if comparison.difference < 0 else HIGHER


def contrast_table(comparison: BucketComparison) -> str:
    """The markdown table of a :class:`BucketComparison`, the baseline's loss in a line above."""
    low, high = comparison.bucket
    mean, sd, _ = comparison.loss
    lines = [
        f"Sources of {low}-{high - 1} tokens ({comparison.sentences} sentences): "
        f"{comparison.baseline}'s loss {mean:.3f} ± {sd:.3f} nats per token; Δ = the system's "
        f"mean over its seeds minus {comparison.baseline}'s, with its 95% interval, the "
        f"sentence noise from {comparison.resamples:,} resampled buckets; Holm over "
        f"{len(comparison.contrasts)} systems.",
        "",
        "system | seeds | loss | Δ [95% CI] | p | p (Holm) | seeds for 80% power | verdict",
        "--- | --- | --- | --- | --- | --- | --- | ---",
    ]
    for c in comparison.contrasts:
        d = c.comparison
        seeds = f"{d.seeds[0]} / {d.seeds[1]}" + (" paired" if d.paired else "")
        needed = "—" if d.p is None else seeds_text(c.seeds_needed)
        lines.append(
            f"{c.system} | {seeds} | {c.loss[0]:.3f} ± {c.loss[1]:.3f} | "
            f"{d.text(3)} | {_p(d.p)} | {_p(c.p_holm)} | {needed} | "
            f"{c.verdict}"
        )
    return "\n".join(lines)


def contrast_page(comparison: BucketComparison, plan: Plan | None, family: str | None) -> str:
    """:func:`contrast_table` under the line naming its plan's family (or saying it is
    exploratory), with a note when the table holds another number of tests than the family
    declares (:mod:`posenc.analysis.plan`)."""
    held = sum(c.comparison.p is not None for c in comparison.contrasts)
    note = declared_tests_note(plan, family, held)
    return "\n\n".join(
        [provenance(plan, family), *([note] if note else []), contrast_table(comparison)]
    )


def _p(p: float | None) -> str:
    if p is None:
        return "—"
    return f"{p:.4f}" if p >= 0.001 else f"{p:.1e}"


def parse_bucket(text: str) -> tuple[int, int]:
    """``"80-120"`` -> (80, 120): sources of 80 to 119 tokens (incl. EOS), as the report's."""
    try:
        low, high = (int(part) for part in text.split("-"))
    except ValueError:
        raise ValueError(
            f"--bucket {text!r}: write it as LOW-HIGH in tokens, e.g. 80-120"
        ) from None
    if not 0 <= low < high:
        raise ValueError(f"--bucket {text!r}: LOW must be below HIGH, both >= 0")
    return low, high


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: prints :func:`contrast_table`; bad input exits with one line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path, help="the sweep directory")
    parser.add_argument("--split", default="test", help="the split scored (default: test)")
    parser.add_argument("--bucket", default="80-120", help="LOW-HIGH source tokens incl. EOS")
    parser.add_argument(
        "--baseline", default=None, help="the system compared against (default: reference_pe)"
    )
    parser.add_argument(
        "--systems",
        default=None,
        help="comma-separated, as reports name them: the family judged (default: every one)",
    )
    parser.add_argument("--bootstrap", type=int, default=10_000, help="resamples (10,000)")
    parser.add_argument("--seed", type=int, default=0, help="the resampling seed")
    parser.add_argument(
        "--eval",
        default=None,
        metavar="NAME",
        help="read the runs' standalone evaluation RUN/evals/NAME (RoPE's test-time scalings, "
        "say; a quoted glob pattern) instead of their own; the runs without it are left out",
    )
    add_plan_arguments(parser)
    args = parser.parse_args(argv)
    plan = plan_of(args.plan, "bucket-contrasts")
    if not args.sweep.is_dir():
        raise SystemExit(f"error: no sweep directory {args.sweep}; pass the sweep's folder")
    try:
        runs = done_runs(args.sweep, args.eval)
        baseline = reference_of(runs, args.baseline)
        systems = systems_of(runs, args.split)
        bucket = parse_bucket(args.bucket)
        family = None if args.systems is None else split_labels(args.systems)
        comparison = bucket_contrasts(systems, baseline, bucket, args.bootstrap, args.seed, family)
        print(contrast_page(comparison, plan, args.family))
    except ValueError as err:  # ReportError among them
        raise SystemExit(f"error: {err}") from None

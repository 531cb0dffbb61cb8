"""Loss differences on a source-length bucket, tested over the sentences and the seeds.

Whether a system's test loss on the bucket differs from a baseline's (the runs'
``reference_pe`` unless named) beyond the noise of the test sentences and of the training seeds,
from each run's sentence losses (:mod:`posenc.evaluation.sentence_losses`). For every system
against the baseline, on the bucket's sentences:

- per paired seed, the difference of the loss per target token, the system's minus the
  baseline's (both scored on the same references, so on the same tokens; negative = lower loss);
- their mean, and the mean against the seed noise (over the pooled standard deviation of the two
  systems' bucket losses over seeds, as the report's effect sizes);
- p of a paired bootstrap over the bucket's sentences (the same resampled sentences for every
  seed and both systems; two-sided: twice the smaller share of resampled mean differences on
  either side of zero, never below 1 / (resamples + 1));
- Holm's correction over the systems compared. A difference is a finding when the corrected
  p < 0.05 and every paired seed, two at least, has its sign (DESIGN.md's rules; a loss has no
  second metric to agree with).

``python scripts/bucket_contrasts.py SWEEP [--bucket 80-120] [--baseline NAME]
[--bootstrap 10000] [--eval NAME]`` prints the table; with ``--eval 'eval.pe_variants=*'
--baseline rope`` it compares RoPE's test-time scalings (``rope [pi4]``) with RoPE itself.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from posenc.analysis.decision import ALPHA, holm
from posenc.analysis.penalty import done_runs, systems_of
from posenc.analysis.report.runs import Entry, reference_of
from posenc.analysis.report.stats import Stats, mean_std
from posenc.evaluation.sentence_losses import SentenceLosses, read_losses

LOWER = "lower loss (finding)"
HIGHER = "higher loss (finding)"
NOT_EVERY_SEED = "not on every seed"
ONE_SEED = "one seed only"
NOISE = "within noise"


@dataclass(frozen=True)
class BucketContrast:
    """One system against the baseline on one bucket: ``per_seed`` differences (system minus
    baseline, nats per target token) over ``seeds``, their ``mean`` and ``effect`` (None with
    fewer than two seeds each), the system's bucket ``loss`` over seeds (mean, sd), the
    bootstrap ``p`` and its Holm-corrected ``p_holm``, and the ``verdict``."""

    system: str
    seeds: tuple[int, ...]
    per_seed: tuple[float, ...]
    mean: float
    effect: float | None
    loss: Stats
    p: float
    p_holm: float
    verdict: str


@dataclass(frozen=True)
class BucketComparison:
    """Every system against ``baseline`` on ``bucket`` (``sentences`` in it): the baseline's
    ``loss`` over its seeds (mean, sd, n) and the ``contrasts``, lowest loss first, their p from
    ``resamples`` bootstrap resamples."""

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


def bootstrap_p(
    differences: np.ndarray, tokens: np.ndarray, resamples: int, rng: np.random.Generator
) -> float:
    """Two-sided p of the paired bootstrap over sentences: ``differences (S, N)`` the summed NLL
    differences of N sentences on S seeds, ``tokens (N,)`` their target tokens; the statistic of a
    resample is the mean over seeds of the difference per token on the resampled sentences."""
    per_sentence = differences.mean(axis=0)
    n = len(tokens)
    lower = higher = 0
    for start in range(0, resamples, 1000):  # 1000 resamples at a time bound the memory
        idx = rng.integers(0, n, size=(min(1000, resamples - start), n))
        stats = per_sentence[idx].sum(axis=1) / tokens[idx].sum(axis=1)
        lower += int((stats <= 0).sum())
        higher += int((stats >= 0).sum())
    return min(1.0, 2 * (min(lower, higher) + 1) / (resamples + 1))


def bucket_contrasts(
    systems: dict[str, list[Entry]],
    baseline: str,
    bucket: tuple[int, int],
    resamples: int = 10_000,
    seed: int = 0,
) -> BucketComparison:
    """Every system of ``systems`` with seeds in common with ``baseline`` against it on
    ``bucket``.

    Raises:
        ValueError: the baseline is not among the systems, a run lacks its sentence losses,
            two runs' sentences differ, or the bucket holds no sentence (one line).
    """
    if baseline not in systems:
        raise ValueError(f"no system {baseline!r} to compare against; pick one of the sweep's")
    base = {e.run.seed: _losses(e) for e in systems[baseline]}
    idx = in_bucket(next(iter(base.values())), bucket)
    if not len(idx):
        raise ValueError(f"no sentence has a source of {bucket[0]} to {bucket[1] - 1} tokens")
    rng = np.random.default_rng(seed)
    contrasts = [
        _contrast(system, {e.run.seed: e for e in entries}, base, idx, resamples, rng)
        for system, entries in sorted(systems.items())
        if system != baseline and any(e.run.seed in base for e in entries)
    ]
    adjusted = holm({c.system: c.p for c in contrasts})
    corrected = [
        replace(c, p_holm=adjusted[c.system], verdict=_verdict(c.per_seed, adjusted[c.system]))
        for c in contrasts
    ]
    return BucketComparison(
        bucket,
        baseline,
        len(idx),
        mean_std(_bucket_loss(losses, idx) for losses in base.values()),
        sorted(corrected, key=lambda c: c.mean),
        resamples,
    )


def _contrast(
    system: str,
    runs: dict[int, Entry],
    base: dict[int, SentenceLosses],
    idx: np.ndarray,
    resamples: int,
    rng: np.random.Generator,
) -> BucketContrast:
    """One system's :class:`BucketContrast` before the correction (``p_holm`` = ``p``)."""
    seeds = tuple(sorted(s for s in runs if s in base))
    tokens = np.asarray(base[seeds[0]].target_tokens, dtype=float)[idx]
    rows, own = [], []
    for s in seeds:
        losses = _losses(runs[s])
        _same_sentences(losses, base[s], str(runs[s].run.path))
        rows.append(np.asarray(losses.nll)[idx] - np.asarray(base[s].nll)[idx])
        own.append(_bucket_loss(losses, idx))
    differences = np.stack(rows)
    per_seed = tuple(float(row.sum() / tokens.sum()) for row in differences)
    mean = statistics.fmean(per_seed)
    paired_base = [_bucket_loss(base[s], idx) for s in seeds]
    spreads = [statistics.stdev(v) for v in (own, paired_base) if len(v) >= 2]
    pooled = (sum(x * x for x in spreads) / 2) ** 0.5 if len(spreads) == 2 else None
    p = bootstrap_p(differences, tokens, resamples, rng)
    return BucketContrast(
        system,
        seeds,
        per_seed,
        mean,
        mean / pooled if pooled else None,
        mean_std(own),
        p,
        p,
        "",
    )


def _verdict(per_seed: Sequence[float], p_holm: float) -> str:
    if p_holm >= ALPHA:
        return NOISE
    if len(per_seed) < 2:
        return ONE_SEED
    if all(d < 0 for d in per_seed):
        return LOWER
    if all(d > 0 for d in per_seed):
        return HIGHER
    return NOT_EVERY_SEED


def contrast_table(comparison: BucketComparison) -> str:
    """The markdown table of a :class:`BucketComparison`, the baseline's loss in a line above."""
    low, high = comparison.bucket
    resamples = comparison.resamples
    mean, sd, _ = comparison.loss
    lines = [
        f"Sources of {low}-{high - 1} tokens ({comparison.sentences} sentences): "
        f"{comparison.baseline}'s loss {mean:.3f} ± {sd:.3f} nats per token; Δ = the system's "
        f"minus {comparison.baseline}'s, per seed; p from {resamples:,} paired bootstrap "
        f"resamples of the sentences (its floor, {_p(2 / (resamples + 1))}, where no resample "
        f"crossed zero), Holm over {len(comparison.contrasts)} systems.",
        "",
        "system | seeds | loss | Δ (mean) | Δ per seed | effect (sd) | p | p (Holm) | verdict",
        "--- | --- | --- | --- | --- | --- | --- | --- | ---",
    ]
    for c in comparison.contrasts:
        seeds = ", ".join(str(s) for s in c.seeds)
        per_seed = ", ".join(f"{d:+.3f}" for d in c.per_seed)
        effect = f"{c.effect:+.1f}" if c.effect is not None else "—"
        lines.append(
            f"{c.system} | {seeds} | {c.loss[0]:.3f} ± {c.loss[1]:.3f} | {c.mean:+.3f} | "
            f"{per_seed} | {effect} | {_p(c.p)} | {_p(c.p_holm)} | {c.verdict}"
        )
    return "\n".join(lines)


def _p(p: float) -> str:
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
    parser.add_argument("--bootstrap", type=int, default=10_000, help="resamples (10,000)")
    parser.add_argument("--seed", type=int, default=0, help="the resampling seed")
    parser.add_argument(
        "--eval",
        default=None,
        metavar="NAME",
        help="read the runs' standalone evaluation RUN/evals/NAME (RoPE's test-time scalings, "
        "say; a quoted glob pattern) instead of their own; the runs without it are left out",
    )
    args = parser.parse_args(argv)
    if not args.sweep.is_dir():
        raise SystemExit(f"error: no sweep directory {args.sweep}; pass the sweep's folder")
    try:
        runs = done_runs(args.sweep, args.eval)
        baseline = reference_of(runs, args.baseline)
        systems = systems_of(runs, args.split)
        bucket = parse_bucket(args.bucket)
        comparison = bucket_contrasts(systems, baseline, bucket, args.bootstrap, args.seed)
        print(contrast_table(comparison))
    except ValueError as err:  # ReportError among them
        raise SystemExit(f"error: {err}") from None

"""The extrapolation penalty: how much more test loss per token a model trained only on short
sources has than the same encoding trained on all lengths, by source-length bucket.

Longer sentences are harder for every model, so the loss by length alone mixes difficulty with
extrapolation; the difference between two sweeps at the same steps, token budget and seed
leaves the cost of having seen only short sources. Runs are paired by encoding and seed, and
the penalty of an encoding is the mean over its paired seeds.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posenc.analysis.report.runs import DONE, Run, find_run_dirs, load_run
from posenc.analysis.report.stats import bucket_label

#: a length bucket: (first source length in it, first one past it), in tokens incl. EOS
Bucket = tuple[int, int]


@dataclass
class Penalty:
    """One encoding's penalty: ``by_bucket[b]`` is the mean over ``seeds`` of the short-trained
    run's loss on bucket ``b`` minus the all-lengths run's."""

    pe: str
    seeds: list[int]
    by_bucket: dict[Bucket, float]


def done_runs(sweep: Path) -> list[Run]:
    """The finished runs of a sweep directory (its report directory left out)."""
    runs = [load_run(path, sweep) for path in find_run_dirs(sweep, sweep / "report")]
    return [run for run in runs if run.status == DONE]


def bucket_losses(run: Run, split: str) -> dict[Bucket, tuple[int, float]]:
    """``{(min, max): (sentences, loss)}`` of a run's ``split``; empty when the run scored no
    length buckets there."""
    buckets = run.metrics.get("splits", {}).get(split, {}).get("buckets") or []
    return {
        (int(b["min"]), int(b["max"])): (int(b["sentences"]), float(b["loss"]))
        for b in buckets
        if b.get("loss") is not None
    }


def penalties(short: Sequence[Run], full: Sequence[Run], split: str) -> list[Penalty]:
    """Every encoding of ``short`` that has a run of ``full`` with the same seed, with its mean
    penalty per bucket both scored; encodings in sorted order."""
    full_by_key = {(run.pe, run.seed): run for run in full}
    found = []
    for pe in sorted({run.pe for run in short}):
        pairs = [
            (run, full_by_key[(pe, run.seed)])
            for run in sorted(short, key=lambda r: r.seed)
            if run.pe == pe and (pe, run.seed) in full_by_key
        ]
        if not pairs:
            continue
        losses = [(bucket_losses(s, split), bucket_losses(f, split)) for s, f in pairs]
        shared = set.intersection(*(set(s) & set(f) for s, f in losses))
        by_bucket = {
            b: float(np.mean([s[b][1] - f[b][1] for s, f in losses])) for b in sorted(shared)
        }
        found.append(Penalty(pe, [s.seed for s, _ in pairs], by_bucket))
    return found


def penalty_table(
    short: Sequence[Run], full: Sequence[Run], split: str = "test", min_sentences: int = 20
) -> str:
    """The markdown table of :func:`penalties`: one row per encoding (``name (seeds 0, 1)``),
    one column per bucket with at least ``min_sentences`` sentences in every short-trained
    run, rows ordered by the penalty on the longest such bucket (smallest first). Encodings
    of ``short`` without a partner are named under the table.

    Raises:
        ValueError: when no encoding of ``short`` has a partner in ``full``.
    """
    found = penalties(short, full, split)
    if not found:
        raise ValueError(
            "no run of the short-trained sweep has a run of the all-lengths sweep with the same "
            "encoding and seed; train the same encodings and seeds in both"
        )
    sizes: dict[Bucket, int] = {}
    for run in short:
        for bucket, (sentences, _) in bucket_losses(run, split).items():
            sizes[bucket] = min(sizes.get(bucket, sentences), sentences)
    columns = [
        b
        for b in sorted(set.intersection(*(set(p.by_bucket) for p in found)))
        if sizes.get(b, 0) >= min_sentences
    ]
    if not columns:
        raise ValueError(f"no length bucket has {min_sentences} sentences in every run")
    found.sort(key=lambda p: p.by_bucket[columns[-1]])
    lines = [
        "encoding | " + " | ".join(bucket_label(*b) for b in columns),
        "--- | " + " | ".join("---" for _ in columns),
    ]
    for p in found:
        seeds = ", ".join(str(s) for s in p.seeds)
        label = f"{p.pe} (seed{'s' if len(p.seeds) > 1 else ''} {seeds})"
        lines.append(f"{label} | " + " | ".join(f"{p.by_bucket[b]:+.3f}" for b in columns))
    unpaired = sorted({run.pe for run in short} - {p.pe for p in found})
    if unpaired:
        lines.append("")
        lines.append(f"No all-lengths run with the same seed: {', '.join(unpaired)}.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """``python scripts/extrapolation_penalty.py SHORT_SWEEP FULL_SWEEP [--split test]
    [--min-sentences 20]``: prints the penalty table; a sweep without pairs exits with one
    line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("short", type=Path, help="the sweep trained on short sources only")
    parser.add_argument("full", type=Path, help="the sweep trained on all lengths")
    parser.add_argument("--split", default="test", help="the split scored (default: test)")
    parser.add_argument(
        "--min-sentences",
        type=int,
        default=20,
        help="leave out buckets with fewer sentences than this (default: 20)",
    )
    args = parser.parse_args(argv)
    for sweep in (args.short, args.full):
        if not sweep.is_dir():
            raise SystemExit(f"error: no sweep directory {sweep}; pass the sweep's folder")
    try:
        table = penalty_table(
            done_runs(args.short), done_runs(args.full), args.split, args.min_sentences
        )
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    print(table)

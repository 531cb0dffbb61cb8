"""The extrapolation penalty: how much more test loss per token a model trained only on short
sources has than the same system trained on all lengths, by source-length bucket.

Longer sentences are harder for every model, so the loss by length alone mixes difficulty with
extrapolation; the difference between two sweeps at the same steps, token budget and seed
leaves the cost of having seen only short sources. Systems are the report's (an encoding, a
variant with options, or a test-time variant ``rope [pi4]``: :func:`.report.runs.split_entries`),
paired by system and seed; a system the all-lengths sweep lacks is paired with its base there
(a test-time variant with its run's system, a variant with its encoding's default form), and
the table says so. The penalty of a system is the mean over its paired seeds, with their
standard deviation.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from posenc.analysis.report.runs import (
    DONE,
    Entry,
    Run,
    group_runs,
    load_run,
    split_entries,
)
from posenc.analysis.report.stats import Stats, bucket_label, mean_std
from posenc.runtime.rundir import find_run_dirs

#: a length bucket: (first source length in it, first one past it), in tokens incl. EOS
Bucket = tuple[int, int]


@dataclass
class Penalty:
    """One system's penalty: ``by_bucket[b]`` is the mean, standard deviation and count over
    ``seeds`` of the short-trained run's loss on bucket ``b`` minus that of ``partner``'s
    all-lengths run of the same seed."""

    system: str
    partner: str
    seeds: list[int]
    by_bucket: dict[Bucket, Stats]


def done_runs(sweep: Path, evaluation: str | None = None) -> list[Run]:
    """The finished runs of a sweep directory (its report directory left out), scored by their
    own evaluation or, with ``evaluation``, by their standalone one ``RUN/evals/<evaluation>``
    (the runs without it left out), as the report reads them."""
    found = find_run_dirs(sweep, sweep / "report")
    runs = [load_run(path, sweep, evaluation) for path in found]
    return [run for run in runs if run.status == DONE]


def bucket_losses(scores: dict) -> dict[Bucket, tuple[int, float]]:
    """``{(min, max): (sentences, loss)}`` of one split's scores; empty without length
    buckets."""
    buckets = scores.get("buckets") or []
    return {
        (int(b["min"]), int(b["max"])): (int(b["sentences"]), float(b["loss"]))
        for b in buckets
        if b.get("loss") is not None
    }


def systems_of(runs: Sequence[Run], split: str) -> dict[str, list[Entry]]:
    """The report's systems of ``runs`` on ``split`` (labels as :func:`.runs.group_runs`)."""
    return split_entries(group_runs(list(runs)), split)


def partner_of(system: str, run: Run, full: dict[str, list[Entry]]) -> str | None:
    """The all-lengths system ``system`` (one of ``run``'s) is measured against: itself, else
    its run's group (``rope`` for the test-time ``rope [pi4]``), else its encoding's default
    form; None when ``full`` has none."""
    return next((name for name in (system, run.label, run.pe) if name in full), None)


def penalties(short: dict[str, list[Entry]], full: dict[str, list[Entry]]) -> list[Penalty]:
    """Every system of ``short`` (:func:`systems_of` the short-trained runs) with a partner
    (:func:`partner_of`) that has runs of the same seeds in ``full``, with its penalty per
    bucket both scored; systems in sorted order."""
    found = []
    for system in sorted(short):
        entries = short[system]
        partner = partner_of(system, entries[0].run, full)
        if partner is None:
            continue
        by_seed = {entry.run.seed: entry for entry in full[partner]}
        paired = [e for e in sorted(entries, key=lambda e: e.run.seed) if e.run.seed in by_seed]
        if not paired:
            continue
        pairs = [
            (bucket_losses(e.scores), bucket_losses(by_seed[e.run.seed].scores)) for e in paired
        ]
        shared = set.intersection(*(set(s) & set(f) for s, f in pairs))
        by_bucket = {b: mean_std(s[b][1] - f[b][1] for s, f in pairs) for b in sorted(shared)}
        found.append(Penalty(system, partner, [e.run.seed for e in paired], by_bucket))
    return found


def penalty_table(
    short: Sequence[Run], full: Sequence[Run], split: str = "test", min_sentences: int = 20
) -> str:
    """The markdown table of :func:`penalties`: one row per system (``name (seeds 0, 1)``), one
    column per bucket with at least ``min_sentences`` sentences in every short-trained run,
    each cell the mean ± the seeds' standard deviation, rows ordered by the penalty on the
    longest such bucket (smallest first). The systems measured against another system's
    all-lengths runs and those without a partner are named under the table.

    Raises:
        ValueError: when no system of ``short`` has a partner in ``full``.
    """
    short_systems = systems_of(short, split)
    found = penalties(short_systems, systems_of(full, split))
    if not found:
        raise ValueError(
            "no run of the short-trained sweep has a run of the all-lengths sweep with the same "
            "encoding and seed; train the same encodings and seeds in both"
        )
    sizes: dict[Bucket, int] = {}
    for entries in short_systems.values():
        for entry in entries:
            for bucket, (sentences, _) in bucket_losses(entry.scores).items():
                sizes[bucket] = min(sizes.get(bucket, sentences), sentences)
    columns = [
        b
        for b in sorted(set.intersection(*(set(p.by_bucket) for p in found)))
        if sizes.get(b, 0) >= min_sentences
    ]
    if not columns:
        raise ValueError(f"no length bucket has {min_sentences} sentences in every run")
    found.sort(key=lambda p: p.by_bucket[columns[-1]][0])
    lines = [
        "system | " + " | ".join(bucket_label(*b) for b in columns),
        "--- | " + " | ".join("---" for _ in columns),
    ]
    for p in found:
        seeds = ", ".join(str(s) for s in p.seeds)
        label = f"{p.system} (seed{'s' if len(p.seeds) > 1 else ''} {seeds})"
        cells = [_cell(p.by_bucket[b]) for b in columns]
        lines.append(f"{label} | " + " | ".join(cells))
    borrowed = [f"{p.system} against {p.partner}" for p in found if p.partner != p.system]
    unpaired = sorted(set(short_systems) - {p.system for p in found})
    notes = []
    if borrowed:
        notes.append(f"Not trained on all lengths, so measured against: {'; '.join(borrowed)}.")
    if unpaired:
        notes.append(f"No all-lengths run with the same seed: {', '.join(unpaired)}.")
    return "\n".join(lines + ([""] + notes if notes else []))


def _cell(stats: Stats) -> str:
    mean, std, n = stats
    return f"{mean:+.3f} ± {std:.3f}" if n > 1 else f"{mean:+.3f}"


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m study extrapolation-penalty SHORT_SWEEP FULL_SWEEP [--split test]
    [--min-sentences 20] [--eval NAME]``: prints the penalty table; a sweep without pairs
    exits with one line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("short", type=Path, help="the sweep trained on short sources only")
    parser.add_argument("full", type=Path, help="the sweep trained on all lengths")
    parser.add_argument("--split", default="test", help="the split scored (default: test)")
    parser.add_argument(
        "--eval",
        default=None,
        metavar="NAME",
        help="score the short-trained runs' standalone evaluation RUN/evals/NAME (RoPE's "
        "test-time scalings, say) instead of their own; NAME may be a glob pattern, quoted "
        "(the folder's digest differs between seeds)",
    )
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
            done_runs(args.short, args.eval),
            done_runs(args.full),
            args.split,
            args.min_sentences,
        )
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    print(table)

"""The whole report of a sweep (:func:`build_report`) and its command line (:func:`main`, run by
``scripts/report.py``)."""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from posenc.analysis.report.benchtime import add_bench_curves, read_bench
from posenc.analysis.report.clean import SUFFIX, clean_entries
from posenc.analysis.report.html import write_html
from posenc.analysis.report.reading import reading
from posenc.analysis.report.render import Heading, Table, Text, Writer, palette
from posenc.analysis.report.runs import (
    ReportError,
    Run,
    first_line,
    group_runs,
    load_run,
    reference_of,
    split_entries,
    split_names,
)
from posenc.analysis.report.sections_by_encoding import (
    section_attention,
    section_bench_cost,
    section_cost,
    section_curves,
    section_runs,
    section_setup,
)
from posenc.analysis.report.sections_by_split import split_sections
from posenc.analysis.report.stats import system_order
from posenc.runtime.cli import one_line_errors
from posenc.runtime.files import temporary_folder, write_text
from posenc.runtime.hparams import (
    sweeps_parent,
    write_all_sweeps_experiment,
    write_sweep_experiment,
)
from posenc.runtime.rundir import find_run_dirs
from posenc.runtime.untrusted import UntrustedFileError


@dataclass
class Report:
    """A written report: ``report.md``'s path, its reading paragraph, and the focus split's
    score table (None when no run is finished yet)."""

    path: Path
    reading: str
    scores: Table | None


def refresh_hparams(sweep: Path) -> str:
    """Rewrite the sweep's TensorBoard experiment summary from every run's session under it
    (:func:`posenc.runtime.hparams.write_sweep_experiment`): the HParams tab then compares the
    runs even where no job wrote it (runs trained outside a multirun, copied together, or a job
    killed before it); returns the report's sentence about it."""
    try:
        written = write_sweep_experiment(sweep)
        if (parent := sweeps_parent(sweep)) is not None:
            write_all_sweeps_experiment(parent)
    except OSError as err:
        return f"TensorBoard's HParams summary could not be written: {first_line(err)}."
    if written is None:
        return "No run has an HParams session for TensorBoard yet (runs log one when evaluated)."
    return (
        f"TensorBoard: `tensorboard --logdir {shown(sweep)}`; its HParams tab compares every "
        f"evaluated run (the sweep's experiment summary is `{written.name}/`)."
    )


def shown(path: Path) -> str:
    """``path`` as a reader types it: relative to the working directory where it lies inside
    it, from ``~`` where it lies in the home directory, else whole (no machine's layout
    is printed where a relative path serves)."""
    for base, prefix in ((Path.cwd(), ""), (Path.home(), "~/")):
        if path.is_relative_to(base) and path != base:
            return prefix + str(path.relative_to(base))
    return str(path)


def build_report(
    sweep: Path,
    out: Path | None = None,
    focus: str = "test",
    samples: int = 1000,
    evaluation: str | None = None,
    reference: str | None = None,
    bench: Path | None = None,
) -> Report:
    """Write the report of the sweep in ``sweep`` into ``out`` (default ``sweep/report``):
    ``report.md``, the same as one self-contained page ``report.html`` (:mod:`.html`),
    ``report.csv``, ``reading.txt`` and the figures. Scores come from each run's
    own evaluation, or from its standalone evaluation ``RUN/evals/<evaluation>/``; ``samples``
    paired bootstrap resamples; cost ratios against ``reference`` (default: the runs'
    ``reference_pe``); with ``bench`` (a benchmark's JSON) the learning curves are also drawn
    against benchmark time (:mod:`.benchtime`). Returns what was written (:class:`Report`).

    Raises:
        ReportError: ``sweep`` is no directory, holds no run, no run has the ``focus`` split,
            ``samples`` is not positive, or the runs disagree on ``reference_pe`` and no
            ``reference`` is given.
    """
    sweep = sweep.expanduser().resolve()
    if not sweep.is_dir():
        raise ReportError(f"{sweep} is not a directory")
    if samples < 1:
        raise ReportError(f"--bootstrap must be a positive number of resamples, not {samples}")
    if out is None and (sweep / "report").is_symlink():
        raise ReportError(
            f"{sweep / 'report'} is a symbolic link; the report writes nothing through links in "
            "a sweep: remove it or choose a directory with --out"
        )
    out = out.expanduser().resolve() if out else sweep / "report"
    runs = [load_run(path, sweep, evaluation) for path in find_run_dirs(sweep, out)]
    if not runs:
        raise ReportError(f"no run directory (one with a config.yaml) under {sweep}")
    splits = split_names(runs, focus.removesuffix(SUFFIX))
    reference = reference_of(runs, reference)
    out.mkdir(parents=True, exist_ok=True)
    staging = temporary_folder(out.parent, f".{out.name}.")
    try:  # written aside and moved in whole: an interrupted report leaves the old one as it was
        report = _write(sweep, staging, runs, splits, focus, samples, reference, bench)
        move_into(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Report(out / report.path.name, report.reading, report.scores)


def _write(
    sweep: Path,
    out: Path,
    runs: list[Run],
    splits: list[str],
    focus: str,
    samples: int,
    reference: str,
    bench: Path | None,
) -> Report:
    """:func:`build_report`'s writing, into ``out``."""
    groups = group_runs(runs)
    bench_note, times = None, None
    if bench is not None:
        times = read_bench(bench)
        missing, borrowed = add_bench_curves(runs, times.train)
        bench_note = (
            f"`{bench.name}` ({times.shape})"
            + (f"; not measured there, so not drawn: {', '.join(missing)}" if missing else "")
            + (
                f"; variants not measured there, drawn with their encoding's step: "
                f"{', '.join(borrowed)}"
                if borrowed
                else ""
            )
        )
    systems = {split: split_entries(groups, split) for split in splits}
    clean = {  # a clean split where no run's set leaks would repeat its split
        name: per
        for name, per in clean_entries(groups, splits, out).items()
        if per != systems[name.removesuffix(SUFFIX)]
    }
    systems.update(clean)
    splits = sorted(splits + list(clean), key=lambda split: split != focus)
    if splits and focus not in splits:
        raise ReportError(f"split {focus!r} has no clean part: no run's held-out set leaks")
    order = system_order(systems[focus]) if splits else []
    groups.sort(key=lambda g: (order.index(g.label) if g.label in order else len(order), g.label))
    styles = palette([g.label for g in groups] + [s for per in systems.values() for s in per])

    w = Writer(out)
    w.heading(f"Sweep report: {sweep.name}", 1)
    w.text(
        f"Sweep `{shown(sweep)}`; focus split `{focus}`; "
        f"splits: {', '.join(splits) or 'none yet'}. Every number of the tables is also in "
        "`report.csv`. " + refresh_hparams(sweep)
    )
    top = len(w.blocks)
    section_runs(w, runs, groups, focus)
    section_curves(w, groups, styles, bench_note)
    scores = split_sections(w, splits, systems, runs, samples, styles)
    section_cost(w, groups, focus, reference)
    if times is not None:
        section_bench_cost(w, groups, reference, times, bench.name)
    section_attention(w, groups)
    section_setup(w, runs)
    summary = reading(w.rows, splits)
    w.insert(top, Heading("Reading"), Text([summary]))
    write_text(out / "reading.txt", summary + "\n")
    path = w.save()
    write_html(w.blocks, out)
    return Report(path, summary, scores)


def move_into(staging: Path, out: Path) -> None:
    """Move every file under ``staging`` to the same place under ``out``, replacing what is
    there (other files of ``out`` stay)."""
    for path in sorted(staging.rglob("*")):
        if path.is_file():
            target = out / path.relative_to(staging)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)


def scores_summary(scores: Table | None) -> str:
    """The focus split's score table as markdown lines (printed at the end of ``make demo``);
    empty when no run is finished yet."""
    return "\n".join(scores.markdown()) if scores else ""


def main(argv: Sequence[str] | None = None) -> None:
    """``python scripts/report.py SWEEP_DIR [--out DIR] [--split test] [--bootstrap N]
    [--eval NAME] [--reference NAME]``: writes the report, then prints the focus split's score
    table, the reading and ``report: PATH``. A :class:`ReportError` exits with one line."""
    parser = argparse.ArgumentParser(
        description="Report of a sweep: report.md, report.html, PNGs, report.csv."
    )
    parser.add_argument("sweep", type=Path, help="the sweep directory (runs in subdirectories)")
    parser.add_argument("--out", type=Path, default=None, help="default: SWEEP/report")
    parser.add_argument("--split", default="test", help="the focus split (default: test)")
    parser.add_argument(
        "--bootstrap", type=int, default=1000, help="paired bootstrap resamples (default: 1000)"
    )
    parser.add_argument(
        "--eval",
        default=None,
        metavar="NAME",
        help="score each run's standalone evaluation RUN/evals/NAME instead of its own (NAME "
        "may be a glob pattern, quoted: its folder's digest differs between seeds)",
    )
    parser.add_argument(
        "--reference",
        default=None,
        metavar="NAME",
        help="the encoding cost ratios are measured against (default: the runs' reference_pe)",
    )
    parser.add_argument(
        "--bench",
        type=Path,
        default=None,
        metavar="JSON",
        help="a quiet benchmark at the runs' shape (scripts/bench.py): also draw the curves "
        "against each encoding's benchmarked step time x steps",
    )
    args = parser.parse_args(argv)
    with one_line_errors("report", known=(UntrustedFileError,)):
        try:
            report = build_report(
                args.sweep,
                args.out,
                args.split,
                args.bootstrap,
                args.eval,
                args.reference,
                args.bench,
            )
        except ReportError as err:
            raise SystemExit(f"error: {err}") from None
    print(scores_summary(report.scores))
    print()
    print(report.reading + "\n")
    print(f"report: {report.path}")

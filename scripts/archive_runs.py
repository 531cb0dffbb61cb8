"""Keep a sweep's finished runs as text in the repository, since ``outputs/`` may not outlive the
machine it was written on, and put them back before the sweep resumes.

    python scripts/archive_runs.py save outputs/sweeps/compare docs/study/runs/compare
    python scripts/archive_runs.py restore docs/study/runs/compare outputs/sweeps/compare

``save`` copies, for every run trained and evaluated to its last step, the files a report reads
(:data:`ARCHIVED`: settings, scores, training summary, hypotheses, ``scalars.csv`` of the curves,
standalone evaluations under ``evals/``), never checkpoints or TensorBoard events, with paths
inside the checkout the runs were made in written relative to it and the home directory ``~``
(:mod:`posenc.analysis.portable`); a continued run replaces its archived files, and a file the
run lacks is never deleted from the archive (a ``scalars.csv`` made from the events of a run that
had none stays). ``restore`` copies archived runs
into a sweep that lacks them, never over a run that is there. A restored run answers "nothing to
do" to the same settings and budget, and ``scripts/report.py`` reads its curves from
``scalars.csv``. Symbolic links are never followed or copied.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posenc.analysis.portable import portable

#: the files of a run (and of each ``evals/NAME/``) kept as text, as glob patterns
ARCHIVED = (
    "config.yaml",
    "eval_config.yaml",
    "metrics.json",
    "train_summary.json",
    "hypotheses.*.txt",
    "scalars.csv",
)


def archived_files(run: Path) -> list[Path]:
    """The files of ``run`` that are archived, relative to it, sorted (links left out)."""
    found: set[Path] = set()
    for folder in [run, *sorted((run / "evals").glob("*"))]:
        if folder.is_symlink() or not folder.is_dir():
            continue
        for pattern in ARCHIVED:
            found.update(
                p.relative_to(run)
                for p in folder.glob(pattern)
                if p.is_file() and not p.is_symlink()
            )
    return sorted(found)


def is_finished(run: Path) -> bool:
    """Whether ``run`` holds its evaluation and training summary (a finished run)."""
    return all(
        (run / name).is_file() for name in ("config.yaml", "metrics.json", "train_summary.json")
    )


def run_dirs(sweep: Path) -> list[Path]:
    """The run directories directly under ``sweep`` (those with a ``config.yaml``), sorted."""
    if not sweep.is_dir():
        sys.exit(f"archive_runs: {sweep} is not a directory; name a sweep directory")
    return sorted(
        p
        for p in sweep.iterdir()
        if p.is_dir() and not p.is_symlink() and (p / "config.yaml").is_file()
    )


def copy_run(source: Path, target: Path, roots: tuple[Path, ...] = ()) -> bool:
    """Copy ``source``'s archived files into ``target`` (``roots``: the checkouts whose paths
    are made relative); whether anything changed."""
    changed = False
    for relative in archived_files(source):
        text = portable((source / relative).read_bytes(), roots)
        destination = target / relative
        if destination.is_file() and destination.read_bytes() == text:
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes(text)
        changed = True
    return changed


def checkout_of(sweep: Path) -> Path:
    """The checkout a sweep ``.../outputs/sweeps/NAME`` was made in (its runs' relative paths
    are relative to it); the sweep's parent for any other layout."""
    sweep = sweep.resolve()
    for parent in sweep.parents:
        if parent.name == "outputs":
            return parent.parent
    return sweep.parent


def save(sweep: Path, archive: Path) -> None:
    """Archive every finished run of ``sweep`` under ``archive/<run name>/``."""
    for run in run_dirs(sweep):
        if is_finished(run) and copy_run(run, archive / run.name, (checkout_of(sweep),)):
            print(f"archived {run.name}")


def restore(archive: Path, sweep: Path) -> None:
    """Copy archived runs into ``sweep`` where it has no directory of that name."""
    for run in run_dirs(archive):
        if (sweep / run.name).exists():
            continue
        copy_run(run, sweep / run.name)
        print(f"restored {run.name}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("save", "restore"))
    parser.add_argument("source", type=Path, help="the sweep (save) or the archive (restore)")
    parser.add_argument("target", type=Path, help="the archive (save) or the sweep (restore)")
    args = parser.parse_args(argv)
    if args.action == "save":
        save(args.source, args.target)
    else:
        restore(args.source, args.target)


if __name__ == "__main__":
    main()

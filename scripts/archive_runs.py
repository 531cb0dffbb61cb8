"""Keep a sweep's finished runs as text in the repository, since ``outputs/`` may not outlive the
machine it was written on, and put them back before the sweep resumes.

    python scripts/archive_runs.py save outputs/sweeps/compare docs/study/runs/compare
    python scripts/archive_runs.py restore docs/study/runs/compare outputs/sweeps/compare

``save`` copies, for every run trained and evaluated to its last step, the files a report reads
(:data:`ARCHIVED`: settings, scores, training summary, hypotheses, sentence losses,
``scalars.csv`` of the curves, standalone evaluations under ``evals/``), never checkpoints or
TensorBoard events, with paths inside the checkout the runs were made in written relative to it
and the home directory ``~``
(:mod:`posenc.analysis.portable`); a continued run replaces its archived files, and a file the
run lacks is never deleted from the archive (a ``scalars.csv`` made from the events of a run that
had none stays). ``restore`` copies archived runs
into a sweep that lacks them, never over a run that is there, each whole or not at all (into a
hidden folder first, renamed into place). An archive is untrusted input: links are never
followed, a file over :data:`MAX_FILE_BYTES` or not a regular file leaves its run out (one
line saying which), nothing is read whole into memory beyond that cap. A restored run answers
"nothing to do" to the same settings and budget, and ``scripts/report.py`` reads its curves
from ``scalars.csv``. Symbolic links are never followed or copied.

The references a run was scored against (``references.*.txt``, the same for every run of a
data set) are kept once per archive, by content, in ``ARCHIVE/references/<digest>.txt``; each
run's ``references.json`` maps its files to them, and ``restore`` writes them back, so the
report compares restored runs on their sentences too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

from posenc.analysis.portable import portable
from posenc.runtime.untrusted import UntrustedFileError, read_bytes

#: the largest file archived or restored (newstest2014's hypotheses are about 0.4 MB)
MAX_FILE_BYTES = 100_000_000

#: the files of a run (and of each ``evals/NAME/``) kept as text, as glob patterns
ARCHIVED = (
    "config.yaml",
    "eval_config.yaml",
    "metrics.json",
    "train_summary.json",
    "hypotheses.*.txt",
    "losses.*.tsv",
    "scalars.csv",
)


#: the files kept once per archive by content (see the module docstring)
SHARED = ("references.*.txt",)
REFERENCES = "references"  # the archive's folder of shared files
REFERENCE_MAP = "references.json"  # a run's map from its shared files to their digests


def archived_files(run: Path, patterns: tuple[str, ...] = ARCHIVED) -> list[Path]:
    """The files of ``run`` matching ``patterns`` (default :data:`ARCHIVED`), relative to it,
    sorted (links left out, and hidden folders: an evaluation still running writes into
    ``evals/.NAME.XXXX/``, renamed to ``evals/NAME/`` once complete)."""
    found: set[Path] = set()
    evals = [] if (run / "evals").is_symlink() else sorted((run / "evals").glob("*"))
    for folder in [run, *evals]:
        if folder.is_symlink() or not folder.is_dir() or folder.name.startswith("."):
            continue
        for pattern in patterns:
            found.update(
                p.relative_to(run)
                for p in folder.glob(pattern)
                if p.is_file() and not p.is_symlink()
            )
    return sorted(found)


def save_shared(source: Path, target: Path, store: Path) -> bool:
    """Keep ``source``'s shared files in ``store`` by content and their map in
    ``target/references.json`` (entries of files the run lacks stay); whether it changed."""
    path = target / REFERENCE_MAP
    mapping = json.loads(path.read_text()) if path.is_file() else {}
    before = dict(mapping)
    for relative in archived_files(source, SHARED):
        data = read_bytes(source / relative, MAX_FILE_BYTES)
        digest = hashlib.sha256(data).hexdigest()[:16]
        stored = store / f"{digest}.txt"
        if not stored.is_file():
            stored.parent.mkdir(parents=True, exist_ok=True)
            stored.write_bytes(data)
        mapping[str(relative)] = digest
    if mapping == before:
        return False
    target.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(mapping, indent=1, sort_keys=True) + "\n")
    return True


def restore_shared(archived: Path, target: Path, store: Path) -> None:
    """Write the shared files of ``archived/references.json`` from ``store`` into ``target``
    (an entry naming a path outside the run, or a missing file, is left out)."""
    path = archived / REFERENCE_MAP
    if not path.is_file():
        return
    for relative, digest in json.loads(path.read_text()).items():
        stored = store / f"{digest}.txt"
        destination = (target / relative).resolve()
        inside = destination.is_relative_to(target.resolve())
        if inside and stored.is_file() and "/" not in digest:
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(read_bytes(stored, MAX_FILE_BYTES))


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
        text = portable(read_bytes(source / relative, MAX_FILE_BYTES), roots)
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
        if not is_finished(run):
            continue
        try:
            changed = copy_run(run, archive / run.name, (checkout_of(sweep),))
            if save_shared(run, archive / run.name, archive / REFERENCES) or changed:
                print(f"archived {run.name}")
        except UntrustedFileError as err:
            print(f"not archived {run.name}: {err}")


def restore(archive: Path, sweep: Path) -> None:
    """Copy archived runs into ``sweep`` where it has no directory of that name."""
    sweep.mkdir(parents=True, exist_ok=True)
    for run in run_dirs(archive):
        if (sweep / run.name).exists():
            continue
        work = Path(tempfile.mkdtemp(prefix=f".{run.name}.", dir=sweep))
        try:
            copy_run(run, work)
            restore_shared(run, work, archive / REFERENCES)
            work.rename(sweep / run.name)
            print(f"restored {run.name}")
        except UntrustedFileError as err:
            print(f"not restored {run.name}: {err}")
        finally:
            shutil.rmtree(work, ignore_errors=True)


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

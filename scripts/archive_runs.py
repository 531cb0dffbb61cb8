"""Keep a sweep's finished runs as text in the repository, since ``outputs/`` may not outlive the
machine it was written on, and put them back before the sweep resumes.

    python scripts/archive_runs.py save outputs/sweeps/compare docs/study/runs/compare
    python scripts/archive_runs.py restore docs/study/runs/compare outputs/sweeps/compare
    python scripts/archive_runs.py compress docs/study/runs/compare

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

The bulky files (:data:`COMPRESSED`: hypotheses, sentence losses, curves, and the shared
references) are kept gzip-compressed as ``NAME.gz`` (written reproducibly: no time stamp or file
name inside); ``restore`` writes them back as they were. ``compress`` converts an archive kept
before that in place; ``restore`` reads either form.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
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


#: the files of :data:`ARCHIVED` kept compressed, as ``NAME.gz`` (the shared ones are too)
COMPRESSED = ("hypotheses.*.txt", "losses.*.tsv", "scalars.csv")
GZ = ".gz"


def compressed(name: str) -> bool:
    """Whether a file called ``name`` is kept compressed in an archive."""
    return any(Path(name).match(pattern) for pattern in COMPRESSED)


def packed(data: bytes) -> bytes:
    """``data`` gzip-compressed, the same bytes for the same data (no time stamp, no name)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as handle:
        handle.write(data)
    return buffer.getvalue()


def read_archived(path: Path) -> bytes:
    """The content of an archived file: ``path`` itself, or ``path.gz`` unpacked (at most
    :data:`MAX_FILE_BYTES` either way).

    Raises:
        UntrustedFileError: the file is too large, unpacks beyond the cap, or is no gzip.
    """
    packed_path = path.with_name(path.name + GZ)
    if not packed_path.is_file() or packed_path.is_symlink():
        return read_bytes(path, MAX_FILE_BYTES)
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(read_bytes(packed_path, MAX_FILE_BYTES))) as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except (OSError, EOFError) as err:
        raise UntrustedFileError(packed_path, f"is no gzip file ({err})", "restore it") from None
    if len(data) > MAX_FILE_BYTES:
        raise UntrustedFileError(
            packed_path, f"unpacks to more than {MAX_FILE_BYTES} bytes", "remove it"
        )
    return data


def write_archived(path: Path, data: bytes, pack: bool | None = None) -> bool:
    """Keep ``data`` as the archived file ``path``, compressed as ``path.gz`` when ``pack``
    (default: when :func:`compressed`), the other form removed; whether anything changed."""
    pack = compressed(path.name) if pack is None else pack
    target = path.with_name(path.name + GZ) if pack else path
    other = path if target != path else path.with_name(path.name + GZ)
    content = packed(data) if target != path else data
    unchanged = target.is_file() and target.read_bytes() == content
    if not unchanged:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    if other.is_file():
        other.unlink()
        return True
    return not unchanged


#: the files kept once per archive by content (see the module docstring)
SHARED = ("references.*.txt",)
REFERENCES = "references"  # the archive's folder of shared files
REFERENCE_MAP = "references.json"  # a run's map from its shared files to their digests


def archived_files(run: Path, patterns: tuple[str, ...] = ARCHIVED) -> list[Path]:
    """The files of ``run`` matching ``patterns`` (default :data:`ARCHIVED`), relative to it,
    sorted (links left out, and hidden folders: an evaluation still running writes into
    ``evals/.NAME.XXXX/``, renamed to ``evals/NAME/`` once complete). In an archive a
    compressed file ``NAME.gz`` counts as ``NAME``."""
    patterns = (*patterns, *(pattern + GZ for pattern in patterns))
    found: set[Path] = set()
    evals = [] if (run / "evals").is_symlink() else sorted((run / "evals").glob("*"))
    for folder in [run, *evals]:
        if folder.is_symlink() or not folder.is_dir() or folder.name.startswith("."):
            continue
        for pattern in patterns:
            found.update(
                p.relative_to(run).with_suffix("") if p.suffix == GZ else p.relative_to(run)
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
        if not stored.is_file() and not stored.with_name(stored.name + GZ).is_file():
            write_archived(stored, data, pack=True)
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
        present = stored.is_file() or stored.with_name(stored.name + GZ).is_file()
        if inside and present and "/" not in digest:
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(read_archived(stored))


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
    """Archive a run's files from ``source`` into ``target`` (``roots``: the checkouts whose
    paths are made relative); whether anything changed."""
    changed = False
    for relative in archived_files(source):
        text = portable(read_bytes(source / relative, MAX_FILE_BYTES), roots)
        changed |= write_archived(target / relative, text)
    return changed


def unpack_run(archived: Path, target: Path) -> None:
    """Write an archived run's files from ``archived`` into ``target`` as the run had them."""
    for relative in archived_files(archived):
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes(read_archived(archived / relative))


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
            unpack_run(run, work)
            restore_shared(run, work, archive / REFERENCES)
            work.rename(sweep / run.name)
            print(f"restored {run.name}")
        except UntrustedFileError as err:
            print(f"not restored {run.name}: {err}")
        finally:
            shutil.rmtree(work, ignore_errors=True)


def compress(archive: Path) -> None:
    """Keep the bulky files of an archive kept before compression compressed (in place)."""
    store = archive / REFERENCES
    for folder in [*run_dirs(archive), store]:
        if not folder.is_dir():
            continue
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
            if path.suffix != GZ and (folder == store or compressed(path.name)):
                write_archived(path, read_bytes(path, MAX_FILE_BYTES), pack=True)
    print(f"compressed {archive}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("save", "restore", "compress"))
    parser.add_argument(
        "source", type=Path, help="the sweep (save) or the archive (restore, compress)"
    )
    parser.add_argument(
        "target", type=Path, nargs="?", help="the archive (save) or the sweep (restore)"
    )
    args = parser.parse_args(argv)
    if args.action == "compress":
        compress(args.source)
    elif args.target is None:
        parser.error(f"{args.action} needs a target: the archive (save) or the sweep (restore)")
    elif args.action == "save":
        save(args.source, args.target)
    else:
        restore(args.source, args.target)


if __name__ == "__main__":
    main()

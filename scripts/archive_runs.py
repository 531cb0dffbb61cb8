"""Keep a sweep's finished runs in the repository, one compressed archive per sweep, since
``outputs/`` may not outlive the machine it was written on, and put them back before the sweep
resumes.

    python scripts/archive_runs.py save outputs/sweeps/compare docs/study/runs/compare.tar.xz
    python scripts/archive_runs.py restore docs/study/runs/compare.tar.xz outputs/sweeps/compare

``save`` keeps, for every run trained and evaluated to its last step, the files a report reads
(:data:`ARCHIVED`: settings, scores, training summary, hypotheses, sentence losses,
``scalars.csv`` of the curves, standalone evaluations under ``evals/``; with ``--trained`` also
every run trained to its last step whose evaluation never finished, its settings, training
summary and curves alone, which the report shows as "trained, not evaluated"), never
checkpoints or
TensorBoard events, with paths inside the checkout the runs were made in written relative to it
and the home directory ``~`` (:mod:`posenc.analysis.portable`); a continued run replaces its
archived files, and a file the run lacks is never deleted from the archive (a ``scalars.csv``
made from the events of a run that had none stays). ``restore`` writes archived runs into a
sweep that lacks them, never over a run that is there, each whole or not at all (into a hidden
folder first, renamed into place). A restored run answers "nothing to do" to the same settings
and budget, and ``scripts/report.py`` reads its curves from ``scalars.csv``.

The references a run was scored against (``references.*.txt``, the same for every run of a
data set) are kept once per archive, by content, as ``references/<digest>.txt``; each run's
``references.json`` maps its files to them, and ``restore`` writes them back, so the report
compares restored runs on their sentences too.

The archive is one tar file compressed with xz, solid: the hypotheses of different runs for
the same sentences compress against each other. Its members are ordered by file name, then
path, so alike files lie within the compressor's window, and it is written reproducibly (no
time stamps, owners or modes: the same runs give the same bytes) and atomically, only when its
content changed. An archive is untrusted input: a member that is not a regular file, has a
path that is absolute, holds a doubled slash, is hidden or climbs out with ``..``, or is over
:data:`MAX_FILE_BYTES` leaves its run out (one line saying which); an archive over
:data:`MAX_ARCHIVE_BYTES`, packed or unpacked, or no xz-compressed tar is refused whole. Links
in a sweep are never followed.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import shutil
import sys
import tarfile
from collections import defaultdict
from pathlib import Path, PurePosixPath

from posenc.analysis.portable import portable
from posenc.runtime.files import inside, replacing, temporary_folder
from posenc.runtime.untrusted import UntrustedFileError, read_bytes

#: the largest file archived or restored (newstest2014's hypotheses are about 0.4 MB)
MAX_FILE_BYTES = 100_000_000
#: the largest archive, packed or unpacked (compare's runs unpack to about 180 MB)
MAX_ARCHIVE_BYTES = 2_000_000_000
#: xz's preset: its 64 MiB window holds every run's hypotheses of one test set
XZ_PRESET = 9

#: the files of a run (and of each ``evals/NAME/``) archived, as glob patterns
ARCHIVED = (
    "config.yaml",
    "eval_config.yaml",
    "metrics.json",
    "train_summary.json",
    "hypotheses.*.txt",
    "losses.*.tsv",
    "valid_losses.tsv",
    "scalars.csv",
)
#: the files of a run trained but not evaluated (``save --trained``): its training alone, no
#: half-written evaluation
TRAINED = ("config.yaml", "train_summary.json", "valid_losses.tsv", "scalars.csv")
#: the files kept once per archive by content (see the module docstring)
SHARED = ("references.*.txt",)
REFERENCES = "references"  # the archive's folder of shared files
REFERENCE_MAP = "references.json"  # a run's map from its shared files to their digests

SUFFIX = ".tar.xz"  # an archive's file name ends so
Files = dict[str, bytes]  # an archive's content: member path -> bytes


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


def shown(name: str) -> str:
    """``name`` as a line may hold it: control characters (a newline would forge a log line)
    escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in name)


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why ``member`` may not be restored, or None when it may."""
    path = PurePosixPath(member.name)
    if not member.name.isprintable():
        return f"{shown(member.name)} holds a control character"
    if not member.isfile():
        return f"{member.name} is not a regular file"
    # the name as written, not as PurePosixPath folds it: RUN//tmp/x would be read as RUN/tmp/x,
    # and the part after RUN/ joined onto a folder as the absolute path /tmp/x
    if path.is_absolute() or "\\" in member.name or "//" in member.name:
        return f"{member.name} is not a relative path"
    if any(part in ("", ".", "..") or part.startswith(".") for part in path.parts):
        return f"{member.name} is hidden or climbs out of the archive"
    if member.size > MAX_FILE_BYTES:
        return f"{member.name} is larger than {MAX_FILE_BYTES:,} bytes"
    return None


def load(archive: Path) -> tuple[Files, dict[str, str]]:
    """The members of ``archive`` (none when it does not exist) and the runs left out, each
    with the reason (see the module docstring).

    Raises:
        UntrustedFileError: the archive is too large, unpacked or not, or no xz-compressed tar.
    """
    if not archive.exists() and not archive.is_symlink():
        return {}, {}
    data = read_bytes(archive, MAX_ARCHIVE_BYTES)
    files: Files = {}
    refused: dict[str, str] = {}
    try:
        unpacker = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        tar_bytes = unpacker.decompress(data, max_length=MAX_ARCHIVE_BYTES + 1)
        if len(tar_bytes) > MAX_ARCHIVE_BYTES:
            raise UntrustedFileError(
                archive, f"unpacks to more than {MAX_ARCHIVE_BYTES:,} bytes", "remove it"
            )
        if not unpacker.eof:  # tarfile would take a stream cut short for the archive's end
            raise EOFError("the xz stream is cut short")
        with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
            for member in tar:
                problem = member_problem(member)
                if problem is None and member.name in files:
                    problem = f"two members are named {member.name}"
                if problem is not None:
                    refused.setdefault(shown(member.name.split("/", 1)[0]), problem)
                    continue
                handle = tar.extractfile(member)
                files[member.name] = handle.read() if handle is not None else b""
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as err:
        raise UntrustedFileError(
            archive, f"is no xz-compressed tar file ({err})", "restore it from version control"
        ) from None
    return {
        name: body for name, body in files.items() if shown(name.split("/")[0]) not in refused
    }, refused


def packed(files: Files) -> bytes:
    """``files`` as a reproducible xz-compressed tar (see the module docstring)."""
    buffer = io.BytesIO()
    with tarfile.open(
        fileobj=buffer, mode="w:xz", preset=XZ_PRESET, format=tarfile.PAX_FORMAT
    ) as tar:
        for name in sorted(files, key=lambda name: (PurePosixPath(name).name, name)):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[name]))
    return buffer.getvalue()


def write(archive: Path, files: Files) -> None:
    """Write ``files`` as ``archive``, atomically (a temporary file renamed into place); the
    temporary files of saves killed before (``.NAME.*.tmp``) are removed first."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    for stale in archive.parent.glob(f".{archive.name}.*.tmp"):
        stale.unlink(missing_ok=True)
    with replacing(archive, "wb") as out:
        out.write(packed(files))


def run_files(run: Path, roots: tuple[Path, ...]) -> Files:
    """The members that archive ``run``: its files of :data:`ARCHIVED` (:data:`TRAINED` for a
    run not evaluated) made portable (``roots``: the checkouts whose paths are made relative),
    its shared files by digest and their map (as ``RUN/references.json``)."""
    evaluated = is_finished(run)
    files = {
        f"{run.name}/{relative.as_posix()}": portable(
            read_bytes(run / relative, MAX_FILE_BYTES), roots
        )
        for relative in archived_files(run, ARCHIVED if evaluated else TRAINED)
    }
    mapping = {}
    for relative in archived_files(run, SHARED) if evaluated else []:
        data = read_bytes(run / relative, MAX_FILE_BYTES)
        digest = hashlib.sha256(data).hexdigest()[:16]
        files[f"{REFERENCES}/{digest}.txt"] = data
        mapping[relative.as_posix()] = digest
    if mapping:
        files[f"{run.name}/{REFERENCE_MAP}"] = json.dumps(
            mapping, indent=1, sort_keys=True
        ).encode()
    return files


def merged(files: Files, run: Files, name: str) -> Files:
    """``files`` with the members of the run ``name`` replaced by ``run``'s (a file the run
    lacks stays; its reference map keeps the entries of files it lacks)."""
    key = f"{name}/{REFERENCE_MAP}"
    if key in run and key in files:
        mapping = json.loads(files[key]) | json.loads(run[key])
        run = run | {key: json.dumps(mapping, indent=1, sort_keys=True).encode()}
    return files | run


def is_finished(run: Path, trained: bool = False) -> bool:
    """Whether ``run`` holds its evaluation and training summary (a finished run), or with
    ``trained`` its training summary alone (trained to its last step)."""
    needed = ("config.yaml", "train_summary.json") + (() if trained else ("metrics.json",))
    return all((run / name).is_file() for name in needed)


def run_dirs(sweep: Path) -> list[Path]:
    """The run directories directly under ``sweep`` (those with a ``config.yaml``), sorted."""
    if not sweep.is_dir():
        sys.exit(f"archive_runs: {sweep} is not a directory; name a sweep directory")
    return sorted(
        p
        for p in sweep.iterdir()
        if p.is_dir() and not p.is_symlink() and (p / "config.yaml").is_file()
    )


def checkout_of(sweep: Path) -> Path:
    """The checkout a sweep ``.../outputs/sweeps/NAME`` was made in (its runs' relative paths
    are relative to it); the sweep's parent for any other layout."""
    sweep = sweep.resolve()
    for parent in sweep.parents:
        if parent.name == "outputs":
            return parent.parent
    return sweep.parent


def checked_load(archive: Path) -> tuple[Files, dict[str, str]]:
    """:func:`load`, or the end of the program with its one-line error."""
    try:
        return load(archive)
    except UntrustedFileError as err:
        sys.exit(f"archive_runs: {err}")


def save(sweep: Path, archive: Path, trained: bool = False) -> None:
    """Archive every finished run of ``sweep`` (with ``trained``: every trained one, evaluated
    or not) in ``archive`` (rewritten only if it changed)."""
    files, refused = checked_load(archive)
    if refused:
        run, problem = next(iter(refused.items()))
        sys.exit(f"archive_runs: {archive}: run {run}: {problem}; restore it from version control")
    before, archived = dict(files), []
    for run in run_dirs(sweep):
        if not is_finished(run, trained):
            continue
        try:
            updated = merged(files, run_files(run, (checkout_of(sweep),)), run.name)
        except UntrustedFileError as err:
            print(f"not archived {run.name}: {err}")
            continue
        if updated != files:
            files = updated
            archived.append(run.name)
    if files != before:
        try:
            write(archive, files)
        except OSError as err:
            sys.exit(f"archive_runs: cannot write {archive}: {err.strerror}; nothing was archived")
    for name in archived:  # said once the archive holds them
        print(f"archived {name}")


def unpacked_run(files: Files, name: str) -> Files:
    """The files of the archived run ``name``, relative to it, as the run had them (its shared
    files written back from the archive's references).

    Raises:
        UntrustedFileError: its reference map is unreadable or names a reference not there.
    """
    prefix = f"{name}/"
    run = {key[len(prefix) :]: body for key, body in files.items() if key.startswith(prefix)}
    mapping_bytes = run.pop(REFERENCE_MAP, b"{}")
    where = Path(name) / REFERENCE_MAP
    try:
        mapping = json.loads(mapping_bytes)
    except ValueError as err:
        raise UntrustedFileError(where, f"is no JSON ({err})", "remove the run") from None
    if not isinstance(mapping, dict):
        raise UntrustedFileError(where, "is no mapping", "remove the run")
    for relative, digest in mapping.items():
        shared = files.get(f"{REFERENCES}/{digest}.txt") if isinstance(digest, str) else None
        if shared is None or member_problem(tarfile.TarInfo(f"{name}/{relative}")) is not None:
            raise UntrustedFileError(where, f"names {relative!r} badly", "remove the run")
        run[relative] = shared
    return run


def restore(archive: Path, sweep: Path) -> None:
    """Write the runs of ``archive`` into ``sweep`` where it has no directory of that name."""
    files, refused = checked_load(archive)
    for run, problem in refused.items():
        print(f"not restored {run}: {problem}")
    runs: defaultdict[str, bool] = defaultdict(bool)
    for key in files:
        runs[key.split("/", 1)[0]] |= key.endswith("/config.yaml") and key.count("/") == 1
    try:
        sweep.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        sys.exit(f"archive_runs: cannot make {sweep}: {err.strerror}")
    for name in sorted(run for run, has_config in runs.items() if has_config):
        if (sweep / name).exists() or (sweep / name).is_symlink():
            continue
        work = None
        try:
            work = temporary_folder(sweep, f".{name}.")
            for relative, body in unpacked_run(files, name).items():
                target = inside(work, relative)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(body)
            work.rename(sweep / name)
        except ValueError as err:  # UntrustedFileError, or a name leading out
            said = f"not restored {name}: {err}"
        except OSError as err:  # a full or read-only disk: this run is not written, say so
            said = f"not restored {name}: cannot write into {sweep} ({err.strerror})"
        else:
            said = f"restored {name}"
        finally:
            if work is not None:
                shutil.rmtree(work, ignore_errors=True)
        print(said)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("save", "restore"))
    parser.add_argument("source", type=Path, help="the sweep (save) or the archive (restore)")
    parser.add_argument("target", type=Path, help="the archive (save) or the sweep (restore)")
    parser.add_argument(
        "--trained",
        action="store_true",
        help="save: also the runs trained to their last step but not evaluated",
    )
    args = parser.parse_args(argv)
    archive = args.target if args.action == "save" else args.source
    if not archive.name.endswith(SUFFIX):
        parser.error(f"{archive} is no archive: name one file per sweep, SWEEP{SUFFIX}")
    if args.trained and args.action != "save":
        parser.error("--trained goes with save")
    if args.action == "save":
        save(args.source, args.target, args.trained)
    else:
        restore(args.source, args.target)


if __name__ == "__main__":
    main()

"""Files a reader may open at any moment: written through a temporary file beside the target and
renamed over it (``os.replace``), so a reader sees the old file or the new one, never half of
either; a killed write leaves only a ``.NAME.*.tmp`` file, which nobody reads.

Files in a run directory that others may write: a replacing write replaces a symbolic link
instead of writing through it, an appending one (:func:`open_append`, the run's log) refuses a
link, and :func:`links_leaving` finds the links that would lead a writer out of a directory. A
file written here gets the permissions of the process's umask, as ``open`` gives them."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def replacing(path: Path, mode: str = "w") -> Iterator[IO]:
    """An open temporary file beside ``path``; on leaving the block without an error it is
    flushed to disk and renamed over ``path``, on an error it is removed.

    ``mode`` is ``"w"`` (UTF-8 text) or ``"wb"``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would hide the file from the group
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with replacing(path) as handle:
        handle.write(text)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` atomically."""
    write_text(path, json.dumps(data, indent=2))


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def temporary_folder(parent: Path, prefix: str, suffix: str = "") -> Path:
    """A new hidden folder in ``parent`` (``tempfile.mkdtemp``) with the permissions the umask
    gives a folder, not mkdtemp's 0700: a folder renamed into place keeps them."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=parent))
    folder.chmod(0o777 & ~_umask())
    return folder


def _umask() -> int:
    """The process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def inside(folder: Path, name: str) -> Path:
    """``folder / name`` for a relative ``name`` from a file or an archive (untrusted): refused
    unless, written as it is (``a//b`` is not folded to ``a/b``), it is relative, uses ``/``
    alone, has no empty, ``.`` or ``..`` part, and its resolved path (links followed) lies
    inside the resolved ``folder``.

    Raises:
        ValueError: one line naming ``name`` and why.
    """
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{name!r} is not a plain relative path inside {folder}")
    path = folder.joinpath(*parts)
    if not path.resolve().is_relative_to(folder.resolve()):
        raise ValueError(f"{name!r} leads out of {folder}")
    return path


class LinkRefused(OSError):
    """A file to append to is a symbolic link; the message names it and the fix."""


def open_append(path: Path) -> IO[str]:
    """``path`` opened to append UTF-8 text (created when missing, with the umask's permissions),
    never through a symbolic link.

    Raises:
        LinkRefused: ``path`` is a symbolic link (one line naming it and where it points).
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as err:
        if path.is_symlink():
            raise LinkRefused(
                f"{path} is a symbolic link (to {os.readlink(path)}); posenc writes nothing "
                "through links in a run directory: remove it"
            ) from None
        raise err
    return os.fdopen(fd, "a", encoding="utf-8", newline="")


class RunLogHandler(logging.FileHandler):
    """Hydra's ``train.log`` handler, appending through :func:`open_append`: a link planted in a
    run directory ends the command with one line instead of receiving the log."""

    def _open(self) -> IO[str]:
        try:
            return open_append(Path(self.baseFilename))
        except LinkRefused as err:
            raise SystemExit(str(err)) from None


def links_leaving(root: Path) -> list[Path]:
    """The symbolic links under ``root`` that lead out of it (or nowhere), sorted; ``root``
    itself may be a link (an ``outputs/`` on another disk)."""
    top = Path(os.path.realpath(root))
    found = []
    for directory, subdirs, files in os.walk(root):
        for name in subdirs + files:
            path = Path(directory) / name
            if path.is_symlink() and not Path(os.path.realpath(path)).is_relative_to(top):
                found.append(path)
    return sorted(found)


def refuse_links_leaving(root: Path) -> None:
    """Raise :class:`LinkRefused` (one line) when ``root`` holds symbolic links leading out of
    it (:func:`links_leaving`); nothing when ``root`` does not exist."""
    leaving = links_leaving(root) if root.is_dir() else []
    if leaving:
        raise LinkRefused(
            f"{leaving[0]} is a symbolic link leading out of the run directory "
            f"({len(leaving)} such link(s)); posenc writes nothing through them: remove them"
        )
